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

from assay.client._address import (
    CLUSTER_FILE,
    DEFAULT_MASTER,
    DEFAULT_STATE,
    LocalCluster,
    default_master,
    local_master,
    master_address,
    poll_seconds,
    running_cluster,
)
from assay.client._api import Client
from assay.client._channel import http_port_message
from assay.client._checkpoint import Checkpoint, UntrustedCodeError
from assay.client._credentials import (
    StoredSession,
    auth_file,
    dial_address,
    env_credentials,
    forget_session,
    load_session,
    master_key,
    save_session,
)
from assay.client._download import NotFollowedError, copy_tree
from assay.client._errors import (
    AuthenticationError,
    ForbiddenError,
    InvalidRequestError,
    MasterError,
    NotFoundError,
)
from assay.client._experiment import Experiment, Trial
from assay.client._fetch import download_checkpoint, storage_config
from assay.client._load import LoadedCheckpoint, load_checkpoint
from assay.client._model import Model, ModelVersion
from assay.client._records import (
    EXPERIMENT_STATE_GROUPS,
    TERMINAL_EXPERIMENT_STATES,
    TERMINAL_TRIAL_STATES,
    best_trial,
    checkpoint_state,
    experiment_seed,
    experiment_state,
    experiment_states_in,
    metric,
    metric_name,
    percent,
    progress_line,
    searcher_objective,
    slot_type,
    struct,
    trial_state,
)
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

# The scripting API.
__all__ = [
    "AuthenticationError",
    "Checkpoint",
    "Experiment",
    "ForbiddenError",
    "InvalidRequestError",
    "LoadedCheckpoint",
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
    "load_checkpoint",
    "login",
    "logout",
]
# The kernel the `assay` CLI stands on: the channel, the stored sessions, which master to
# call, checkpoint downloads and the master's records as Python values.
__all__ += [
    "CLUSTER_FILE",
    "DEFAULT_MASTER",
    "DEFAULT_STATE",
    "EXPERIMENT_STATE_GROUPS",
    "TERMINAL_EXPERIMENT_STATES",
    "TERMINAL_TRIAL_STATES",
    "Client",
    "LocalCluster",
    "NotFollowedError",
    "StoredSession",
    "auth_file",
    "best_trial",
    "checkpoint_state",
    "copy_tree",
    "default_master",
    "dial_address",
    "download_checkpoint",
    "env_credentials",
    "experiment_seed",
    "experiment_state",
    "experiment_states_in",
    "forget_session",
    "http_port_message",
    "load_session",
    "local_master",
    "master_address",
    "master_key",
    "metric",
    "metric_name",
    "percent",
    "poll_seconds",
    "progress_line",
    "running_cluster",
    "save_session",
    "searcher_objective",
    "slot_type",
    "storage_config",
    "struct",
    "trial_state",
]
