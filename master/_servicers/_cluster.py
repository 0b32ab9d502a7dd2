"""API handlers for the cluster: the master's info, agents, the queue, resource pools."""

from __future__ import annotations

import grpc

from assay import __version__
from assay.master import _agent_wire as wire
from assay.master._servicers._base import ServicerBase
from assay.master._status import maps_errors
from assay.proto import api_pb2, common_pb2


class ClusterRpcs(ServicerBase):
    """What the cluster holds and waits for; agents are an administrator's to change."""

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
