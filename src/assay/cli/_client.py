"""The channel to the master, one typed method per RPC, and gRPC errors as one-line messages.

grpc and the generated stubs are imported when the first call is made, never at import
time, so `assay --help` and `assay trial run-local` do not pay for them.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

from assay.common.tls import ClientTls
from assay.errors import AssayError

from . import _credentials
from ._common import settings

if TYPE_CHECKING:
    from assay.proto import api_pb2, common_pb2

UNARY_TIMEOUT_S = 30.0
CREATE_TIMEOUT_S = 300.0
# The workspace and project RPCs, called through `Client.workspace_call`.
WORKSPACE_RPCS = frozenset(
    {
        "CreateWorkspace",
        "ListWorkspaces",
        "GetWorkspace",
        "ArchiveWorkspace",
        "DeleteWorkspace",
        "ListWorkspaceMembers",
        "SetWorkspaceMember",
        "RemoveWorkspaceMember",
        "CreateProject",
        "ListProjects",
        "GetProject",
        "ArchiveProject",
        "DeleteProject",
        "MoveExperiment",
    }
)
MAX_MESSAGE_BYTES = 128 * 2**20  # above the 96 MiB model-definition limit
# A submission up to this size is one message (the master takes at most 4 MiB); a
# larger model definition is sent in pieces of UPLOAD_CHUNK_BYTES.
INLINE_UPLOAD_BYTES = 3 * 2**20
UPLOAD_CHUNK_BYTES = 2**20

# The server's own words are the message for these (config problems, unknown ids, ...).
_USER_CODES = frozenset(
    {
        "NOT_FOUND",
        "INVALID_ARGUMENT",
        "FAILED_PRECONDITION",
        "PERMISSION_DENIED",
        "UNAUTHENTICATED",
        "ALREADY_EXISTS",
        "RESOURCE_EXHAUSTED",
        "OUT_OF_RANGE",
        "ABORTED",
    }
)


class MasterError(AssayError):
    """The master refused a request or could not be reached; `code` names the gRPC status
    ("UNAUTHENTICATED", "UNAVAILABLE", ...)."""

    code: str | None = None


class NotFoundError(MasterError):
    """The experiment, trial, checkpoint or other record named does not exist."""


class AuthenticationError(MasterError):
    """No valid session: a wrong password, or a token that expired or was revoked."""


class ForbiddenError(MasterError):
    """The user may not do this (another user's experiment, an administrator's action)."""


class InvalidRequestError(MasterError):
    """The request itself is wrong: an invalid config, a bad value, an action that does
    not fit the record's state; the message says what to change."""


# The typed error each gRPC status becomes (any other: MasterError).
_ERRORS: dict[str, type[MasterError]] = {
    "NOT_FOUND": NotFoundError,
    "UNAUTHENTICATED": AuthenticationError,
    "PERMISSION_DENIED": ForbiddenError,
    "INVALID_ARGUMENT": InvalidRequestError,
    "FAILED_PRECONDITION": InvalidRequestError,
    "ALREADY_EXISTS": InvalidRequestError,
    "OUT_OF_RANGE": InvalidRequestError,
}


