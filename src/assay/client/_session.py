"""Who talks to which master: `login()` and the module-level calls that use its session."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from assay.errors import AssayError

from . import _credentials
from ._address import master_address
from ._api import Client
from ._checkpoint import Checkpoint
from ._errors import AuthenticationError
from ._experiment import Experiment, Trial
from ._model import Model

log = logging.getLogger("assay")

if TYPE_CHECKING:
    from assay.proto import api_pb2

ConfigSource = str | os.PathLike[str] | Mapping[str, Any]

EXPERIMENT_STATES = (
    "ACTIVE",
    "PAUSED",
    "STOPPING_CANCELED",
    "STOPPING_KILLED",
    "COMPLETED",
    "CANCELED",
    "ERROR",
)


class Session:
    """A logged-in connection to one master; `login()` makes one and makes it the default
    of the module-level calls (`assay.client.get_experiment(...)` and the rest)."""

    def __init__(self, api: Client) -> None:
        self.api = api

    @property
    def master(self) -> str:
        """The master's gRPC address, HOST:PORT."""
        return self.api.address

    @property
    def username(self) -> str:
        """Who this session acts as (asked of the master)."""
        return self.api.who_am_i().username

    def create_experiment(
        self, config: ConfigSource, model_dir: str | os.PathLike[str], *, activate: bool = True
    ) -> Experiment:
        """Upload `model_dir` (packed as `assay experiment create` packs it, honouring
        `.assayignore`) with `config` (a YAML file's path, or the config as a dict) and
        start it (`activate=False`: created paused). The master validates the config and
        refuses a bad one with `InvalidRequestError`, naming each key to fix."""
        from assay.common.archive import pack_model_dir, packed_checkpoint_warning

        text = _config_text(config)
        model_dir = Path(model_dir)
        if not model_dir.is_dir():
            raise AssayError(f"model directory {model_dir} does not exist")
        archive = pack_model_dir(model_dir)
        packed_checkpoints = packed_checkpoint_warning(archive)
        if packed_checkpoints is not None:
            log.warning("%s", packed_checkpoints)
        response = self.api.create_experiment(text, archive, activate)
        return Experiment(self.api, response.experiment)

    def get_experiment(self, experiment_id: int) -> Experiment:
        """Experiment `experiment_id`; `NotFoundError` if there is none."""
        return Experiment(self.api, self.api.get_experiment(experiment_id).experiment)

    def get_trial(self, trial_id: int) -> Trial:
        """Trial `trial_id`; `NotFoundError` if there is none."""
        return Trial(self.api, self.api.get_trial(trial_id))

    def get_checkpoint(self, uuid: str) -> Checkpoint:
        """Checkpoint `uuid`; `NotFoundError` if there is none."""
        return Checkpoint(self.api, self.api.get_checkpoint(uuid))

    def list_experiments(
        self,
        *,
        name: str | None = None,
        label: str | None = None,
        owner: str | None = None,
        states: Iterable[str] = (),
        archived: bool | None = False,
        sort_by: str = "id",
        ascending: bool = True,
        limit: int = 50,
        offset: int = 0,
    ) -> list[Experiment]:
        """Experiments that match every filter given: `name` (a case-insensitive
        substring), `label`, `owner`, `states` ("ACTIVE", "COMPLETED", ...), `archived`
        (None: both). Sorted by `sort_by` (id, name, state, owner, priority, progress,
        start_time, end_time); `limit` 1..1000 per call, from `offset`."""
        from assay.proto import api_pb2, common_pb2

        wanted = [s.upper() for s in states]
        unknown = [s for s in wanted if s not in EXPERIMENT_STATES]
        if unknown:
            raise AssayError(
                f"unknown experiment state {unknown[0]!r}; give one of "
                + ", ".join(EXPERIMENT_STATES)
            )
        request: api_pb2.ListExperimentsRequest = api_pb2.ListExperimentsRequest(
            states=[common_pb2.ExperimentState.Value(f"EXPERIMENT_STATE_{s}") for s in wanted],
            name=name or "",
            label=label or "",
            owner=owner or "",
            sort_by=sort_by,
            ascending=ascending,
            limit=limit,
            offset=offset,
        )
        if archived is not None:
            request.archived = archived
        response = self.api.list_experiments(request)
        return [Experiment(self.api, e) for e in response.experiments]

    def create_model(
        self,
        name: str,
        description: str = "",
        *,
        labels: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        workspace: str = "",
    ) -> Model:
        """Register a new model `name` (no versions yet) in `workspace` (default:
        Default), whose editors may change it too; `InvalidRequestError` if the name is
        taken or not 1-128 letters, digits, '.', '_' or '-'."""
        found = self.api.create_model(
            name, description=description, labels=labels, metadata=metadata, workspace=workspace
        )
        return Model(self.api, found)

    def get_model(self, name: str) -> Model:
        """Registered model `name`; `NotFoundError` if there is none."""
        return Model(self.api, self.api.get_model(name))

    def list_models(
        self, *, name: str = "", label: str = "", archived: bool | None = None
    ) -> list[Model]:
        """Registered models whose name contains `name` (any case), with `label`, and
        archived or not (None: both)."""
        found = self.api.list_models(name=name, label=label, archived=archived)
        return [Model(self.api, m) for m in found]

    def logout(self) -> None:
        """End this session at the master (and forget a stored one) and close the channel."""
        self.api.logout()
        self.api.close()


