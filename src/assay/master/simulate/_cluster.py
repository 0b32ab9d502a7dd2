"""The fake cluster: agents that join, disconnect, die and come back, and the processes
of their allocations, played through `MasterAdapter` as the real agent and harness call
the master. What an agent receives is checked as it lands (`check_start`,
`check_restore`)."""

from __future__ import annotations

import json
import random
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from assay.common.storage import trial_storage
from assay.config import parse_config
from assay.errors import PREEMPTED_EXIT_CODE
from assay.master.errors import PermissionDeniedError, StaleRunError
from assay.master.fleet import AgentHandle
from assay.master.lifecycle import KillRun, StartRun
from assay.master.simulate._adapter import MasterAdapter, Outbox
from assay.master.simulate._snapshot import InvariantError
from assay.master.store import CheckpointRecord, MetricReport


@dataclass
class Process:
    """The processes of one allocation, as its rank 0 plays them."""

    allocation_id: str
    trial_id: int
    run_id: int
    experiment_id: int
    token: str
    storage: Any  # the experiment's checkpoint storage config
    root: str
    metric: str
    parts: dict[str, tuple[int, ...]] = field(default_factory=dict)  # agent -> its slots
    chief: str | None = None  # the agent of rank 0 while it runs
    phase: Literal["ask", "train", "validate", "complete"] = "ask"  # its next call
    total: int = 0
    target: int = 0
    sigterm: bool = False  # asked to stop at a checkpoint
    last_checkpoint: int = -1


@dataclass
class FakeAgent:
    id: str
    slot_type: str
    slots: int
    alive: bool = True
    handle: AgentHandle | None = None  # the master's, while the master sees it connected
    outbox: Outbox | None = None
    parts: dict[str, tuple[int, ...]] = field(default_factory=dict)  # allocation -> slots
    killed: set[str] = field(default_factory=set)  # allocations the master told it to kill
    # exits queued: codes, message, failure
    unreported: dict[str, tuple[list[int], str, str]] = field(default_factory=dict)


def check_start(agent: FakeAgent, start: StartRun) -> list[str]:
    """The allocations whose processes must go before `start` lands on `agent`: those the
    master told the agent to kill (the agent waits out their grace). Slots still used by
    processes nobody stopped were given twice."""
    outside = [slot for slot in start.slots if not 0 <= slot < agent.slots]
    if outside:
        raise InvariantError(f"{start.allocation_id} starts on slots {outside} of {agent.id}")
    killed = []
    for allocation_id, slots in agent.parts.items():
        busy = sorted(set(slots) & set(start.slots))
        if not busy:
            continue
        if allocation_id not in agent.killed:
            raise InvariantError(
                f"slots {busy} of {agent.id} are given to {start.allocation_id} (trial "
                f"{start.trial_id} run {start.run_id}) while {allocation_id} still runs there "
                "and was never killed"
            )
        killed.append(allocation_id)
    return killed


def check_restore(
    trial_id: int, uuid: str, newest: str | None, checkpoints: Mapping[str, tuple[int, int]]
) -> None:
    """A run of `trial_id` starts from checkpoint `uuid` ("": from scratch); it must be the
    trial's newest accepted one (`newest`; `checkpoints`: uuid -> trial, batches)."""
    if uuid == (newest or ""):
        return
    owner, batches = checkpoints[uuid] if uuid else (trial_id, 0)
    had = f"batch {checkpoints[newest][1]}" if newest else "none"
    raise InvariantError(
        f"a run of trial {trial_id} starts from checkpoint {uuid or 'none'} (trial "
        f"{owner}, batch {batches}); the trial's newest: {had}"
    )