class Client:
    """A lazily opened channel to `address` (HOST:PORT; HOST alone: port 8090)."""

    def __init__(
        self, address: str, timeout: float = UNARY_TIMEOUT_S, tls: ClientTls | None = None
    ) -> None:
        """`tls` None: as ASSAY_TLS, ASSAY_CA_FILE and ASSAY_TLS_SERVER_NAME say, read
        when the first call is made."""
        self.address = _credentials.dial_address(address)
        self.tls = tls
        self.timeout = timeout
        self._channel: Any = None
        self._stub: Any = None
        self._session_token: str | None = None
        self._token_given = False  # use_token: never replaced by an ASSAY_USER login

    @property
    def stub(self) -> Any:
        if self._stub is None:
            from assay.proto import api_pb2_grpc

            tls = ClientTls.from_env() if self.tls is None else self.tls
            self._channel = tls.channel(
                self.address,
                [
                    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ],
            )
            self._stub = api_pb2_grpc.ApiStub(self._channel)
        return self._stub

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = self._stub = None

    @contextmanager
    def _errors(self, timeout: float | None) -> Iterator[None]:
        import grpc

        try:
            yield
        except grpc.RpcError as e:
            translated = self._translate(e, timeout)
            translated.code = getattr(e.code(), "name", None)
            raise translated from None

    def _translate(self, error: Any, timeout: float | None) -> MasterError:
        code = error.code()
        name = getattr(code, "name", str(code))
        details = (error.details() or "").strip()
        if name == "UNAVAILABLE" and "http1" in details.lower().replace(".", ""):
            return MasterError(http_port_message(self.address))
        if name == "UNAVAILABLE":
            return MasterError(
                f"cannot reach the master at {self.address} "
                "(is assay-master running? set --master or ASSAY_MASTER)"
            )
        if name == "DEADLINE_EXCEEDED":
            waited = f" within {timeout:g} s" if timeout else ""
            return MasterError(f"the master at {self.address} did not answer{waited}")
        if name in _USER_CODES and details:
            return _ERRORS.get(name, MasterError)(details)
        return MasterError(
            f"the master at {self.address} failed the request ({name})"
            + (f": {details}" if details else "")
        )

    # --- credentials ------------------------------------------------------------------

    def _token(self) -> str:
        """The session token to send: the stored one, else one got by logging in with
        ASSAY_USER / ASSAY_PASSWORD, else none (the master then says to log in)."""
        if self._session_token is None:
            stored = _credentials.load(self.address)
            wanted = _credentials.env_credentials()
            # ASSAY_USER names who a script acts as: another user's stored token is not it.
            theirs = wanted is not None and stored is not None and stored.username != wanted[0]
            if stored is not None and stored.valid() and not theirs:
                self._session_token = stored.token
            elif _credentials.env_credentials() is not None:
                self._session_token = self._login_from_env()
            else:
                self._session_token = ""
        return self._session_token

    def use_token(self, token: str) -> None:
        """Send `token` (a session token from `assay user login` or the web UI) with
        every call, instead of a stored or ASSAY_USER session; nothing is saved."""
        self._session_token = token
        self._token_given = True

    def _login_from_env(self) -> str:
        found = _credentials.env_credentials()
        assert found is not None
        session = self.login(*found)
        return session.token

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        token = self._token()
        return (("authorization", f"Bearer {token}"),) if token else ()

    def _call(self, method: str, request: Any, timeout: float | None) -> Any:
        """One call with the session token; a token the master no longer takes is
        replaced once by a fresh login when ASSAY_USER / ASSAY_PASSWORD allow it. A list
        `request` is a client stream, sent again in full after such a login."""
        import grpc

        stub = getattr(self.stub, method)

        def send() -> Any:
            given = iter(request) if isinstance(request, list) else request
            return stub(given, timeout=timeout, metadata=self._metadata())

        try:
            return send()
        except grpc.RpcError as e:
            renew = e.code() == grpc.StatusCode.UNAUTHENTICATED and method != "Login"
            if not renew or self._token_given or _credentials.env_credentials() is None:
                raise
        self._session_token = self._login_from_env()
        return send()

    def _unary(self, method: str, request: Any, timeout: float | None = None) -> Any:
        timeout = timeout or self.timeout
        with self._errors(timeout):
            return self._call(method, request, timeout)

    def login(self, username: str, password: str) -> _credentials.Session:
        """Log in, keep the token for this master in the auth file, and return it."""
        from assay.proto import api_pb2

        request = api_pb2.LoginRequest(username=username, password=password)
        with self._errors(self.timeout):
            response: api_pb2.LoginResponse = self.stub.Login(request, timeout=self.timeout)
        session = _credentials.Session(
            response.user.username,
            response.token,
            response.expires_at.ToDatetime(tzinfo=dt.UTC),
        )
        _credentials.save(self.address, session)
        self._session_token = session.token
        return session

    def logout(self) -> bool:
        """End the stored session at the master and forget it here; False if none."""
        from assay.proto import api_pb2

        stored = _credentials.load(self.address)
        if stored is None:
            return False
        self._session_token = stored.token
        with contextlib.suppress(MasterError):  # expired or revoked already: forget it
            self._unary("Logout", api_pb2.LogoutRequest())
        _credentials.forget(self.address)
        self._session_token = None
        return True

    def who_am_i(self) -> api_pb2.User:
        from assay.proto import api_pb2

        user: api_pb2.User = self._unary("WhoAmI", api_pb2.WhoAmIRequest())
        return user

    def list_users(self) -> list[api_pb2.User]:
        from assay.proto import api_pb2

        response: api_pb2.ListUsersResponse = self._unary("ListUsers", api_pb2.ListUsersRequest())
        return list(response.users)

    def create_user(self, username: str, password: str, admin: bool) -> api_pb2.User:
        from assay.proto import api_pb2

        request = api_pb2.CreateUserRequest(username=username, password=password, admin=admin)
        user: api_pb2.User = self._unary("CreateUser", request)
        return user

    def change_password(self, username: str, old: str, new: str) -> api_pb2.User:
        from assay.proto import api_pb2

        request = api_pb2.ChangePasswordRequest(
            username=username, old_password=old, new_password=new
        )
        user: api_pb2.User = self._unary("ChangePassword", request)
        return user

    def set_user_active(self, username: str, active: bool) -> api_pb2.User:
        from assay.proto import api_pb2

        request = api_pb2.SetUserActiveRequest(username=username, active=active)
        user: api_pb2.User = self._unary("SetUserActive", request)
        return user

    # --- one method per RPC ---------------------------------------------------------

    def get_master_info(self) -> api_pb2.MasterInfo:
        from assay.proto import api_pb2

        info: api_pb2.MasterInfo = self._unary("GetMasterInfo", api_pb2.GetMasterInfoRequest())
        return info

    def create_experiment(
        self, config_yaml: str, model_definition: bytes, activate: bool
    ) -> api_pb2.CreateExperimentResponse:
        from assay.proto import api_pb2

        response: api_pb2.CreateExperimentResponse
        # Uploads can be up to 96 MiB: allow for a slow link, not just a slow master.
        if len(model_definition) + len(config_yaml.encode()) <= INLINE_UPLOAD_BYTES:
            request = api_pb2.CreateExperimentRequest(
                config_yaml=config_yaml, model_definition=model_definition, activate=activate
            )
            response = self._unary("CreateExperiment", request, timeout=CREATE_TIMEOUT_S)
            return response
        # The master takes at most 4 MiB a message: a larger archive goes in pieces.
        chunks = [
            api_pb2.CreateExperimentChunk(
                model_definition_part=model_definition[at : at + UPLOAD_CHUNK_BYTES]
            )
            for at in range(0, len(model_definition), UPLOAD_CHUNK_BYTES)
        ] or [api_pb2.CreateExperimentChunk()]
        chunks[0].config_yaml, chunks[0].activate = config_yaml, activate
        response = self._unary("CreateExperimentStream", chunks, timeout=CREATE_TIMEOUT_S)
        return response

    def get_experiment(self, experiment_id: int) -> api_pb2.GetExperimentResponse:
        from assay.proto import api_pb2

        request = api_pb2.GetExperimentRequest(id=experiment_id)
        response: api_pb2.GetExperimentResponse = self._unary("GetExperiment", request)
        return response

    def patch_experiment(
        self,
        experiment_id: int,
        *,
        name: str | None = None,
        description: str | None = None,
        labels: list[str] | None = None,
        add_labels: list[str] | None = None,
        remove_labels: list[str] | None = None,
    ) -> common_pb2.Experiment:
        """Change what is given; `labels` replaces them, then the adds and removes apply."""
        from assay.proto import api_pb2

        request = api_pb2.PatchExperimentRequest(
            id=experiment_id, add_labels=add_labels or [], remove_labels=remove_labels or []
        )
        if name is not None:
            request.name = name
        if description is not None:
            request.description = description
        if labels is not None:
            request.labels.SetInParent()
            request.labels.labels.extend(labels)
        experiment: common_pb2.Experiment = self._unary("PatchExperiment", request)
        return experiment

    def create_template(self, name: str, config_yaml: str) -> api_pb2.Template:
        from assay.proto import api_pb2

        request = api_pb2.CreateTemplateRequest(name=name, config_yaml=config_yaml)
        template: api_pb2.Template = self._unary("CreateTemplate", request)
        return template

    def get_template(self, name: str) -> api_pb2.Template:
        from assay.proto import api_pb2

        template: api_pb2.Template = self._unary(
            "GetTemplate", api_pb2.GetTemplateRequest(name=name)
        )
        return template

    def list_templates(self) -> list[api_pb2.Template]:
        from assay.proto import api_pb2

        response: api_pb2.ListTemplatesResponse = self._unary(
            "ListTemplates", api_pb2.ListTemplatesRequest()
        )
        return list(response.templates)

    def delete_template(self, name: str) -> None:
        from assay.proto import api_pb2

        self._unary("DeleteTemplate", api_pb2.DeleteTemplateRequest(name=name))

    def get_model_definition(self, experiment_id: int) -> bytes:
        """The experiment's model definition as uploaded (a tar.gz archive)."""
        from assay.proto import api_pb2

        request = api_pb2.GetModelDefinitionRequest(experiment_id=experiment_id)
        # Up to 96 MiB: allow for a slow link, as an upload does.
        response: api_pb2.GetModelDefinitionResponse = self._unary(
            "GetModelDefinition", request, timeout=CREATE_TIMEOUT_S
        )
        return response.model_definition

    def list_experiments(
        self, request: api_pb2.ListExperimentsRequest
    ) -> api_pb2.ListExperimentsResponse:
        response: api_pb2.ListExperimentsResponse = self._unary("ListExperiments", request)
        return response

    def experiment_action(self, experiment_id: int, action: int) -> common_pb2.Experiment:
        from assay.proto import api_pb2

        request = api_pb2.ExperimentActionRequest(id=experiment_id, action=action)  # type: ignore[arg-type]
        experiment: common_pb2.Experiment = self._unary("ExperimentAction", request)
        return experiment

    def delete_experiment(self, experiment_id: int) -> api_pb2.DeleteExperimentResponse:
        from assay.proto import api_pb2

        request = api_pb2.DeleteExperimentRequest(id=experiment_id)
        # Deleting from object storage takes a request per checkpoint: allow for many.
        response: api_pb2.DeleteExperimentResponse = self._unary(
            "DeleteExperiment", request, timeout=CREATE_TIMEOUT_S
        )
        return response

    def kill_trial(self, trial_id: int) -> common_pb2.Trial:
        from assay.proto import api_pb2

        trial: common_pb2.Trial = self._unary("KillTrial", api_pb2.KillTrialRequest(id=trial_id))
        return trial

    def continue_experiment(self, experiment_id: int, config_yaml: str) -> common_pb2.Experiment:
        """Continue a finished single-trial experiment (`config_yaml`: the keys to change)."""
        from assay.proto import api_pb2

        request = api_pb2.ContinueExperimentRequest(id=experiment_id, config_yaml=config_yaml)
        experiment: common_pb2.Experiment = self._unary("ContinueExperiment", request)
        return experiment

    def set_experiment_resource(
        self, experiment_id: int, name: str, value: str
    ) -> common_pb2.Experiment:
        from assay.proto import api_pb2

        request = api_pb2.SetExperimentResourceRequest(id=experiment_id, name=name, value=value)
        experiment: common_pb2.Experiment = self._unary("SetExperimentResource", request)
        return experiment

    def get_queue(self) -> list[api_pb2.QueuedTrial]:
        from assay.proto import api_pb2

        response: api_pb2.GetQueueResponse = self._unary("GetQueue", api_pb2.GetQueueRequest())
        return list(response.trials)

    def get_trial(self, trial_id: int) -> common_pb2.Trial:
        from assay.proto import api_pb2

        trial: common_pb2.Trial = self._unary("GetTrial", api_pb2.GetTrialRequest(id=trial_id))
        return trial

    def get_trial_metrics(
        self, trial_id: int, group: str, max_points: int = 0
    ) -> api_pb2.GetTrialMetricsResponse:
        """`max_points` 0: every report."""
        from assay.proto import api_pb2

        request = api_pb2.GetTrialMetricsRequest(id=trial_id, group=group, max_points=max_points)
        response: api_pb2.GetTrialMetricsResponse = self._unary("GetTrialMetrics", request)
        return response

    def stream_trial_logs(
        self, trial_id: int, *, after_id: int = 0, follow: bool = False, tail: int = 0
    ) -> Iterator[common_pb2.LogLine]:
        """Log lines in order. Without `follow` the whole call has a deadline (5 min)."""
        from assay.proto import api_pb2

        request = api_pb2.StreamTrialLogsRequest(
            trial_id=trial_id, after_id=after_id, follow=follow, tail=tail
        )
        timeout = None if follow else 10 * self.timeout
        with self._errors(timeout):
            metadata = self._metadata()
            yield from self.stub.StreamTrialLogs(request, timeout=timeout, metadata=metadata)

    def list_checkpoints(
        self, experiment_id: int, trial_id: int = 0
    ) -> list[common_pb2.Checkpoint]:
        from assay.proto import api_pb2

        request = api_pb2.ListCheckpointsRequest(experiment_id=experiment_id, trial_id=trial_id)
        response: api_pb2.ListCheckpointsResponse = self._unary("ListCheckpoints", request)
        return list(response.checkpoints)

    def get_checkpoint(self, uuid: str) -> common_pb2.Checkpoint:
        from assay.proto import api_pb2

        request = api_pb2.GetCheckpointRequest(uuid=uuid)
        checkpoint: common_pb2.Checkpoint = self._unary("GetCheckpoint", request)
        return checkpoint

    def delete_checkpoints(self, uuids: list[str]) -> api_pb2.DeleteCheckpointsResponse:
        from assay.proto import api_pb2

        request = api_pb2.DeleteCheckpointsRequest(uuids=uuids)
        # Deleting from object storage takes a request per checkpoint: allow for many.
        response: api_pb2.DeleteCheckpointsResponse = self._unary(
            "DeleteCheckpoints", request, timeout=CREATE_TIMEOUT_S
        )
        return response

    def get_usage(self, *, by: str, since: str, until: str) -> api_pb2.GetUsageResponse:
        from assay.proto import api_pb2

        request = api_pb2.GetUsageRequest(by=by, since=since, until=until)
        response: api_pb2.GetUsageResponse = self._unary("GetUsage", request)
        return response

    def list_agents(self) -> list[common_pb2.Agent]:
        from assay.proto import api_pb2

        response: api_pb2.ListAgentsResponse = self._unary(
            "ListAgents", api_pb2.ListAgentsRequest()
        )
        return list(response.agents)

    def set_agent_enabled(
        self, agent_id: str, enabled: bool, drain: bool = False
    ) -> common_pb2.Agent:
        from assay.proto import api_pb2

        request = api_pb2.SetAgentEnabledRequest(id=agent_id, enabled=enabled, drain=drain)
        agent: common_pb2.Agent = self._unary("SetAgentEnabled", request)
        return agent

    def list_resource_pools(self) -> list[api_pb2.ResourcePool]:
        from assay.proto import api_pb2

        response: api_pb2.ListResourcePoolsResponse = self._unary(
            "ListResourcePools", api_pb2.ListResourcePoolsRequest()
        )
        return list(response.pools)

    def pool_workspaces(self, method: str, pool: str, workspace: str = "") -> list[Any]:
        """The bindings of `pool` (a `PoolBinding` each) after `method`:
        ListResourcePoolWorkspaces, BindResourcePool or UnbindResourcePool."""
        from assay.proto import api_pb2

        request: Any
        if method == "BindResourcePool":
            request = api_pb2.BindResourcePoolRequest(pool=pool, workspace=workspace)
        elif method == "UnbindResourcePool":
            request = api_pb2.UnbindResourcePoolRequest(pool=pool, workspace=workspace)
        else:
            request = api_pb2.ListResourcePoolWorkspacesRequest(pool=pool)
        response: api_pb2.ResourcePoolWorkspaces = self._unary(method, request)
        return list(response.bindings)

    def remove_agent(self, agent_id: str) -> bool:
        """Forget the agent's credential; True if it was connected (now disconnected)."""
        from assay.proto import api_pb2

        request = api_pb2.RemoveAgentRequest(id=agent_id)
        response: api_pb2.RemoveAgentResponse = self._unary("RemoveAgent", request)
        return response.disconnected

    # --- the model registry ------------------------------------------------------------

    def create_model(
        self,
        name: str,
        *,
        description: str = "",
        labels: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        workspace: str = "",
    ) -> api_pb2.Model:
        from assay.proto import api_pb2

        request = api_pb2.CreateModelRequest(
            name=name, description=description, labels=labels or [], workspace=workspace
        )
        request.metadata.update(metadata or {})
        model: api_pb2.Model = self._unary("CreateModel", request)
        return model

    def get_model(self, name: str) -> api_pb2.Model:
        from assay.proto import api_pb2

        model: api_pb2.Model = self._unary("GetModel", api_pb2.GetModelRequest(name=name))
        return model

    def list_models(
        self, *, name: str = "", label: str = "", archived: bool | None = None
    ) -> list[api_pb2.Model]:
        from assay.proto import api_pb2

        request = api_pb2.ListModelsRequest(name=name, label=label)
        if archived is not None:
            request.archived = archived
        response: api_pb2.ListModelsResponse = self._unary("ListModels", request)
        return list(response.models)

    def patch_model(
        self,
        name: str,
        *,
        description: str | None = None,
        labels: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> api_pb2.Model:
        """Change what is given; `metadata` keys are merged (a None value removes one)."""
        from assay.proto import api_pb2

        request = api_pb2.PatchModelRequest(name=name)
        if description is not None:
            request.description = description
        if labels is not None:
            request.labels.SetInParent()
            request.labels.labels.extend(labels)
        if metadata is not None:
            request.metadata.SetInParent()
            request.metadata.update(metadata)
        model: api_pb2.Model = self._unary("PatchModel", request)
        return model

    def archive_model(self, name: str, archived: bool = True) -> api_pb2.Model:
        from assay.proto import api_pb2

        model: api_pb2.Model
        if archived:
            model = self._unary("ArchiveModel", api_pb2.ArchiveModelRequest(name=name))
        else:
            model = self._unary("UnarchiveModel", api_pb2.UnarchiveModelRequest(name=name))
        return model

    def delete_model(self, name: str, *, force: bool = False) -> int:
        """Delete a model; with `force`, its versions too. The number of versions deleted."""
        from assay.proto import api_pb2

        request = api_pb2.DeleteModelRequest(name=name, force=force)
        response: api_pb2.DeleteModelResponse = self._unary("DeleteModel", request)
        return response.versions_deleted

    def register_model_version(
        self,
        name: str,
        checkpoint_uuid: str,
        *,
        notes: str = "",
        labels: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> api_pb2.ModelVersion:
        from assay.proto import api_pb2

        request = api_pb2.RegisterModelVersionRequest(
            name=name, checkpoint_uuid=checkpoint_uuid, notes=notes, labels=labels or []
        )
        request.metadata.update(metadata or {})
        version: api_pb2.ModelVersion = self._unary("RegisterModelVersion", request)
        return version

    def list_model_versions(self, name: str) -> list[api_pb2.ModelVersion]:
        from assay.proto import api_pb2

        request = api_pb2.ListModelVersionsRequest(name=name)
        response: api_pb2.ListModelVersionsResponse = self._unary("ListModelVersions", request)
        return list(response.versions)

    def get_model_version(self, name: str, version: int = 0) -> api_pb2.ModelVersion:
        """Version `version` of model `name`; 0: the latest."""
        from assay.proto import api_pb2

        request = api_pb2.GetModelVersionRequest(name=name, version=version)
        found: api_pb2.ModelVersion = self._unary("GetModelVersion", request)
        return found

    def patch_model_version(
        self,
        name: str,
        version: int,
        *,
        notes: str | None = None,
        labels: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> api_pb2.ModelVersion:
        from assay.proto import api_pb2

        request = api_pb2.PatchModelVersionRequest(name=name, version=version)
        if notes is not None:
            request.notes = notes
        if labels is not None:
            request.labels.SetInParent()
            request.labels.labels.extend(labels)
        if metadata is not None:
            request.metadata.SetInParent()
            request.metadata.update(metadata)
        found: api_pb2.ModelVersion = self._unary("PatchModelVersion", request)
        return found

    def delete_model_version(self, name: str, version: int) -> None:
        from assay.proto import api_pb2

        request = api_pb2.DeleteModelVersionRequest(name=name, version=version)
        self._unary("DeleteModelVersion", request)

    # --- workspaces and projects -------------------------------------------------------

    def workspace_call(self, method: str, **fields: Any) -> Any:
        """One of the workspace and project RPCs (CreateWorkspace, ListProjects,
        MoveExperiment, ...) with its request's fields; returns its response."""
        from assay.proto import api_pb2

        if method not in WORKSPACE_RPCS:
            raise ValueError(f"{method} is not a workspace or project RPC")
        request = getattr(api_pb2, f"{method}Request")(**fields)
        return self._unary(method, request)


def http_port_message(address: str) -> str:
    """What to say when `address` answered in HTTP/1: most likely the master's web UI
    port, whose health check names the gRPC port (a header)."""
    import urllib.request

    host = address.rsplit(":", 1)[0]
    grpc_port = ""
    url = f"http://{address}/api/v1/health"
    # No answer: say what is known without it.
    with contextlib.suppress(Exception), urllib.request.urlopen(url, timeout=3) as reply:
        grpc_port = reply.headers.get("Assay-Grpc-Port", "")
    if grpc_port.isdigit():
        return (
            f"{address} is the web UI's port (HTTP); the gRPC port is {grpc_port}: use "
            f"--master {host}:{grpc_port} (or set ASSAY_MASTER)"
        )
    return (
        f"{address} answers HTTP, not gRPC: is it the web UI's port? Give --master the "
        "master's gRPC port (8090 unless its --grpc-port says otherwise)"
    )


def client() -> Client:
    """The client for this invocation's `--master`, closed when the command ends."""
    ctx = click.get_current_context()
    c = Client(settings().master)
    ctx.call_on_close(c.close)
    return c
