"""The agents and the resource pools they serve: who is connected with which slots, their
outboxes and credentials, what the master shows of them, the `resource_pools` setting,
and which workspaces may use each pool.
"""

from assay.master.fleet._agents import (
    AgentHandle,
    AgentView,
    ClusterView,
    Device,
    Load,
    Outbox,
    PoolView,
    QueuedView,
    Registration,
    SlotKind,
    SlotView,
    cluster_view,
)
from assay.master.fleet._fleet import Fleet
from assay.master.fleet._pool_access import Binding, PoolAccess
from assay.master.fleet._pool_config import ResourcePools, pool_workspaces, spec_keys

__all__ = [
    "AgentHandle",
    "AgentView",
    "Binding",
    "ClusterView",
    "Device",
    "Fleet",
    "Load",
    "Outbox",
    "PoolAccess",
    "PoolView",
    "QueuedView",
    "Registration",
    "ResourcePools",
    "SlotKind",
    "SlotView",
    "cluster_view",
    "pool_workspaces",
    "spec_keys",
]