_default: Session | None = None


def login(
    master: str | None = None,
    user: str | None = None,
    password: str | None = None,
    token: str | None = None,
) -> Session:
    """Connect to `master` (HOST:PORT; default ASSAY_MASTER, else the running `assay deploy
    local up` cluster's, else 127.0.0.1:8090) and make it the session of the module-level
    calls.

    `user` and `password`: log in (the session is stored, as `assay user login` does).
    `token`: use that session token (nothing is stored). `user` alone: that user's stored
    session, else ASSAY_PASSWORD. Nothing: the stored session, else ASSAY_USER and
    ASSAY_PASSWORD. Bad or missing credentials raise `AuthenticationError` here, not at
    the first call.
    """
    global _default
    address = master_address(master)
    api = Client(address)
    try:
        if token is not None:
            api.use_token(token)
        elif user is not None and password is not None:
            api.login(user, password)
        elif user is not None:
            _login_stored(api, user)
        who = api.who_am_i()
        if user is not None and who.username != user:
            raise AuthenticationError(f"the token given is {who.username}'s, not {user}'s")
    except BaseException:
        api.close()
        raise
    if _default is not None:
        _default.api.close()
    _default = Session(api)
    return _default


def _login_stored(api: Client, user: str) -> None:
    stored = _credentials.load_session(api.address)
    if stored is not None and stored.username == user and stored.valid():
        api.use_token(stored.token)
        return
    password = os.environ.get("ASSAY_PASSWORD")
    if not password:
        raise AuthenticationError(
            f"no stored session of {user} at {api.address}: pass password= or token=, "
            f"or run `assay user login {user}`"
        )
    api.login(user, password)


def logout() -> None:
    """End the default session (see `Session.logout`)."""
    global _default
    if _default is not None:
        _default.logout()
        _default = None


def _session() -> Session:
    """The default session: the last `login()`, else one made as `login()` without
    arguments makes it."""
    return _default if _default is not None else login()


def _config_text(config: ConfigSource) -> str:
    if isinstance(config, Mapping):
        return yaml.safe_dump(dict(config), sort_keys=False)
    path = Path(config)
    if not path.is_file():
        raise AssayError(f"config file {path} does not exist (or pass the config as a dict)")
    return path.read_text()


def create_experiment(
    config: ConfigSource, model_dir: str | os.PathLike[str], *, activate: bool = True
) -> Experiment:
    """See `Session.create_experiment`."""
    return _session().create_experiment(config, model_dir, activate=activate)


def get_experiment(experiment_id: int) -> Experiment:
    """See `Session.get_experiment`."""
    return _session().get_experiment(experiment_id)


def get_trial(trial_id: int) -> Trial:
    """See `Session.get_trial`."""
    return _session().get_trial(trial_id)


def get_checkpoint(uuid: str) -> Checkpoint:
    """See `Session.get_checkpoint`."""
    return _session().get_checkpoint(uuid)


def list_experiments(**filters: Any) -> list[Experiment]:
    """See `Session.list_experiments` for the filters."""
    return _session().list_experiments(**filters)


def create_model(
    name: str,
    description: str = "",
    *,
    labels: list[str] | None = None,
    metadata: dict[str, Any] | None = None,
    workspace: str = "",
) -> Model:
    """See `Session.create_model`."""
    return _session().create_model(
        name, description, labels=labels, metadata=metadata, workspace=workspace
    )


def get_model(name: str) -> Model:
    """See `Session.get_model`."""
    return _session().get_model(name)


def list_models(*, name: str = "", label: str = "", archived: bool | None = None) -> list[Model]:
    """See `Session.list_models`."""
    return _session().list_models(name=name, label=label, archived=archived)