class Cluster:
    """The agents and the processes they run, as the master sees them through its calls;
    each public method is one thing the cluster does, chosen by the simulation."""

    max_agents = 5

    def __init__(self, rng: random.Random, adapter: MasterAdapter, events: Counter[str]) -> None:
        self.rng = rng
        self.adapter = adapter
        self.events = events  # the simulation's count of what happened
        self.agents: dict[str, FakeAgent] = {}
        self.processes: dict[str, Process] = {}
        self.checkpoints: dict[str, tuple[int, int]] = {}  # uuid -> (trial, batches)
        self.newest: dict[int, str] = {}  # trial -> its newest checkpoint (by batches)
        self.storages: dict[int, Any] = {}

    def master_restarted(self) -> None:
        """Every agent's stream ended with the old master: they must register again."""
        for agent in self.agents.values():
            agent.handle, agent.outbox = None, None

    def chiefs(self) -> list[Process]:
        return [p for p in self.processes.values() if p.chief is not None]

    def parts(self) -> list[tuple[FakeAgent, str]]:
        return [(a, alloc) for a in self.agents.values() if a.alive for alloc in a.parts]

    # --- agents -------------------------------------------------------------------------

    def join(self) -> None:
        away = [a for a in self.agents.values() if a.handle is None]
        if away and (len(self.agents) >= self.max_agents or self.rng.random() < 0.8):
            agent = self.rng.choice(away)
        else:
            n = len(self.agents)
            slots = 2 if n == 0 else self.rng.randint(1, 4)
            cuda = n > 0 and self.rng.random() < 0.15
            agent = FakeAgent(f"agent-{n}", "cuda" if cuda else "cpu", slots)
            self.agents[agent.id] = agent
        self.register(agent)

    def register(self, agent: FakeAgent) -> None:
        if not agent.alive:  # it restarted: whatever it ran died with it
            agent.alive, agent.parts, agent.killed, agent.unreported = True, {}, set(), {}
        outbox = Outbox()
        running = frozenset(agent.parts) | frozenset(agent.unreported)
        agent.handle = self.adapter.register(
            agent.id, agent.slot_type, agent.slots, running, outbox
        )
        agent.outbox = outbox
        for allocation_id, (codes, message, failure) in agent.unreported.items():
            self.adapter.exited(agent.id, allocation_id, codes, message, failure)
        agent.unreported.clear()

    def disconnect(self, agent: FakeAgent) -> None:
        """The stream breaks; the agent's processes run on."""
        assert agent.handle is not None
        handle, agent.handle, agent.outbox = agent.handle, None, None
        self.adapter.disconnected(agent.id, handle)

    def die(self, agent: FakeAgent) -> None:
        """The agent's machine goes down with its processes; nobody tells the master."""
        agent.alive, agent.outbox = False, None
        for allocation_id in list(agent.parts):
            self._drop_part(agent, allocation_id)
        agent.unreported.clear()

    def notice(self, agent: FakeAgent) -> None:
        """The master sees the dead agent's stream end."""
        assert agent.handle is not None
        handle, agent.handle = agent.handle, None
        self.adapter.disconnected(agent.id, handle)

    def agent_stop(self, agent: FakeAgent) -> None:
        """The agent shuts down: its processes stop at a checkpoint (preempted), then it
        leaves."""
        for allocation_id in list(agent.parts):
            process = self.processes[allocation_id]
            if process.chief == agent.id:
                try:
                    self._checkpoint(process)
                except (PermissionDeniedError, StaleRunError) as e:
                    self._refused(process, e)
            self.part_exit(agent, allocation_id, PREEMPTED_EXIT_CODE)
        self.disconnect(agent)

    def deliver(self, agent: FakeAgent) -> None:
        """The agent reads everything its stream holds."""
        assert agent.outbox is not None
        messages, agent.outbox.messages = agent.outbox.messages, []
        for message in messages:
            if message is None:  # the master closed the stream
                agent.handle, agent.outbox = None, None
                return
            if isinstance(message, StartRun):
                self._start(agent, message)
            else:
                self._kill(agent, message)

    def _start(self, agent: FakeAgent, start: StartRun) -> None:
        if start.allocation_id in agent.parts:  # re-sent: it runs
            self.adapter.running(agent.id, start.allocation_id)
            return
        for allocation_id in check_start(agent, start):
            self.part_exit(agent, allocation_id, -9)  # it goes within the grace
        process = self.processes.get(start.allocation_id)
        if process is None:
            process = self.processes[start.allocation_id] = self._process(start)
        process.parts[agent.id] = start.slots
        agent.parts[start.allocation_id] = start.slots
        if 0 in start.ranks:
            process.chief = agent.id
            self._restore(process, start.checkpoint_uuid)
        self.adapter.running(agent.id, start.allocation_id)

    def _process(self, start: StartRun) -> Process:
        storage = self.storages.get(start.experiment_id)
        if storage is None:
            config = parse_config(json.loads(start.config_json))
            storage = self.storages[start.experiment_id] = config.checkpoint_storage
        metric = json.loads(start.config_json)["searcher"]["metric"]
        return Process(
            start.allocation_id,
            start.trial_id,
            start.run_id,
            start.experiment_id,
            start.token,
            storage,
            start.checkpoint_root,
            metric,
        )

    def _restore(self, process: Process, uuid_: str) -> None:
        check_restore(process.trial_id, uuid_, self.newest.get(process.trial_id), self.checkpoints)
        batches = self.checkpoints[uuid_][1] if uuid_ else 0
        process.total = process.last_checkpoint = batches

    def _kill(self, agent: FakeAgent, kill: KillRun) -> None:
        if kill.allocation_id not in agent.parts:
            self.adapter.exited(agent.id, kill.allocation_id, [], "not running on this agent")
            return
        agent.killed.add(kill.allocation_id)
        if kill.graceful:
            self.processes[kill.allocation_id].sigterm = True
        else:
            self.part_exit(agent, kill.allocation_id, -9)

    # --- processes ----------------------------------------------------------------------

    def part_exit(self, agent: FakeAgent, allocation_id: str, code: int) -> None:
        """One agent's part of an allocation ends with `code` on every rank."""
        slots = self._drop_part(agent, allocation_id)
        codes = [code] * len(slots)
        message = "" if code in (0, PREEMPTED_EXIT_CODE) else f"exited with code {code}"
        # A crash says the same every time: one that repeats without progress ends its
        # trial (`Outcome.REPEATED`) before its restarts run out.
        failure = f"{message}: RuntimeError: simulated crash" if code == 1 else ""
        if agent.handle is not None and agent.alive:
            self.adapter.exited(agent.id, allocation_id, codes, message, failure)
        else:
            agent.unreported[allocation_id] = (codes, message, failure)

    def _drop_part(self, agent: FakeAgent, allocation_id: str) -> tuple[int, ...]:
        slots = agent.parts.pop(allocation_id)
        agent.killed.discard(allocation_id)
        process = self.processes[allocation_id]
        del process.parts[agent.id]
        if process.chief == agent.id:
            process.chief = None
        if not process.parts:
            del self.processes[allocation_id]
        return slots

    def exit_all(self, process: Process, code: int) -> None:
        """Rank 0 ends the gang: every part exits with `code`."""
        for agent_id in list(process.parts):
            self.part_exit(self.agents[agent_id], process.allocation_id, code)

    def fail(self, part: tuple[FakeAgent, str]) -> None:
        agent, allocation_id = part
        if self.rng.random() < 0.1:  # its processes could not start at all
            self._drop_part(agent, allocation_id)
            if agent.handle is not None:
                self.adapter.exited(agent.id, allocation_id, [], "cannot start")
            return
        self.part_exit(agent, allocation_id, 1)

    def harness(self, process: Process) -> None:
        """Rank 0 makes its next call to the master."""
        ids = (process.token, process.trial_id, process.run_id)
        adapter = self.adapter
        try:
            if process.sigterm or (process.phase == "train" and adapter.should_preempt(*ids)):
                self._checkpoint(process)
                self.exit_all(process, PREEMPTED_EXIT_CODE)
            elif process.phase == "ask":
                target = adapter.next_operation(*ids, process.total)
                if target is None:
                    self.exit_all(process, 0)
                else:
                    process.target, process.phase = target, "train"
                    if target <= process.total:
                        process.phase = "validate"
            elif process.phase == "train":
                # Mostly to the target in one report; sometimes part of the way.
                if self.rng.random() < 0.3:
                    process.total = self.rng.randint(process.total + 1, process.target)
                else:
                    process.total = process.target
                values = {"loss": 1.0 / process.total}
                adapter.report_metrics(*ids, "training", MetricReport(process.total, values))
                if self.rng.random() < 0.1:  # a script's own estimate
                    adapter.report_progress(*ids, min(1.0, process.total / 32))
                if process.total >= process.target:
                    process.phase = "validate"
            elif process.phase == "validate":
                values = {process.metric: self._metric(process)}
                adapter.report_metrics(*ids, "validation", MetricReport(process.total, values))
                self._checkpoint(process)
                adapter.best_validation(*ids)  # as a user's early stopping would ask
                process.phase = "complete"
            else:
                # Now and then the trial's code asks to stop here (set_stop_requested).
                stop = self.rng.random() < 0.05
                adapter.complete_operation(*ids, process.total, self._metric(process), stop=stop)
                process.phase = "ask"
        except (PermissionDeniedError, StaleRunError) as e:
            self._refused(process, e)
            self.exit_all(process, 1)  # the process gives up

    def _refused(self, process: Process, error: Exception) -> None:
        """A call of `process` was refused: only right if the master gave its run up (a
        restart, a lost agent)."""
        runs = self.adapter.snapshot().runs.values()
        if any(r.allocation_id == process.allocation_id for r in runs):
            raise InvariantError(f"a call of {process.allocation_id}, which runs, failed: {error}")
        self.events["harness-refused"] += 1

    def _metric(self, process: Process) -> float:
        return round(1.0 / (1 + process.total) + (process.trial_id % 7) / 10, 6)

    def _checkpoint(self, process: Process) -> None:
        if process.total <= process.last_checkpoint:
            return
        name = str(uuid.UUID(int=self.rng.getrandbits(128), version=4))
        location = trial_storage(process.storage, process.root).location(name)
        record = CheckpointRecord(
            uuid=name,
            trial_id=process.trial_id,
            run_id=process.run_id,
            total_batches=process.total,
            state="COMPLETED",
            location=location,
            files={"model.pt": 64},
            user_metadata={"validation_metrics": {process.metric: self._metric(process)}},
        )
        self.adapter.report_checkpoint(process.token, process.trial_id, process.run_id, record)
        process.last_checkpoint = process.total
        trial_id, total = process.trial_id, process.total
        self.checkpoints[name] = (trial_id, total)
        newest = self.newest.get(trial_id)
        if newest is None or total >= self.checkpoints[newest][1]:
            self.newest[trial_id] = name

    # --- users --------------------------------------------------------------------------
