"""Script the platform from Python: `assay.client`, Determined's `determined.experimental.client`.

    from assay import client

    client.login("127.0.0.1:8090", "alice", "s3cret")
    exp = client.create_experiment("const.yaml", "./model_dir")
    exp.wait()                                   # "COMPLETED"; progress on stderr
    best = exp.top_checkpoint()                  # by the searcher's metric
    trial = best.load()                          # the Trial, its models' weights loaded
    trial.model(x)

Every call goes through the same gRPC client as the `assay` CLI, so the two cannot
disagree. Errors are `AssayError`s: `NotFoundError`, `AuthenticationError`,
`ForbiddenError`, `InvalidRequestError` (all `MasterError`s, whose `code` is the gRPC
status) carry the master's one-line message.
"""

from __future__ import annotations

from assay.cli._client import (
    AuthenticationError,
    ForbiddenError,
    InvalidRequestError,
    MasterError,
    NotFoundError,
)
from assay.client._checkpoint import Checkpoint
from assay.client._experiment import Experiment, Trial
from assay.client._session import (
    Session,
    create_experiment,
    get_checkpoint,
    get_experiment,
    get_trial,
    list_experiments,
    login,
    logout,
)

__all__ = [
    "AuthenticationError",
    "Checkpoint",
    "Experiment",
    "ForbiddenError",
    "InvalidRequestError",
    "MasterError",
    "NotFoundError",
    "Session",
    "Trial",
    "create_experiment",
    "get_checkpoint",
    "get_experiment",
    "get_trial",
    "list_experiments",
    "login",
    "logout",
]
