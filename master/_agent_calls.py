"""The agents' calls: registration, heartbeats, runs started and ended, lost agents.

What each decides is in `lifecycle/agent.py` and `lifecycle/run.py`; the agents'
connections and outboxes are `Fleet`'s. Reports an agent makes are not waited for: the
agent needs no answer, and what they change is committed with the next batch.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from assay.master import _agents
from assay.master._agents import AgentHandle, ClusterView, Load, Outbox, Registration
from assay.master._auth import mask_secrets
from assay.master.lifecycle import agent as agent_life
from assay.master.store import LogLine

if TYPE_CHECKING:
    from assay.master._core import Master

log = logging.getLogger("assay.master")


class AgentCalls:
    """What agents tell the master, and the periodic check for agents gone silent."""

    def __init__(self, master: Master) -> None:
        self._m = master

    def register_agent(self, register: Registration, peer_host: str, outbox: Outbox) -> AgentHandle:
        """A (re)connecting agent: its running allocations are kept, the rest forgotten."""
        with self._m.lock:
            handle, lost = self._m.fleet.register(register, peer_host, outbox, _now())
            self._m.parts_lost(register.agent_id, lost)
            running = register.running_allocations
            self._m.do(agent_life.reconcile(handle.id, running, list(self._m.runs.values())))
            self._m.schedule()
            self._m.commit_and_wait()
            return handle

    def heartbeat(self, agent_id: str, beat: Load) -> None:
        with self._m.lock:
            self._m.fleet.heard_from(agent_id, beat)

    def agent_disconnected(self, agent_id: str, handle: AgentHandle | None = None) -> None:
        """The stream of `handle` ended; a newer connection of the same agent is kept.

        The agent's trials keep their slots for `agent_reconnect_wait_s`: an agent back in
        time keeps them running; after that they are requeued (see `reap`).
        """
        with self._m.lock:
            wait = self._m.config.agent_reconnect_wait_s
            if not self._m.fleet.disconnected(agent_id, handle, keep=wait > 0):
                return
            if wait <= 0:
                self._m.drop_agent(agent_id, "disconnected")
            else:
                log.warning("agent %s disconnected; its trials wait %g s for it", agent_id, wait)
            self._m.commit.ticket()

    def reap(self) -> None:
        """Give up on agents silent or gone for longer than the window, and their runs."""
        with self._m.lock:
            effects = agent_life.reap(
                self._m.fleet.clocks(),
                list(self._m.runs.values()),
                now=time.monotonic(),
                wall=time.time(),
                wait_s=self._m.config.agent_reconnect_wait_s,
                heartbeat_s=self._m.config.heartbeat_interval_s,
            )
            if effects:
                self._m.do(effects)
                self._m.schedule()
                self._m.commit.ticket()

    def set_agent_enabled(self, agent_id: str, enabled: bool) -> None:
        with self._m.lock:
            self._m.fleet.set_enabled(agent_id, enabled)
            self._m.schedule()  # disabled: what waits may now never fit, and says so
            self._m.commit_and_wait()

    def allocation_running(self, agent_id: str, allocation_id: str) -> None:
        """An agent started its part of an allocation (not waited for)."""
        with self._m.lock:
            self._m.fleet.heard_from(agent_id)
            if allocation_id in self._m.runs:
                self._m.batch.set_allocation(allocation_id, state="RUNNING")
                self._m.commit.ticket()

    def allocation_exited(
        self, agent_id: str, allocation_id: str, exit_codes: Sequence[int], message: str = ""
    ) -> None:
        """An agent's part of an allocation ended with these exit codes, one per rank (none:
        its processes could not start). Not waited for: the agent needs no answer."""
        with self._m.lock:
            self._m.fleet.heard_from(agent_id)
            run = self._m.runs.get(allocation_id)
            if run is None:
                return
            run.exit_codes[agent_id] = list(exit_codes)
            if message:
                run.messages.append(mask_secrets(f"{agent_id}: {message}"))
            failed = not exit_codes or any(c != 0 for c in exit_codes)
            if failed and run.stopping is None:
                # One part of the gang is gone: the other ranks cannot go on without it.
                self._m.fleet.kill(run, graceful=False)
            if run.over:
                self._m.finish_run(run)
                self._m.schedule()
            self._m.commit.ticket()

    def ship_logs(self, allocation_id: str, lines: Sequence[LogLine]) -> None:
        """Store an allocation's log lines (secrets masked); lines of no running
        allocation are dropped."""
        run = self._m.runs.get(allocation_id)
        if run is None:
            return
        masked = [replace(line, message=mask_secrets(line.message)) for line in lines]
        self._m.store.append_logs(run.trial_id, run.run_id, masked)

    def cluster_view(self) -> ClusterView:
        """A copy of the agents and the queue for the read-only RPCs."""
        with self._m.lock:
            queue = sorted(self._m.queued.values(), key=lambda r: r.rank)
            return _agents.cluster_view(
                self._m.cluster_id,
                self._m.fleet.slot_type(),
                self._m.fleet.agents.values(),
                self._m.scheduler.allocations,
                self._m.run_of_trial,
                [(r, self._m.trials[int(r.id)]) for r in queue],
                {e.id: e.config.name for e in self._m.experiments.values()},
                self._m.unplaceable,
            )

    def close_streams(self) -> None:
        """Close every agent's stream (the master is stopping)."""
        with self._m.lock:
            self._m.fleet.close_streams()


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


__all__ = ["AgentCalls"]
