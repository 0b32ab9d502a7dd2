"""Agents and allocations, as the master last recorded them.

The master writes both through `WriteBatch` (an agent's registration and state, the
slots given to a trial's run); a restarted master reads them back here.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import select

from assay.master.store._base import StoreBase
from assay.master.store._models import Agent, Allocation
from assay.master.store._records import AgentRecord, AllocationRecord


class AgentQueries(StoreBase):
    """Agents and allocations."""

    def list_agents(self) -> list[AgentRecord]:
        with self.read() as s:
            return [
                AgentRecord(
                    a.id,
                    a.address,
                    a.slot_type,
                    a.slots,
                    list(a.devices),
                    a.state,
                    a.last_heartbeat,
                )
                for a in s.execute(select(Agent).order_by(Agent.id)).scalars()
            ]

    def agent_credentials(self) -> dict[str, str]:
        """Agent id -> the sha256 (hex) of its credential, for the agents given one."""
        with self.read() as s:
            rows = s.execute(
                select(Agent.id, Agent.credential_sha256).where(
                    Agent.credential_sha256.is_not(None)
                )
            )
            return {agent_id: str(digest) for agent_id, digest in rows}

    def agents_joined(self) -> dict[str, dt.datetime]:
        """Agent id -> when it first joined the cluster (its row's registration time)."""
        with self.read() as s:
            return {a: when for a, when in s.execute(select(Agent.id, Agent.registered_at))}

    def active_allocations(self) -> list[AllocationRecord]:
        with self.read() as s:
            rows = s.execute(
                select(Allocation).where(Allocation.ended_at.is_(None)).order_by(Allocation.id)
            ).scalars()
            return [
                AllocationRecord(a.id, a.trial_id, a.run_id, a.state, list(a.placement), a.stopping)
                for a in rows
            ]


__all__ = ["AgentQueries"]
