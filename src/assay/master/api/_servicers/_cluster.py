"""API handlers for the cluster: the master's info, agents, the queue, resource pools."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import grpc
import yaml
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from assay import __version__
from assay.common.settings import effective
from assay.master import wire
from assay.master._config import MasterConfig
from assay.master.api._servicers._base import ServicerBase
from assay.master.api._status import maps_errors, maps_errors_stream
from assay.master.auth import masked
from assay.master.errors import (
    ConflictError,
    InvalidArgumentError,
    PermissionDeniedError,
)
from assay.master.store import WorkspaceRecord
from assay.master.telemetry import stream_master_logs
from assay.proto import api_pb2, common_pb2

HIDDEN = "<hidden>"  # as `effective` writes a secret setting's value


def shown_config(config: MasterConfig) -> str:
    """The master's settings as YAML for an administrator: a secret setting's value reads
    `<hidden>` (as `--check-config` prints it), a value under a secret-sounding key in a
    nested one reads MASK, and db_url shows where the store is without its password."""
    data = {
        key: value if value == HIDDEN else masked({key: value})[key]
        for key, value in yaml.safe_load(effective(config)).items()
    }
    if config.db_url:
        with contextlib.suppress(ArgumentError):  # not a URL SQLAlchemy reads: hidden
            data["db_url"] = make_url(config.db_url).render_as_string(hide_password=True)
    return str(yaml.safe_dump(data, sort_keys=False))


class ClusterRpcs(ServicerBase):
    """What the cluster holds and waits for; agents are an administrator's to change.
    The master's settings and log are its administrators'."""

    @maps_errors
    def GetMasterConfig(  # noqa: N802
        self, request: api_pb2.GetMasterConfigRequest, context: grpc.ServicerContext
    ) -> api_pb2.GetMasterConfigResponse:
        self._admin(context, "read the master's settings")
        return api_pb2.GetMasterConfigResponse(yaml=shown_config(self.master.config))

    @maps_errors_stream
    async def StreamMasterLogs(  # noqa: N802
        self,
        request: api_pb2.StreamMasterLogsRequest,
        context: grpc.aio.ServicerContext[api_pb2.StreamMasterLogsRequest, api_pb2.MasterLogLine],
    ) -> AsyncIterator[api_pb2.MasterLogLine]:
        who = await self._who_async(context)
        if not who.admin:
            raise PermissionDeniedError(
                f"only an administrator may read the master's log; {who.username} is not"
            )
        if request.tail < 0:
            raise InvalidArgumentError(f"tail must not be negative, got {request.tail}")
        if self.master_logs is None:
            raise ConflictError("this master keeps no log in memory")
        lines = stream_master_logs(self.master_logs, tail=request.tail, follow=request.follow)
        slot: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
        if request.follow:
            slot = self.log_followers.hold(who.username)
        with slot:
            async with contextlib.aclosing(lines):
                async for line in lines:
                    shown = api_pb2.MasterLogLine(
                        id=line.id, level=line.level, logger=line.logger, message=line.message
                    )
                    shown.timestamp.FromDatetime(line.timestamp)
                    yield shown

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

    @maps_errors
    def ListAgents(  # noqa: N802
        self, request: api_pb2.ListAgentsRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListAgentsResponse:
        agents = [wire.agent_message(a) for a in self.master.cluster_view().agents]
        visible = self.roles.visible(self._who(context))
        busy = {s.trial_id for a in agents for s in a.slots if s.trial_id}
        # A user sees the allocations of their workspaces' experiments; another's slot
        # only as busy, so its ids cannot point an attack at it.
        shown = None if visible is None else self.store.trials_in(busy, visible)
        for agent in agents:
            _mask_slots(agent, shown)
        return api_pb2.ListAgentsResponse(agents=agents)

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
        pools = wire.pool_messages(view, default)
        for pool in pools:
            pool.bindings.extend(self._bindings(pool.name))
        return api_pb2.ListResourcePoolsResponse(pools=pools)

    def _bindings(self, pool: str) -> list[api_pb2.PoolBinding]:
        return [
            api_pb2.PoolBinding(workspace=b.workspace, from_settings=b.from_settings)
            for b in self.master.pool_access.bindings(pool)
        ]

    def _pool_workspaces(self, pool: str) -> api_pb2.ResourcePoolWorkspaces:
        return api_pb2.ResourcePoolWorkspaces(pool=pool, bindings=self._bindings(pool))

    @maps_errors
    def ListResourcePoolWorkspaces(  # noqa: N802
        self, request: api_pb2.ListResourcePoolWorkspacesRequest, context: grpc.ServicerContext
    ) -> api_pb2.ResourcePoolWorkspaces:
        return self._pool_workspaces(request.pool)

    @maps_errors
    def BindResourcePool(  # noqa: N802
        self, request: api_pb2.BindResourcePoolRequest, context: grpc.ServicerContext
    ) -> api_pb2.ResourcePoolWorkspaces:
        """Admins only. The pool then takes experiments of its bound workspaces only; the
        trials of live experiments of other workspaces in it wait (running ones go on)."""
        self._admin(context, "bind resource pools to workspaces")
        access = self.master.pool_access
        access.bind(request.pool, self._named_workspace(request.workspace))
        access.hold_back(self.master)
        return self._pool_workspaces(request.pool)

    @maps_errors
    def UnbindResourcePool(  # noqa: N802
        self, request: api_pb2.UnbindResourcePoolRequest, context: grpc.ServicerContext
    ) -> api_pb2.ResourcePoolWorkspaces:
        """Admins only. A pool left with no binding is open to every workspace."""
        self._admin(context, "unbind resource pools from workspaces")
        access = self.master.pool_access
        access.unbind(request.pool, self._named_workspace(request.workspace))
        access.hold_back(self.master)
        return self._pool_workspaces(request.pool)

    def _named_workspace(self, name: str) -> WorkspaceRecord:
        if not name:
            raise InvalidArgumentError("give a workspace's name")
        return self.store.get_workspace(name)

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
        return _mask_slots(wire.agent_message(agent), None)


def _mask_slots(agent: common_pb2.Agent, shown: set[int] | None) -> common_pb2.Agent:
    """Mark the agent's taken slots busy, and clear the allocation and trial ids of those
    whose trial is not in `shown` (None: show every one, as to an admin)."""
    for slot in agent.slots:
        slot.busy = bool(slot.allocation_id or slot.trial_id)
        if shown is not None and slot.trial_id not in shown:
            slot.allocation_id, slot.trial_id = "", 0
    return agent
