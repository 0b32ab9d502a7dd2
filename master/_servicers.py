"""gRPC servicers: parse, call the master, reply. Errors map to status in `_status`."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import logging
from collections.abc import AsyncIterator, Callable
from concurrent import futures
from functools import partial
from typing import Any, TypeVar

import grpc

from assay import __version__
from assay.common.archive import MAX_MODEL_DEF_BYTES
from assay.master import _agent_wire as wire
from assay.master import _checkpoints, _convert, _registry, _usage
from assay.master._auth import Principal
from assay.master._core import Master
from assay.master._guard import Guard, bearer, caller, metadata_dict
from assay.master._multi_objective import fill_pareto, objectives_of
from assay.master._roles import ADMIN, EDITOR, Roles
from assay.master._secrets import masked_config_text
from assay.master._status import maps_errors, maps_errors_async, maps_errors_stream
from assay.master._trial_logs import FollowerLimit, stream_trial_logs
from assay.master.errors import (
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
)
from assay.master.store import ProjectRecord, UserRecord, WorkspaceRecord
from assay.master.store._templates import TemplateRecord
from assay.proto import (
    api_pb2,
    api_pb2_grpc,
    common_pb2,
)

log = logging.getLogger("assay.master")
_T = TypeVar("_T")
# Model archives up to this size are checked on the event loop (a few milliseconds).
INLINE_ARCHIVE_BYTES = 2**20
# Streamed uploads one user may have in flight (each holds up to MAX_MODEL_DEF_BYTES).
UPLOADS_PER_USER = 2
INLINE_CONFIG_CHARS = 2**16
_ACTIONS = {
    api_pb2.EXPERIMENT_ACTION_PAUSE: "pause",
    api_pb2.EXPERIMENT_ACTION_ACTIVATE: "activate",
    api_pb2.EXPERIMENT_ACTION_CANCEL: "cancel",
    api_pb2.EXPERIMENT_ACTION_KILL: "kill",
    api_pb2.EXPERIMENT_ACTION_ARCHIVE: "archive",
    api_pb2.EXPERIMENT_ACTION_UNARCHIVE: "unarchive",
}


class ApiServicer(api_pb2_grpc.ApiServicer):
    """The public API; plain methods run on `pool` (see _aio.SyncAdapter)."""

    def __init__(self, master: Master, pool: futures.Executor, guard: Guard) -> None:
        self.master = master
        self.store = master.store
        self.pool = pool
        self.guard = guard
        self.auth = guard.auth
        self.log_followers = FollowerLimit(master.config.log_followers_per_user)
        self._uploads: dict[str, int] = {}  # user -> CreateExperimentStream calls in flight
        self.roles = Roles(self.store)

    # --- who is calling -------------------------------------------------------------

    def _who(self, context: Any) -> Principal:
        """The caller: as the guard found it when it let the call in (looked up again
        only for a call that did not pass the guard)."""
        found = caller()
        if found is not None:
            return found
        return self.guard.principal(metadata_dict(context.invocation_metadata()))

    def _admin(self, context: Any, what: str) -> Principal:
        who = self._who(context)
        if not who.admin:
            raise PermissionDeniedError(f"only an administrator may {what}; {who.username} is not")
        return who

    def _may_read(self, context: Any, experiment_id: int) -> Principal:
        """The caller, if they may read the experiment (a viewer of its workspace)."""
        who = self._who(context)
        self.roles.experiment(who, experiment_id)
        return who

    def _may_change(self, who: Principal, experiment_id: int) -> None:
        """Editors of the experiment's workspace steer any of its experiments (see _roles)."""
        self.roles.experiment(who, experiment_id, EDITOR)

    # --- users ----------------------------------------------------------------------

    @maps_errors
    def Login(  # noqa: N802
        self, request: api_pb2.LoginRequest, context: grpc.ServicerContext
    ) -> api_pb2.LoginResponse:
        token, who, expires = self.auth.login(
            request.username, request.password, _address(context.peer())
        )
        response = api_pb2.LoginResponse(token=token, user=self._user(who.username))
        response.expires_at.FromDatetime(expires)
        return response

    @maps_errors
    def Logout(  # noqa: N802
        self, request: api_pb2.LogoutRequest, context: grpc.ServicerContext
    ) -> api_pb2.LogoutResponse:
        self.auth.logout(bearer(metadata_dict(context.invocation_metadata())))
        return api_pb2.LogoutResponse()

    @maps_errors
    def WhoAmI(  # noqa: N802
        self, request: api_pb2.WhoAmIRequest, context: grpc.ServicerContext
    ) -> api_pb2.User:
        return self._user(self._who(context).username)

    @maps_errors
    def ListUsers(  # noqa: N802
        self, request: api_pb2.ListUsersRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListUsersResponse:
        return api_pb2.ListUsersResponse(users=[_user_message(u) for u in self.store.list_users()])

    @maps_errors
    def CreateUser(  # noqa: N802
        self, request: api_pb2.CreateUserRequest, context: grpc.ServicerContext
    ) -> api_pb2.User:
        self._admin(context, "create users")
        created = self.auth.create_user(request.username, request.password, admin=request.admin)
        return _user_message(created)

    @maps_errors
    def ChangePassword(  # noqa: N802
        self, request: api_pb2.ChangePasswordRequest, context: grpc.ServicerContext
    ) -> api_pb2.User:
        who = self._who(context)
        target = request.username or who.username
        if target == who.username:
            token = bearer(metadata_dict(context.invocation_metadata()))
            self.auth.change_password(
                target,
                request.old_password,
                request.new_password,
                current_token=token,
                peer=_address(context.peer()),
            )
        else:
            self._admin(context, "change another user's password")
            self.auth.set_password(target, request.new_password)
        return self._user(target)

    @maps_errors
    def SetUserActive(  # noqa: N802
        self, request: api_pb2.SetUserActiveRequest, context: grpc.ServicerContext
    ) -> api_pb2.User:
        self._admin(context, "activate or deactivate users")
        if request.active:
            self.auth.activate(request.username)
        else:
            self.auth.deactivate(request.username)
        return self._user(request.username)

    @maps_errors
    def GetUsage(  # noqa: N802
        self, request: api_pb2.GetUsageRequest, context: grpc.ServicerContext
    ) -> api_pb2.GetUsageResponse:
        who = self._who(context)
        found = _usage.report(
            self.store,
            user_id=None if who.admin else who.user_id,  # a user sees their own usage only
            by=request.by,
            since=request.since,
            until=request.until,
            per_day=request.per_day,
            capacity=_usage.capacity(self.master) if who.admin else {},
        )
        return _usage_message(found)

    def _user(self, username: str) -> api_pb2.User:
        return _user_message(self.store.get_user(username))

    @maps_errors
    def GetMasterInfo(  # noqa: N802 - gRPC method names
        self, request: api_pb2.GetMasterInfoRequest, context: grpc.ServicerContext
    ) -> api_pb2.MasterInfo:
        view = self.master.cluster_view()
        return api_pb2.MasterInfo(
            version=__version__,
            cluster_id=view.cluster_id,
            store=self.store.engine.dialect.name,
            agents=len(view.connected),
            slots=view.slots,
            free_slots=view.free_slots,
            queued_trials=len(view.queue),
            resource_pools=[p.name for p in view.pools],
            default_resource_pool=self.master.config.default_resource_pool,
        )

    @maps_errors_async
    async def CreateExperiment(  # noqa: N802
        self,
        request: api_pb2.CreateExperimentRequest,
        context: grpc.aio.ServicerContext[
            api_pb2.CreateExperimentRequest, api_pb2.CreateExperimentResponse
        ],
    ) -> api_pb2.CreateExperimentResponse:
        """On the event loop: submissions are the hot path, and thread hops cost most."""
        model_definition = request.model_definition
        if request.model_definition_from:
            model_definition = await self._model_definition_from(request, context)
        return await self._create(request.config_yaml, model_definition, request.activate, context)

    async def _model_definition_from(
        self, request: api_pb2.CreateExperimentRequest, context: Any
    ) -> bytes:
        """A fork's model definition: that of the experiment it names, which the caller
        must be able to read (off the loop: it reads the store)."""
        source = request.model_definition_from
        if request.model_definition:
            raise InvalidArgumentError(
                "give the model definition or model_definition_from (an experiment whose "
                "model definition to use), not both"
            )
        loop = asyncio.get_running_loop()
        who = caller()
        if who is None:
            metadata = metadata_dict(context.invocation_metadata())
            who = await self.guard.principal_async(metadata, self.pool)
        await loop.run_in_executor(self.pool, self.roles.experiment, who, source)
        return await loop.run_in_executor(self.pool, self.store.get_model_definition, source)

    @maps_errors_async
    async def CreateExperimentStream(  # noqa: N802
        self,
        request_iterator: AsyncIterator[api_pb2.CreateExperimentChunk],
        context: grpc.aio.ServicerContext[
            api_pb2.CreateExperimentChunk, api_pb2.CreateExperimentResponse
        ],
    ) -> api_pb2.CreateExperimentResponse:
        """CreateExperiment with the archive in pieces (no message may exceed the master's
        receive limit). A user has at most `UPLOADS_PER_USER` of these in flight, and
        each stops reading at the model-definition limit."""
        user = caller()
        key = user.username if user is not None else ""
        if self._uploads.get(key, 0) >= UPLOADS_PER_USER:
            raise ResourceExhaustedError(
                f"{UPLOADS_PER_USER} uploads of this user are in progress: wait for one to finish"
            )
        self._uploads[key] = self._uploads.get(key, 0) + 1
        try:
            config_yaml, activate = None, False
            parts: list[bytes] = []
            size = 0
            async for chunk in request_iterator:
                if config_yaml is None:
                    config_yaml, activate = chunk.config_yaml, chunk.activate
                size += len(chunk.model_definition_part)
                if size > MAX_MODEL_DEF_BYTES:
                    raise InvalidArgumentError(
                        f"the model definition is over {MAX_MODEL_DEF_BYTES // 2**20} MiB: "
                        "leave data and checkpoints out of the model directory "
                        "(list them in .assayignore) and load data from storage"
                    )
                parts.append(chunk.model_definition_part)
        finally:
            self._uploads[key] -= 1
            if not self._uploads[key]:
                del self._uploads[key]
        if config_yaml is None:
            raise InvalidArgumentError("no message came: the first one carries the config")
        return await self._create(config_yaml, b"".join(parts), activate, context)

    async def _create(
        self,
        config_yaml: str,
        model_definition: bytes,
        activate: bool,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> api_pb2.CreateExperimentResponse:
        loop = asyncio.get_running_loop()
        args = (config_yaml, model_definition)
        who = caller()
        if who is None:
            # Not let in by the guard (a test calling the servicer): the token's user.
            # A miss reads the store: off the loop.
            metadata = metadata_dict(context.invocation_metadata())
            who = await self.guard.principal_async(metadata, self.pool)
        owner = who.username
        inline = len(model_definition) <= INLINE_ARCHIVE_BYTES
        if not inline or len(config_yaml) > INLINE_CONFIG_CHARS:
            # Checking a big archive takes a while: not on the loop the agents use.
            prepared = await loop.run_in_executor(
                self.pool, partial(self.master.prepare_experiment, owner=owner), *args
            )
        else:
            prepared = self.master.prepare_experiment(*args, owner=owner)
        config = prepared.config
        project = await loop.run_in_executor(
            self.pool,
            partial(self.roles.new_experiment_project, who, config.workspace, config.project),
        )
        prepared = dataclasses.replace(prepared, project_id=project.id)
        self.master.quota.take(prepared.owner_id, who.admin, len(model_definition))
        record, ticket, why = self.master.add_experiment(prepared, activate=activate)
        await self.master.commit.wait_async(ticket)
        experiment = _convert.experiment(record, num_trials=1, parsed=prepared.config)
        experiment.workspace, experiment.project = project.workspace, project.name
        warnings = (
            [
                f"its trials cannot start on this cluster as it is: each {why}; they wait until "
                "agents that can hold them connect or are enabled"
            ]
            if why
            else []
        )
        return api_pb2.CreateExperimentResponse(experiment=experiment, warnings=warnings)

    def _experiment(self, experiment_id: int, *, with_text: bool = False) -> common_pb2.Experiment:
        """`with_text`: and the config as submitted (secrets masked), for one experiment's page."""
        record = self.store.get_experiment(experiment_id)
        trials = self.store.list_trials(experiment_id)
        bests = [t.best_validation for t in trials if t.best_validation is not None]
        smaller = bool(record.config.get("searcher", {}).get("smaller_is_better", True))
        if objectives := objectives_of(record.config):  # searcher.metrics: the first one's
            smaller = objectives[0].smaller_is_better
        best = (min(bests) if smaller else max(bests)) if bests else None
        message = _convert.experiment(record, num_trials=len(trials), best=best)
        message.workspace, message.project = record.workspace, record.project
        text = self.store.get_config_text(experiment_id) if with_text else None
        if text is not None:
            message.config_yaml = masked_config_text(text, record.config) or ""
        return message

    @maps_errors
    def GetExperiment(  # noqa: N802
        self, request: api_pb2.GetExperimentRequest, context: grpc.ServicerContext
    ) -> api_pb2.GetExperimentResponse:
        who = self._may_read(context, request.id)
        experiment = self._experiment(request.id, with_text=True)
        trials = [_convert.trial(t) for t in self.store.list_trials(request.id)]
        waiting = self.master.unplaceable
        for trial in trials:
            if trial.state == common_pb2.TRIAL_STATE_QUEUED:
                trial.waiting = waiting.get(trial.id, "")
        names = [
            api_pb2.MetricName(group=group, name=name)
            for group, name in self.store.experiment_metric_names(request.id)
        ]
        response = api_pb2.GetExperimentResponse(
            experiment=experiment, trials=trials, metric_names=names
        )
        record = self.store.get_experiment(request.id)
        fill_pareto(self.store, request.id, record.config, response)  # searcher.metrics
        if who.admin or experiment.owner == who.username:  # usage is its owner's to see
            response.slot_seconds = self.store.experiment_slot_seconds([request.id])[request.id]
        return response

    @maps_errors
    def ListExperiments(  # noqa: N802
        self, request: api_pb2.ListExperimentsRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListExperimentsResponse:
        states = [
            common_pb2.ExperimentState.Name(s).removeprefix("EXPERIMENT_STATE_")
            for s in request.states
        ]
        page = self.store.list_experiments(
            states=states,
            name=request.name or None,
            label=request.label or None,
            owner=request.owner or None,
            archived=request.archived if request.HasField("archived") else None,
            workspaces=self.roles.visible(self._who(context)),
            workspace=request.workspace or None,
            project=request.project or None,
            sort=request.sort_by or "id",
            descending=not request.ascending,
            limit=request.limit or 50,
            offset=request.offset,
        )
        return api_pb2.ListExperimentsResponse(
            experiments=[self._experiment(e.id) for e in page.items], total=page.total
        )

    @maps_errors
    def ExperimentAction(  # noqa: N802
        self, request: api_pb2.ExperimentActionRequest, context: grpc.ServicerContext
    ) -> common_pb2.Experiment:
        action = _ACTIONS.get(request.action)
        if action is None:
            raise InvalidArgumentError(
                "unknown experiment action; give one of pause, "
                "activate, cancel, kill, archive, unarchive"
            )
        self._may_change(self._who(context), request.id)
        self.master.experiment_action(request.id, action)
        return self._experiment(request.id)

    @maps_errors
    def ContinueExperiment(  # noqa: N802
        self, request: api_pb2.ContinueExperimentRequest, context: grpc.ServicerContext
    ) -> common_pb2.Experiment:
        from assay.master._continue import parse_overrides

        self._may_change(self._who(context), request.id)  # an editor, as for activate
        overrides = parse_overrides(request.id, request.config_yaml)
        self.master.continue_experiment(request.id, overrides)
        return self._experiment(request.id)

    @maps_errors
    def SetExperimentResource(  # noqa: N802
        self, request: api_pb2.SetExperimentResourceRequest, context: grpc.ServicerContext
    ) -> common_pb2.Experiment:
        self._may_change(self._who(context), request.id)
        self.master.set_experiment_resource(request.id, request.name, request.value)
        return self._experiment(request.id)

    @maps_errors
    def GetSearcherEvents(  # noqa: N802
        self, request: api_pb2.GetSearcherEventsRequest, context: grpc.ServicerContext
    ) -> api_pb2.GetSearcherEventsResponse:
        from assay.master import _custom_search

        # The runner steers the search: an editor's role, as pausing the experiment is.
        self._may_change(self._who(context), request.experiment_id)
        view = _custom_search.searcher_events(
            self.master, request.experiment_id, request.after_event_id
        )
        return _custom_search.events_response(view)

    @maps_errors
    def PostSearcherOperations(  # noqa: N802
        self, request: api_pb2.PostSearcherOperationsRequest, context: grpc.ServicerContext
    ) -> api_pb2.PostSearcherOperationsResponse:
        from assay.master import _custom_search

        self._may_change(self._who(context), request.experiment_id)
        acknowledged = _custom_search.post_operations(
            self.master,
            request.experiment_id,
            request.triggered_by_event_id,
            _custom_search.operations_of(request),
            method_state=request.method_state,
            progress=request.progress if request.HasField("progress") else None,
        )
        return api_pb2.PostSearcherOperationsResponse(acknowledged_event_id=acknowledged)

    @maps_errors
    def GetExperimentMetrics(  # noqa: N802
        self, request: api_pb2.GetExperimentMetricsRequest, context: grpc.ServicerContext
    ) -> api_pb2.GetExperimentMetricsResponse:
        self._may_read(context, request.id)
        curves = self.store.experiment_curves(
            request.id,
            request.name,
            group=request.group or "validation",
            max_points=request.max_points or 1000,
        )
        return api_pb2.GetExperimentMetricsResponse(
            curves=[
                api_pb2.Curve(trial_id=t, total_batches=[b for b, _ in c], values=[v for _, v in c])
                for t, c in curves.items()
            ]
        )

    @maps_errors
    def CreateTemplate(  # noqa: N802
        self, request: api_pb2.CreateTemplateRequest, context: grpc.ServicerContext
    ) -> api_pb2.Template:
        who = self._who(context)
        self.store.create_template(
            request.name, _template_config(request.config_yaml), owner_id=who.user_id
        )
        return _template_message(self.store.get_template(request.name))

    @maps_errors
    def GetTemplate(  # noqa: N802
        self, request: api_pb2.GetTemplateRequest, context: grpc.ServicerContext
    ) -> api_pb2.Template:
        return _template_message(self.store.get_template(request.name))

    @maps_errors
    def ListTemplates(  # noqa: N802
        self, request: api_pb2.ListTemplatesRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListTemplatesResponse:
        return api_pb2.ListTemplatesResponse(
            templates=[_template_message(t) for t in self.store.list_templates()]
        )

    @maps_errors
    def DeleteTemplate(  # noqa: N802
        self, request: api_pb2.DeleteTemplateRequest, context: grpc.ServicerContext
    ) -> api_pb2.DeleteTemplateResponse:
        who = self._who(context)
        found = self.store.get_template(request.name)
        if not who.admin and found.owner != who.username:
            raise PermissionDeniedError(
                f"template {request.name!r} is {found.owner}'s: only they or an administrator "
                "may delete it"
            )
        self.store.delete_template(request.name)
        return api_pb2.DeleteTemplateResponse()

    @maps_errors
    def PatchExperiment(  # noqa: N802
        self, request: api_pb2.PatchExperimentRequest, context: grpc.ServicerContext
    ) -> common_pb2.Experiment:
        from assay.config import _limits

        self._may_change(self._who(context), request.id)
        name = request.name.strip() if request.HasField("name") else None
        description = request.description if request.HasField("description") else None
        labels = list(request.labels.labels) if request.HasField("labels") else None
        added, removed = list(request.add_labels), list(request.remove_labels)
        problems = (
            []
            if description is None
            else _limits.text_problems(description, "description", "description")
        )
        for text, kind in [
            *([(name, "name")] if name is not None else []),
            *((label, "label") for label in [*(labels or []), *added]),
        ]:
            if not text.strip() or "\x00" in text:
                problems.append(f"{kind} {text!r}: give 1 or more characters, without NUL")
            problems.extend(_limits.text_problems(text, kind, kind))  # type: ignore[arg-type]
        if problems:
            raise InvalidArgumentError("; ".join(problems))
        self.store.patch_experiment(
            request.id,
            name=name,
            description=description,
            labels=labels,
            add_labels=added,
            remove_labels=removed,
        )
        return self._experiment(request.id)

    @maps_errors
    def GetModelDefinition(  # noqa: N802
        self, request: api_pb2.GetModelDefinitionRequest, context: grpc.ServicerContext
    ) -> api_pb2.GetModelDefinitionResponse:
        self._may_read(context, request.experiment_id)
        data = self.store.get_model_definition(request.experiment_id)  # NOT_FOUND names the id
        return api_pb2.GetModelDefinitionResponse(model_definition=data)

    @maps_errors
    def DeleteExperiment(  # noqa: N802
        self, request: api_pb2.DeleteExperimentRequest, context: grpc.ServicerContext
    ) -> api_pb2.DeleteExperimentResponse:
        # Editors of its workspace (and its owner) delete it; see _checkpoints.delete_experiment.
        self.roles.experiment(self._who(context), request.id, EDITOR, owner_may=True)
        result = _checkpoints.delete_experiment(
            self.store,
            request.id,
            default_root=self.master.config.checkpoint_root,
            policy=self.master.config.storage_policy,
            delete_rows=self.master.delete_experiment_rows,
        )
        return api_pb2.DeleteExperimentResponse(
            deleted_checkpoints=list(result.deleted), failed=dict(result.failed)
        )

    @maps_errors
    def KillTrial(  # noqa: N802
        self, request: api_pb2.KillTrialRequest, context: grpc.ServicerContext
    ) -> common_pb2.Trial:
        self.roles.trial(self._who(context), request.id, EDITOR)  # as killing its experiment
        self.master.kill_trial(request.id)
        return _convert.trial(self.store.get_trial(request.id))

    @maps_errors
    def GetTrial(  # noqa: N802
        self, request: api_pb2.GetTrialRequest, context: grpc.ServicerContext
    ) -> common_pb2.Trial:
        self.roles.trial(self._who(context), request.id)
        trial = _convert.trial(self.store.get_trial(request.id))
        allocation_id = self.master.run_of_trial.get(request.id)
        if allocation_id is not None:  # running: each rank's latest utilisation
            trial.ranks.extend(self.master.rank_usage.ranks(allocation_id))
        return trial

    @maps_errors
    def GetTrialMetrics(  # noqa: N802
        self, request: api_pb2.GetTrialMetricsRequest, context: grpc.ServicerContext
    ) -> api_pb2.GetTrialMetricsResponse:
        self.roles.trial(self._who(context), request.id)
        group = request.group or "validation"
        names = self.store.metric_names(request.id).get(group, [])
        by_batch: dict[int, dict[str, float]] = {}
        for name in names:
            curve = self.store.trial_curve(
                request.id, name, group=group, max_points=request.max_points or 100_000
            )
            for batches, value in curve:
                by_batch.setdefault(batches, {})[name] = value
        return api_pb2.GetTrialMetricsResponse(
            reports=[
                common_pb2.MetricsReport(total_batches=b, metrics=m)
                for b, m in sorted(by_batch.items())
            ]
        )

    @maps_errors_stream
    async def StreamTrialLogs(  # noqa: N802
        self,
        request: api_pb2.StreamTrialLogsRequest,
        context: grpc.aio.ServicerContext[api_pb2.StreamTrialLogsRequest, common_pb2.LogLine],
    ) -> AsyncIterator[common_pb2.LogLine]:
        """On the event loop: a follower waits with asyncio, holding no thread; each read
        of the store runs on the pool. A user follows at most `log_followers_per_user`
        logs at once."""
        loop = asyncio.get_running_loop()
        metadata = metadata_dict(context.invocation_metadata())

        async def read(call: Callable[[], _T]) -> _T:
            return await loop.run_in_executor(self.pool, call)

        who = caller() or await self.guard.principal_async(metadata, self.pool)
        await read(partial(self.roles.trial, who, request.trial_id))
        lines = stream_trial_logs(
            self.store,
            read,
            request.trial_id,
            after_id=request.after_id,
            tail=request.tail,
            follow=request.follow,
            still_allowed=partial(read, partial(self.guard.principal, metadata)),
        )
        slot: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
        if request.follow:
            slot = self.log_followers.hold(who.username)
        with slot:
            async with contextlib.aclosing(lines):
                async for line in lines:
                    yield _convert.log_line(line, request.trial_id)

    @maps_errors
    def ListCheckpoints(  # noqa: N802
        self, request: api_pb2.ListCheckpointsRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListCheckpointsResponse:
        who = self._who(context)
        if request.trial_id:
            self.roles.trial(who, request.trial_id)
            trials = [self.store.get_trial(request.trial_id)]
        else:
            self.roles.experiment(who, request.experiment_id)
            trials = self.store.list_trials(request.experiment_id)
        return api_pb2.ListCheckpointsResponse(
            checkpoints=[
                _convert.checkpoint(c, t.experiment_id)
                for t in trials
                for c in self.store.list_checkpoints(t.id)
            ]
        )

    @maps_errors
    def DeleteCheckpoints(  # noqa: N802
        self, request: api_pb2.DeleteCheckpointsRequest, context: grpc.ServicerContext
    ) -> api_pb2.DeleteCheckpointsResponse:
        who = self._who(context)
        # A checkpoint of another workspace does not exist for you (each uuid as it is
        # looked up below: stripped and lowercased).
        for uuid in _checkpoints.normalise_uuids(request.uuids):
            try:
                record = self.store.get_checkpoint(uuid)
            except NotFoundError:
                continue  # named by the deletion below
            self.roles.checkpoint(who, record, EDITOR, owner_may=True)
        return _checkpoints.delete_response(
            self.store,
            request,
            user=None,  # the roles above: editors of its workspace, or its owner
            default_root=self.master.config.checkpoint_root,
            policy=self.master.config.storage_policy,
        )

    @maps_errors
    def GetCheckpoint(  # noqa: N802
        self, request: api_pb2.GetCheckpointRequest, context: grpc.ServicerContext
    ) -> common_pb2.Checkpoint:
        record = self.store.get_checkpoint(request.uuid)
        self.roles.checkpoint(self._who(context), record)
        trial = self.store.get_trial(record.trial_id)
        return _convert.checkpoint(record, trial.experiment_id)

    @maps_errors
    def ListAgents(  # noqa: N802
        self, request: api_pb2.ListAgentsRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListAgentsResponse:
        agents = self.master.cluster_view().agents
        return api_pb2.ListAgentsResponse(agents=[wire.agent_message(a) for a in agents])

    @maps_errors
    def GetQueue(  # noqa: N802
        self, request: api_pb2.GetQueueRequest, context: grpc.ServicerContext
    ) -> api_pb2.GetQueueResponse:
        view = self.master.cluster_view()
        visible = self.roles.visible(self._who(context))
        queue = view.queue
        if visible is not None:  # a user sees the queued trials of their workspaces only
            shown = self.store.experiments_in({q.experiment_id for q in queue}, visible)
            queue = tuple(q for q in queue if q.experiment_id in shown)
        trials = [
            api_pb2.QueuedTrial(
                trial_id=q.trial_id,
                experiment_id=q.experiment_id,
                experiment_name=q.experiment_name,
                priority=q.priority,
                slots=q.slots,
                slot_type=wire.slot_type(q.slot_type),
                reason=q.reason,
                position=q.position,
                wait_kind=q.wait_kind,
                waiting=q.waiting,
                resource_pool=q.pool,
            )
            for q in queue
        ]
        return api_pb2.GetQueueResponse(trials=trials)

    @maps_errors
    def ListResourcePools(  # noqa: N802
        self, request: api_pb2.ListResourcePoolsRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListResourcePoolsResponse:
        view = self.master.cluster_view()
        default = self.master.config.default_resource_pool
        return api_pb2.ListResourcePoolsResponse(pools=wire.pool_messages(view, default))

    @maps_errors
    def RemoveAgent(  # noqa: N802
        self, request: api_pb2.RemoveAgentRequest, context: grpc.ServicerContext
    ) -> api_pb2.RemoveAgentResponse:
        self._admin(context, "remove agents")
        disconnected = self.master.remove_agent(request.id)
        return api_pb2.RemoveAgentResponse(disconnected=disconnected)

    @maps_errors
    def SetAgentEnabled(  # noqa: N802
        self, request: api_pb2.SetAgentEnabledRequest, context: grpc.ServicerContext
    ) -> common_pb2.Agent:
        self._admin(context, "enable or disable agents")
        self.master.set_agent_enabled(request.id, request.enabled, drain=request.drain)
        [agent] = [a for a in self.master.cluster_view().agents if a.id == request.id]
        return wire.agent_message(agent)

    # --- the model registry (who may do what: _registry.py) -------------------------------

    @maps_errors
    def CreateModel(  # noqa: N802
        self, request: api_pb2.CreateModelRequest, context: grpc.ServicerContext
    ) -> api_pb2.Model:
        who = self._who(context)
        record = self.store.create_model(
            request.name,
            owner_id=who.user_id,
            description=request.description,
            labels=list(request.labels),
            metadata=_registry.metadata(request.metadata),
        )
        return _registry.model_message(record)

    @maps_errors
    def GetModel(  # noqa: N802
        self, request: api_pb2.GetModelRequest, context: grpc.ServicerContext
    ) -> api_pb2.Model:
        return _registry.model_message(self.store.get_model(request.name))

    @maps_errors
    def ListModels(  # noqa: N802
        self, request: api_pb2.ListModelsRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListModelsResponse:
        found = self.store.list_models(
            name=request.name or None,
            label=request.label or None,
            archived=request.archived if request.HasField("archived") else None,
        )
        return api_pb2.ListModelsResponse(models=[_registry.model_message(m) for m in found])

    @maps_errors
    def PatchModel(  # noqa: N802
        self, request: api_pb2.PatchModelRequest, context: grpc.ServicerContext
    ) -> api_pb2.Model:
        _registry.may_edit_model(self.store, self._who(context), request.name, "change")
        record = self.store.patch_model(
            request.name,
            description=request.description if request.HasField("description") else None,
            labels=list(request.labels.labels) if request.HasField("labels") else None,
            metadata=(
                _registry.metadata(request.metadata) if request.HasField("metadata") else None
            ),
        )
        return _registry.model_message(record)

    @maps_errors
    def ArchiveModel(  # noqa: N802
        self, request: api_pb2.ArchiveModelRequest, context: grpc.ServicerContext
    ) -> api_pb2.Model:
        _registry.may_edit_model(self.store, self._who(context), request.name, "archive")
        return _registry.model_message(self.store.patch_model(request.name, archived=True))

    @maps_errors
    def UnarchiveModel(  # noqa: N802
        self, request: api_pb2.UnarchiveModelRequest, context: grpc.ServicerContext
    ) -> api_pb2.Model:
        _registry.may_edit_model(self.store, self._who(context), request.name, "unarchive")
        return _registry.model_message(self.store.patch_model(request.name, archived=False))

    @maps_errors
    def DeleteModel(  # noqa: N802
        self, request: api_pb2.DeleteModelRequest, context: grpc.ServicerContext
    ) -> api_pb2.DeleteModelResponse:
        _registry.may_edit_model(self.store, self._who(context), request.name, "delete")
        deleted = self.store.delete_model(request.name, force=request.force)
        return api_pb2.DeleteModelResponse(versions_deleted=deleted)

    @maps_errors
    def RegisterModelVersion(  # noqa: N802
        self, request: api_pb2.RegisterModelVersionRequest, context: grpc.ServicerContext
    ) -> api_pb2.ModelVersion:
        who = self._who(context)
        self.store.get_model(request.name)  # an unknown model is named before the checkpoint
        uuid = _registry.checkpoint_uuid(request.checkpoint_uuid)
        # A checkpoint of a workspace the caller is not in is not theirs to register.
        self.roles.checkpoint(who, self.store.get_checkpoint(uuid))
        record = self.store.register_version(
            request.name,
            uuid,
            user_id=who.user_id,
            notes=request.notes,
            labels=list(request.labels),
            metadata=_registry.metadata(request.metadata),
        )
        return _registry.version_message(self.store, record)

    @maps_errors
    def ListModelVersions(  # noqa: N802
        self, request: api_pb2.ListModelVersionsRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListModelVersionsResponse:
        versions = self.store.list_versions(request.name)
        return api_pb2.ListModelVersionsResponse(
            versions=[_registry.version_message(self.store, v) for v in versions]
        )

    @maps_errors
    def GetModelVersion(  # noqa: N802
        self, request: api_pb2.GetModelVersionRequest, context: grpc.ServicerContext
    ) -> api_pb2.ModelVersion:
        record = self.store.get_version(request.name, request.version)
        return _registry.version_message(self.store, record)

    @maps_errors
    def PatchModelVersion(  # noqa: N802
        self, request: api_pb2.PatchModelVersionRequest, context: grpc.ServicerContext
    ) -> api_pb2.ModelVersion:
        _registry.may_edit_model(self.store, self._who(context), request.name, "change versions of")
        record = self.store.patch_version(
            request.name,
            request.version,
            notes=request.notes if request.HasField("notes") else None,
            labels=list(request.labels.labels) if request.HasField("labels") else None,
            metadata=(
                _registry.metadata(request.metadata) if request.HasField("metadata") else None
            ),
        )
        return _registry.version_message(self.store, record)

    @maps_errors
    def DeleteModelVersion(  # noqa: N802
        self, request: api_pb2.DeleteModelVersionRequest, context: grpc.ServicerContext
    ) -> api_pb2.DeleteModelVersionResponse:
        _registry.may_edit_model(self.store, self._who(context), request.name, "delete versions of")
        self.store.delete_version(request.name, request.version)
        return api_pb2.DeleteModelVersionResponse()

    # --- workspaces and projects (who may do what: _roles) ----------------------------

    def _workspace_message(self, who: Principal, found: WorkspaceRecord) -> api_pb2.Workspace:
        return api_pb2.Workspace(
            name=found.name,
            archived=found.archived,
            num_projects=found.num_projects,
            num_experiments=found.num_experiments,
            role=self.roles.role(who, found.id) or "",
        )

    def _members(self, workspace_id: int) -> api_pb2.ListWorkspaceMembersResponse:
        return api_pb2.ListWorkspaceMembersResponse(
            members=[
                api_pb2.WorkspaceMember(username=m.username, role=m.role)
                for m in self.store.list_members(workspace_id)
            ]
        )

    @maps_errors
    def CreateWorkspace(  # noqa: N802
        self, request: api_pb2.CreateWorkspaceRequest, context: grpc.ServicerContext
    ) -> api_pb2.Workspace:
        who = self._who(context)
        created = self.store.create_workspace(request.name, who.user_id)
        return self._workspace_message(who, created)

    @maps_errors
    def ListWorkspaces(  # noqa: N802
        self, request: api_pb2.ListWorkspacesRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListWorkspacesResponse:
        who = self._who(context)
        found = self.store.list_workspaces(self.roles.visible(who))
        return api_pb2.ListWorkspacesResponse(
            workspaces=[self._workspace_message(who, w) for w in found]
        )

    @maps_errors
    def GetWorkspace(  # noqa: N802
        self, request: api_pb2.GetWorkspaceRequest, context: grpc.ServicerContext
    ) -> api_pb2.GetWorkspaceResponse:
        who = self._who(context)
        found = self.roles.workspace(who, request.name)
        return api_pb2.GetWorkspaceResponse(
            workspace=self._workspace_message(who, found),
            projects=[_project_message(p) for p in self.store.list_projects(found.id)],
            members=self._members(found.id).members,
        )

    @maps_errors
    def ArchiveWorkspace(  # noqa: N802
        self, request: api_pb2.ArchiveWorkspaceRequest, context: grpc.ServicerContext
    ) -> api_pb2.Workspace:
        who = self._who(context)
        found = self.roles.workspace(who, request.name, ADMIN)
        self.store.set_workspace_archived(found.id, request.archived)
        return self._workspace_message(who, self.store.get_workspace(found.name))

    @maps_errors
    def DeleteWorkspace(  # noqa: N802
        self, request: api_pb2.DeleteWorkspaceRequest, context: grpc.ServicerContext
    ) -> api_pb2.DeleteWorkspaceResponse:
        found = self.roles.workspace(self._who(context), request.name, ADMIN)
        self.store.delete_workspace(found.id)
        return api_pb2.DeleteWorkspaceResponse()

    @maps_errors
    def ListWorkspaceMembers(  # noqa: N802
        self, request: api_pb2.ListWorkspaceMembersRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListWorkspaceMembersResponse:
        found = self.roles.workspace(self._who(context), request.workspace)
        return self._members(found.id)

    @maps_errors
    def SetWorkspaceMember(  # noqa: N802
        self, request: api_pb2.SetWorkspaceMemberRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListWorkspaceMembersResponse:
        found = self.roles.workspace(self._who(context), request.workspace, ADMIN)
        user = self.store.get_user(request.username)
        self.store.set_member(found.id, user.id, request.role)
        return self._members(found.id)

    @maps_errors
    def RemoveWorkspaceMember(  # noqa: N802
        self, request: api_pb2.RemoveWorkspaceMemberRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListWorkspaceMembersResponse:
        found = self.roles.workspace(self._who(context), request.workspace, ADMIN)
        user = self.store.get_user(request.username)
        if not self.store.remove_member(found.id, user.id):
            raise NotFoundError(f"{user.username} is not a member of workspace {found.name!r}")
        return self._members(found.id)

    @maps_errors
    def CreateProject(  # noqa: N802
        self, request: api_pb2.CreateProjectRequest, context: grpc.ServicerContext
    ) -> api_pb2.Project:
        found = self.roles.workspace(self._who(context), request.workspace, EDITOR)
        if found.archived:
            raise InvalidArgumentError(
                f"workspace {found.name!r} is archived: unarchive it to add projects"
            )
        created = self.store.create_project(found.id, request.name, request.description)
        return _project_message(created)

    @maps_errors
    def ListProjects(  # noqa: N802
        self, request: api_pb2.ListProjectsRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListProjectsResponse:
        who = self._who(context)
        if request.workspace:
            found = self.roles.workspace(who, request.workspace)
            projects = self.store.list_projects(found.id)
        else:
            projects = self.store.list_projects(visible=self.roles.visible(who))
        return api_pb2.ListProjectsResponse(projects=[_project_message(p) for p in projects])

    @maps_errors
    def GetProject(  # noqa: N802
        self, request: api_pb2.GetProjectRequest, context: grpc.ServicerContext
    ) -> api_pb2.Project:
        found = self.roles.project(self._who(context), request.workspace, request.name)
        return _project_message(found)

    @maps_errors
    def ArchiveProject(  # noqa: N802
        self, request: api_pb2.ArchiveProjectRequest, context: grpc.ServicerContext
    ) -> api_pb2.Project:
        found = self.roles.project(self._who(context), request.workspace, request.name, ADMIN)
        self.store.set_project_archived(found.id, request.archived)
        return _project_message(self.store.get_project(found.id))

    @maps_errors
    def DeleteProject(  # noqa: N802
        self, request: api_pb2.DeleteProjectRequest, context: grpc.ServicerContext
    ) -> api_pb2.DeleteProjectResponse:
        found = self.roles.project(self._who(context), request.workspace, request.name, ADMIN)
        self.store.delete_project(found.id)
        return api_pb2.DeleteProjectResponse()

    @maps_errors
    def MoveExperiment(  # noqa: N802
        self, request: api_pb2.MoveExperimentRequest, context: grpc.ServicerContext
    ) -> common_pb2.Experiment:
        who = self._who(context)
        self._may_change(who, request.id)
        target = self.roles.project_ref(who, request.project, EDITOR)
        if target.archived:
            raise InvalidArgumentError(
                f"project {target.workspace}/{target.name} is archived: unarchive it first"
            )
        self.store.move_experiment(request.id, target.id)
        return self._experiment(request.id)


def _project_message(found: ProjectRecord) -> api_pb2.Project:
    return api_pb2.Project(
        workspace=found.workspace,
        name=found.name,
        description=found.description,
        archived=found.archived,
        num_experiments=found.num_experiments,
    )


def _template_config(text: str) -> dict[str, Any]:
    """A template's YAML as a mapping, refused if it holds a secret: every user reads
    templates."""
    import yaml

    from assay.config import _limits
    from assay.master._secrets import is_secret_name

    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise InvalidArgumentError(f"the template is not valid YAML: {e}") from None
    if not isinstance(config, dict) or not config:
        raise InvalidArgumentError("a template must be a non-empty mapping of config keys")
    problems, too_deep = _limits.value_problems(config)
    if problems or too_deep:
        raise InvalidArgumentError("; ".join(problems) or "the template nests too deep")
    pending: list[Any] = [config]
    while pending:
        value = pending.pop()
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            if isinstance(key, str) and is_secret_name(key) and item not in (None, ""):
                raise InvalidArgumentError(
                    f"the template sets {key}: every user can read templates, so keep secrets "
                    "in the experiment's own config"
                )
            if isinstance(item, dict | list):
                pending.append(item)
    return config


def _template_message(found: TemplateRecord) -> api_pb2.Template:
    import yaml

    message = api_pb2.Template(
        name=found.name,
        config_yaml=yaml.safe_dump(found.config, sort_keys=False),
        owner=found.owner,
    )
    message.created_at.FromDatetime(found.created_at)
    return message


def _user_message(user: UserRecord) -> api_pb2.User:
    return api_pb2.User(
        username=user.username,
        admin=user.admin,
        active=user.active,
        has_password=user.has_password,
    )


def _usage_message(found: _usage.UsageReport) -> api_pb2.GetUsageResponse:
    response = api_pb2.GetUsageResponse(by=found.by, all_users=found.all_users)
    response.since.FromDatetime(found.since)
    response.until.FromDatetime(found.until)
    response.groups.extend(
        api_pb2.UsageGroup(
            key=g.key,
            name=g.name,
            day=g.day,
            slot_seconds=g.slot_seconds,
            slot_hours=g.slot_hours,
        )
        for g in found.groups
    )
    response.pools.extend(
        api_pb2.PoolUsage(
            pool=p.pool,
            used_slot_seconds=p.used_slot_seconds,
            capacity_slot_seconds=p.capacity_slot_seconds,
            used_ratio=p.used_ratio,
            idle_ratio=p.idle_ratio,
        )
        for p in found.pools
    )
    return response


def _address(peer: str) -> str:
    """The host of a gRPC peer (`ipv4:10.0.0.5:51234` -> `10.0.0.5`): what failed logins
    are counted by."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv6":
        return rest.rsplit(":", 1)[0].strip("[]")
    if kind == "ipv4":
        return rest.rsplit(":", 1)[0]
    return peer


def _utc(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, dt.UTC)
