"""Script the platform from Python: `assay.client`, Determined's `determined.experimental.client`.

    from assay import client

    client.login("127.0.0.1:8090", "alice", "s3cret")
    exp = client.create_experiment("const.yaml", "./model_dir")
    exp.wait()                                   # "COMPLETED"; progress on stderr
    best = exp.top_checkpoint()                  # by the searcher's metric
    trial = best.load()                          # the Trial, its models' weights loaded
    trial.model(x)
    model = client.create_model("digits")
    model.register_version(best, notes="first")  # pins the checkpoint against GC
    client.get_model("digits").get_version().load()   # the latest version's Trial
    # another user's code runs only when trusted: .load(trust=True), or your own class

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
from assay.client._checkpoint import Checkpoint, UntrustedCodeError
from assay.client._experiment import Experiment, Trial
from assay.client._model import Model, ModelVersion
from assay.client._session import (
    Session,
    create_experiment,
    create_model,
    get_checkpoint,
    get_experiment,
    get_model,
    get_trial,
    list_experiments,
    list_models,
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
    "Model",
    "ModelVersion",
    "NotFoundError",
    "Session",
    "Trial",
    "UntrustedCodeError",
    "create_experiment",
    "create_model",
    "get_checkpoint",
    "get_experiment",
    "get_model",
    "get_trial",
    "list_experiments",
    "list_models",
    "login",
    "logout",
]
