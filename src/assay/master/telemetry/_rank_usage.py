"""The latest per-rank utilisation of every running allocation, from agents' heartbeats.

Kept in memory only (a sample is stale by the next heartbeat, and worth nothing after a
restart): each heartbeat replaces everything its agent said before, so an allocation that
ended, or an agent gone, drops out with its next heartbeat or its disconnection. An agent
speaks only for its own part of an allocation: a sample for an allocation the master did
not place on that agent is dropped.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from assay.proto import common_pb2


class RankUsageBoard:
    """Thread-safe; written from the agents' streams, read by GetTrial."""

    def __init__(self, runs_on: Callable[[str, str], bool]) -> None:
        """`runs_on(allocation_id, agent_id)`: whether the master placed a part of that
        allocation on that agent."""
        self._runs_on = runs_on
        self._lock = threading.Lock()
        self._by_agent: dict[str, dict[str, list[common_pb2.RankUsage]]] = {}

    def heard(self, agent_id: str, samples: Iterable[common_pb2.RankUsage]) -> None:
        """`agent_id`'s heartbeat carried these samples: they replace its earlier ones."""
        kept: dict[str, list[common_pb2.RankUsage]] = {}
        for sample in samples:
            if not self._runs_on(sample.allocation_id, agent_id):
                continue
            copy = common_pb2.RankUsage()
            copy.CopyFrom(sample)
            copy.agent_id = agent_id
            kept.setdefault(sample.allocation_id, []).append(copy)
        with self._lock:
            if kept:
                self._by_agent[agent_id] = kept
            else:
                self._by_agent.pop(agent_id, None)

    def forget(self, agent_id: str) -> None:
        """The agent's stream ended: what it said no longer holds."""
        with self._lock:
            self._by_agent.pop(agent_id, None)

    def ranks(self, allocation_id: str) -> list[common_pb2.RankUsage]:
        """The allocation's latest samples from all its agents, by rank."""
        with self._lock:
            found = [s for parts in self._by_agent.values() for s in parts.get(allocation_id, ())]
        return sorted(found, key=lambda s: s.rank)


__all__ = ["RankUsageBoard"]
