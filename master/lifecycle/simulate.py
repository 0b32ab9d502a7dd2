"""A seeded fake cluster around a real `Master`: agents, trial processes, users and
restarts played at random, with the master's invariants checked after every step.

`simulate(seed, events)` builds a `Master` on a SQLite store in a temporary directory (no
gRPC, no processes, no clock) and plays `events` steps chosen by `random.Random(seed)`:
agents join, disconnect, die silently and come back with what they still run; trial
processes ask for work, report metrics and checkpoints, complete operations, fail, exit
with an invalid-hyperparameters or a preempted code, and obey kills; users create
experiments (single, grid, random, asha, adaptive_asha), pause, activate, cancel and kill
them, and disable agents; the master is restarted on its store. A drain phase then lets
every run finish and requires every experiment to end.

After each step the master's state is taken as a plain `Snapshot` and checked (no slot is
held twice, states move along the allowed edges, the queue holds only queued trials of
active experiments, a RUNNING trial has a run); a fake agent also checks that a start
never lands on slots its processes still use, and a restarted master must rebuild what the
old one held. A breach raises `InvariantError` naming the seed and the step, so
`simulate(seed, events)` replays it. Every call into the master goes through
`MasterAdapter`; nothing else here touches `Master`.

The reconnect window is 0 (a lost agent's runs are given up at once) or endless (they
wait until the agent is back), chosen by the seed: either way nothing waits on a clock.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import logging
import random
import tarfile
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import yaml

from assay.common.storage import checkpoint_location
from assay.config import parse_config
from assay.errors import INVALID_HP_EXIT_CODE, PREEMPTED_EXIT_CODE
from assay.master._agents import AgentHandle, Device, KillRun, Load, Registration, StartRun
from assay.master._config import MasterConfig
from assay.master._core import Master
from assay.master.errors import ConflictError, PermissionDeniedError, StaleRunError
from assay.master.lifecycle import EXPERIMENT_EDGES as LIFECYCLE_EXPERIMENT_EDGES
from assay.master.lifecycle import TERMINAL_TRIAL
from assay.master.lifecycle import TRIAL_EDGES as LIFECYCLE_TRIAL_EDGES
from assay.master.lifecycle import effects as fx
from assay.master.store import CheckpointRecord, MetricReport, Store

Placement = tuple[tuple[str, tuple[int, ...]], ...]

# --- the states and their moves -----------------------------------------------------------

NEW = "NEW"  # before the trial or experiment exists
TERMINAL = frozenset(str(s) for s in TERMINAL_TRIAL)
# Each move the master writes: the lifecycle's edges, where a trial or experiment starts,
# and a state written again unchanged.
TRIAL_EDGES: Mapping[str, frozenset[str]] = {
    NEW: frozenset({"QUEUED", "PAUSED"}),
    **{str(k): frozenset(str(s) for s in {k, *v}) for k, v in LIFECYCLE_TRIAL_EDGES.items()},
}
EXPERIMENT_EDGES: Mapping[str, frozenset[str]] = {
    NEW: frozenset({"ACTIVE", "PAUSED"}),
    **{str(k): frozenset(str(s) for s in {k, *v}) for k, v in LIFECYCLE_EXPERIMENT_EDGES.items()},
}
_ACTIONS: Mapping[str, frozenset[str]] = {
    "pause": frozenset({"ACTIVE"}),
    "activate": frozenset({"PAUSED"}),
    "cancel": frozenset({"ACTIVE", "PAUSED"}),
    "kill": frozenset({"ACTIVE", "PAUSED", "STOPPING_CANCELED", "STOPPING_KILLED"}),
}


def step_moves(
    edges: Mapping[str, frozenset[str]], passing: frozenset[str]
) -> dict[str, frozenset[str]]:
    """The states one step may lead to from each state: itself, an edge, or a chain of
    edges whose intermediate states are all in `passing`."""
    moves: dict[str, frozenset[str]] = {}
    for start in edges:
        reached, frontier = {start}, [start]
        while frontier:
            state = frontier.pop()
            for nxt in edges[state]:
                if nxt not in reached:
                    reached.add(nxt)
                    if nxt in passing:
                        frontier.append(nxt)
        moves[start] = frozenset(reached)
    return moves


# Where one step may lead, seen from outside: one call makes any number of moves (a trial
# requeued, placed and preempted at once), through states that are not over.
TRIAL_MOVES = step_moves(TRIAL_EDGES, frozenset(TRIAL_EDGES) - TERMINAL - {NEW})
EXPERIMENT_MOVES = step_moves(EXPERIMENT_EDGES, frozenset(EXPERIMENT_EDGES) - TERMINAL - {NEW})


class InvariantError(AssertionError):
    """The master broke an invariant; the message names the seed and step that did it."""


# Breaches the simulation recognises and counts in `Stats.known` instead of failing, each
# reproduced by a strict xfail test in tests/lifecycle/test_master_bugs.py: delete the
# entry with the fix, and the simulation enforces the invariant again.
KNOWN_BUGS: Mapping[str, str] = {
    "restore-shadowed": (
        "a run started from scratch keeps the batch count of the run before it, so the "
        "checkpoints it writes below that count are never restored"
    ),
    "zombie-part": (
        "an agent that comes back running its part of a gang the master gave up on (the "
        "agent was lost while the gang's other parts ran on) is not told to kill it, and "
        "its slots are given to the next trial while that part still runs"
    ),
    "preempt-forgotten": (
        "a master restarted while a run is being preempted forgets the preemption: the run "
        "goes on (until the next scheduling pass picks it again) while its trial says "
        "STOPPING"
    ),
    "closed-paused": (
        "a trial the searcher closes while its experiment's pause lands (it exits at a "
        "checkpoint) stays PAUSED for good, and its experiment never ends"
    ),
}


# --- the master's state as plain data, and the checks on it -------------------------------


@dataclass(frozen=True)
class TrialView:
    experiment_id: int
    state: str
    run_id: int
    restarts: int
    total_batches: int
    best_validation: float | None
    target: int | None
    closed: bool
    checkpoint: str | None  # the uuid its next run restores


@dataclass(frozen=True)
class ExperimentView:
    state: str
    progress: float
    shutdown: bool
    search: str  # the searcher's snapshot as JSON ("" unless asked for)
    trials: tuple[int, ...]
    max_restarts: int


@dataclass(frozen=True)
class RunView:
    allocation_id: str
    run_id: int
    placement: Placement
    gone: frozenset[str]  # agents whose part is over (reported, or given up on)
    awaiting: frozenset[str]  # agents a restarted master waits to confirm their part
    stopping: str | None


@dataclass(frozen=True)
class Snapshot:
    """What the master holds in memory, taken under its lock between two steps."""

    experiments: Mapping[int, ExperimentView]
    trials: Mapping[int, TrialView]
    runs: Mapping[int, RunView]  # by trial id
    queue: frozenset[int]  # trial ids
    allocations: Mapping[int, Placement]  # the scheduler's, by trial id
    agents: Mapping[str, int]  # the scheduler's agents and their slot counts


def check_slots(s: Snapshot) -> None:
    """No slot is given twice, and the scheduler holds exactly what the runs use."""
    owner: dict[tuple[str, int], int] = {}
    for trial_id, placement in s.allocations.items():
        for agent_id, slots in placement:
            size = s.agents.get(agent_id)
            if size is None:
                raise InvariantError(f"trial {trial_id} holds slots of unknown agent {agent_id}")
            for slot in slots:
                if not 0 <= slot < size:
                    raise InvariantError(f"trial {trial_id} holds slot {slot} of {agent_id}")
                if (agent_id, slot) in owner:
                    raise InvariantError(
                        f"slot {agent_id}/{slot} is given to trials {owner[agent_id, slot]} "
                        f"and {trial_id}"
                    )
                owner[agent_id, slot] = trial_id
        if trial_id not in s.runs:
            raise InvariantError(
                f"the scheduler holds slots for trial {trial_id}, which has no run"
            )
    for trial_id, run in s.runs.items():
        for agent_id, slots in run.placement:
            if agent_id in run.gone or agent_id in run.awaiting:
                continue
            for slot in slots:
                if owner.get((agent_id, slot)) != trial_id:
                    raise InvariantError(
                        f"run {run.allocation_id} of trial {trial_id} uses slot {agent_id}/{slot},"
                        f" which the scheduler gives to {owner.get((agent_id, slot))}"
                    )


def check_queue(s: Snapshot) -> None:
    """The queue holds exactly the QUEUED trials, all of active experiments."""
    for trial_id in s.queue:
        trial = s.trials.get(trial_id)
        if trial is None:
            raise InvariantError(f"queued trial {trial_id} is not a trial of a live experiment")
        experiment = s.experiments[trial.experiment_id].state
        if trial.state != "QUEUED" or experiment != "ACTIVE" or trial_id in s.runs:
            raise InvariantError(
                f"queued trial {trial_id} is {trial.state} (experiment {experiment}"
                f"{', with a run' if trial_id in s.runs else ''})"
            )
    for trial_id, trial in s.trials.items():
        if trial.state == "QUEUED" and trial_id not in s.queue:
            raise InvariantError(f"trial {trial_id} is QUEUED but not in the queue")


def check_runs(s: Snapshot) -> None:
    """A trial has a run exactly when it is RUNNING or STOPPING; live experiments are
    not over."""
    for trial_id, trial in s.trials.items():
        running = trial.state in ("RUNNING", "STOPPING")
        if running != (trial_id in s.runs):
            has = "has" if trial_id in s.runs else "has no"
            raise InvariantError(f"trial {trial_id} is {trial.state} and {has} run")
        experiment = s.experiments.get(trial.experiment_id)
        if experiment is None or trial_id not in experiment.trials:
            raise InvariantError(f"trial {trial_id} belongs to no live experiment")
        if trial.restarts > experiment.max_restarts:
            raise InvariantError(
                f"trial {trial_id} restarted {trial.restarts} times; its experiment allows "
                f"{experiment.max_restarts}"
            )
    for trial_id in s.runs:
        if trial_id not in s.trials:
            raise InvariantError(f"a run of trial {trial_id}, which is not live")
    for experiment_id, experiment in s.experiments.items():
        if experiment.state in TERMINAL:
            raise InvariantError(f"experiment {experiment_id} is {experiment.state} yet live")
        trials = [s.trials[t] for t in experiment.trials]
        over = all(t.state in TERMINAL for t in trials)
        if over and experiment.state != "PAUSED" and (experiment.shutdown or trials):
            raise InvariantError(
                f"experiment {experiment_id} is {experiment.state} with every trial ended"
            )


# Trial invariants some KNOWN_BUGS break: what each says of the trials that break it.
_TRIAL_RULES = {
    "closed-paused": "are PAUSED after their searcher closed them: nothing will end them",
    "preempt-forgotten": "are STOPPING but their runs were not stopped",
}


def trial_breaches(s: Snapshot) -> dict[str, list[int]]:
    """The trials that break each rule of `_TRIAL_RULES`."""
    stopping = [
        trial_id
        for trial_id, t in s.trials.items()
        if t.state == "STOPPING" and trial_id in s.runs and s.runs[trial_id].stopping is None
    ]
    closed = [trial_id for trial_id, t in s.trials.items() if t.closed and t.state == "PAUSED"]
    return {"closed-paused": closed, "preempt-forgotten": stopping}


def check_progress(old: Snapshot, new: Snapshot) -> None:
    """What only grows: an experiment's progress, a trial's run number and restarts."""
    for experiment_id, experiment in new.experiments.items():
        was = old.experiments.get(experiment_id)
        if was is not None and experiment.progress < was.progress:
            raise InvariantError(
                f"experiment {experiment_id}'s progress fell from {was.progress} to "
                f"{experiment.progress}"
            )
    for trial_id, trial in new.trials.items():
        before = old.trials.get(trial_id)
        if before is not None and (
            trial.run_id < before.run_id or trial.restarts < before.restarts
        ):
            raise InvariantError(f"trial {trial_id} went back from {before} to {trial}")


def check_snapshot(s: Snapshot, *, tolerate: Collection[str] = ()) -> None:
    """Every check of one snapshot; `tolerate` names KNOWN_BUGS not to raise for."""
    check_slots(s)
    check_queue(s)
    check_runs(s)
    for name, trials in trial_breaches(s).items():
        if trials and name not in tolerate:
            raise InvariantError(f"trials {trials} {_TRIAL_RULES[name]}")


def check_start(
    agent: FakeAgent,
    start: StartRun,
    *,
    abandoned: Collection[str] = (),
    tolerate: Collection[str] = (),
) -> tuple[list[str], list[str]]:
    """The allocations whose processes must go before `start` lands on `agent`: those the
    master told the agent to kill (the agent waits out their grace), and, when
    KNOWN_BUGS["zombie-part"] is tolerated, the `abandoned` ones (parts the master gave
    up on without a kill; they die with their gang). Slots still used by processes
    nobody stopped were given twice."""
    outside = [slot for slot in start.slots if not 0 <= slot < agent.slots]
    if outside:
        raise InvariantError(f"{start.allocation_id} starts on slots {outside} of {agent.id}")
    killed, zombies = [], []
    for allocation_id, slots in agent.parts.items():
        busy = sorted(set(slots) & set(start.slots))
        if not busy:
            continue
        if allocation_id in agent.killed:
            killed.append(allocation_id)
        elif allocation_id in abandoned and "zombie-part" in tolerate:
            zombies.append(allocation_id)
        else:
            raise InvariantError(
                f"slots {busy} of {agent.id} are given to {start.allocation_id} (trial "
                f"{start.trial_id} run {start.run_id}) while {allocation_id} still runs there "
                "and was never killed"
            )
    return killed, zombies


def check_restore(
    trial_id: int,
    uuid: str,
    newest: str | None,
    checkpoints: Mapping[str, tuple[int, int]],
    shadowed: Collection[str],
    *,
    tolerate: Collection[str] = (),
) -> bool:
    """A run of `trial_id` starts from checkpoint `uuid` ("": from scratch); it must be the
    trial's newest accepted one (`newest`; `checkpoints`: uuid -> trial, batches). True
    when it is not, in the way of KNOWN_BUGS["restore-shadowed"] and that is tolerated
    (`shadowed`: the checkpoints reported below the trial's batch count)."""
    if uuid == (newest or ""):
        return False
    owner, batches = checkpoints[uuid] if uuid else (trial_id, 0)
    if not (
        "restore-shadowed" in tolerate
        and owner == trial_id
        and newest is not None
        and newest in shadowed
        and batches <= checkpoints[newest][1]
    ):
        had = f"batch {checkpoints[newest][1]}" if newest else "none"
        raise InvariantError(
            f"a run of trial {trial_id} starts from checkpoint {uuid or 'none'} (trial "
            f"{owner}, batch {batches}); the trial's newest: {had}"
        )
    return True


def check_move(
    what: str, key: int, old: str, new: str, moves: Mapping[str, frozenset[str]]
) -> None:
    if new not in moves.get(old, frozenset()):
        raise InvariantError(f"{what} {key} moved from {old} to {new}")


def check_restart(old: Snapshot, new: Snapshot, *, keep_runs: bool) -> None:
    """A master started on the store of `old` holds the same experiments and trials.

    Documented differences (`Master._recover`): a trial that was running keeps its run
    when `keep_runs` (the run awaits its agents), else it is requeued (PAUSED in a paused
    experiment); a stopping experiment's trials without a run end CANCELED, and the
    experiment ends once none is left.
    """
    expected_live: set[int] = set()
    for experiment_id, experiment in old.experiments.items():
        stopping = experiment.state.startswith("STOPPING_")
        states: dict[int, str] = {}
        for trial_id in experiment.trials:
            trial = old.trials[trial_id]
            states[trial_id] = _recovered_state(
                trial, experiment.state, keep_run=keep_runs and trial_id in old.runs
            )
        if not (stopping and all(s in TERMINAL for s in states.values())):
            expected_live.add(experiment_id)
        mine = new.experiments.get(experiment_id)
        if mine is None:
            continue
        if mine != experiment:
            raise InvariantError(f"experiment {experiment_id} was {experiment}, restored {mine}")
        for trial_id, state in states.items():
            was = old.trials[trial_id]
            now, wanted = new.trials.get(trial_id), replace(was, state=state)
            if now is not None and (state in TERMINAL or stopping):
                # The stored search keeps no target or closed mark up to date once a trial
                # has ended or its experiment's search is over (it is being stopped).
                now = replace(now, target=was.target, closed=was.closed)
            if now != wanted:
                raise InvariantError(f"trial {trial_id} was {was}, restored {now}")
            if state in ("RUNNING", "STOPPING"):
                run, mine_run = old.runs[trial_id], new.runs.get(trial_id)
                awaiting = frozenset(a for a, _ in run.placement)
                # A preemption under way goes on (once KNOWN_BUGS["preempt-forgotten"] is
                # fixed); the experiment's stop otherwise.
                forgotten = "preempt-forgotten" in KNOWN_BUGS
                stop = _STOP_AFTER_RESTART.get(
                    experiment.state, None if forgotten else run.stopping
                )
                if mine_run != replace(run, gone=frozenset(), awaiting=awaiting, stopping=stop):
                    raise InvariantError(f"run of trial {trial_id} was {run}, restored {mine_run}")
    if set(new.experiments) != expected_live:
        raise InvariantError(
            f"live experiments after the restart: {sorted(new.experiments)}, expected "
            f"{sorted(expected_live)}"
        )
    if new.allocations:
        raise InvariantError(f"a restarted master holds slots before any agent: {new.allocations}")


# The stop a restarted master finishes for a run of an experiment in each state.
_STOP_AFTER_RESTART = {"PAUSED": "pause", "STOPPING_CANCELED": "cancel", "STOPPING_KILLED": "kill"}


def _recovered_state(trial: TrialView, experiment: str, *, keep_run: bool) -> str:
    if trial.state in TERMINAL or keep_run:
        return trial.state
    if experiment.startswith("STOPPING_"):
        return "CANCELED"
    if trial.state == "PAUSED" and (trial.target is None or experiment != "ACTIVE"):
        return "PAUSED"
    return "QUEUED" if experiment == "ACTIVE" else "PAUSED"


# --- every call into the master -----------------------------------------------------------

Move = tuple[str, int, str, str]  # trial | experiment, id, from, to


class WatchedMaster(Master):
    """A `Master` that records every state its lifecycles set, in order (its recovery's
    too): one call may move a trial several times, and each move must be an edge."""

    def __init__(self, config: MasterConfig, store: Store) -> None:
        self.moves: list[Move] = []
        super().__init__(config, store)

    def _apply(self, effect: fx.Effect) -> None:
        if isinstance(effect, fx.SetTrial) and "state" in effect.fields:
            trial = self.trials.get(effect.trial_id)
            if trial is not None:
                self.moves.append(
                    ("trial", trial.id, str(trial.state), str(effect.fields["state"]))
                )
        elif isinstance(effect, fx.SetExperiment) and "state" in effect.fields:
            experiment = self.experiments[effect.experiment_id]
            state = str(effect.fields["state"])
            self.moves.append(("experiment", experiment.id, str(experiment.state), state))
        super()._apply(effect)


class MasterAdapter:
    """The one place that calls `Master` (and reads its memory for `snapshot`)."""

    def __init__(self, directory: Path, *, reconnect_wait_s: float, preemption: bool) -> None:
        self.url = f"sqlite:///{directory / 'assay.db'}"
        self.config = MasterConfig(
            state_dir=directory,
            agent_reconnect_wait_s=reconnect_wait_s,
            heartbeat_interval_s=1e6,  # silence never counts: agents die by a step
            kill_grace_s=1.0,
            preemption=preemption,
        )
        self.store = Store.open(self.url)
        self.master = WatchedMaster(self.config, self.store)
        self.pending = False  # changes recorded that no call has waited for yet

    def restart(self) -> None:
        """Stop this master and start another on the same database, as a new process."""
        self.close()
        self.store = Store.open(self.url)
        self.master = WatchedMaster(self.config, self.store)  # it commits its recovery
        self.pending = False

    def close(self) -> None:
        self.master.close()
        # Checkpoint collection runs on the master's own thread: let it finish with the
        # store it was given (the next master, or the next simulation, has its own).
        self.master._gc.shutdown(wait=True)
        self.store.close()

    def flush(self) -> None:
        """Wait until every change so far is committed and its messages are sent."""
        if self.pending:
            self.master.commit.flush()
            self.pending = False

    def _waited(self) -> None:
        """The last call waited for the commit of everything recorded so far."""
        self.pending = False

    # agents (the calls an agent's stream makes are not waited for: `pending`)
    def register(
        self, agent_id: str, slot_type: str, slots: int, running: frozenset[str], outbox: Any
    ) -> AgentHandle:
        devices = tuple(Device(i, name=slot_type) for i in range(slots))
        kind: Any = slot_type
        registration = Registration(agent_id, kind, devices, "10.0.0.1", 0, running)
        handle = self.master.register_agent(registration, "10.0.0.1", outbox)
        self._waited()
        return handle

    def disconnected(self, agent_id: str, handle: AgentHandle) -> None:
        self.pending = True
        self.master.agent_disconnected(agent_id, handle)

    def heartbeat(self, agent_id: str) -> None:
        self.pending = True
        self.master.heartbeat(agent_id, Load())

    def set_enabled(self, agent_id: str, enabled: bool) -> None:
        self.master.set_agent_enabled(agent_id, enabled)
        self._waited()

    def running(self, agent_id: str, allocation_id: str) -> None:
        self.pending = True
        self.master.allocation_running(agent_id, allocation_id)

    def exited(self, agent_id: str, allocation_id: str, codes: list[int], message: str) -> None:
        self.pending = True
        self.master.allocation_exited(agent_id, allocation_id, codes, message)

    def reap(self) -> None:
        self.pending = True
        self.master.reap()

    # users
    def create(self, config_yaml: str, archive: bytes, *, activate: bool) -> int:
        experiment_id = self.master.create_experiment(config_yaml, archive, activate=activate).id
        self._waited()
        return experiment_id

    def action(self, experiment_id: int, action: str) -> None:
        self.master.experiment_action(experiment_id, action)
        self._waited()

    def final_states(self, experiment_id: int) -> tuple[str, dict[int, str]]:
        """An ended experiment's state and its trials' as stored."""
        state = self.store.get_experiment(experiment_id).state
        return state, {t.id: t.state for t in self.store.list_trials(experiment_id)}

    # a trial's rank 0 (each call carries the allocation's token, as over gRPC)
    def next_operation(self, token: str, trial_id: int, run_id: int, total: int) -> int | None:
        master = self.master
        target = master.next_operation(master.run_for_token(token, trial_id, run_id), total)
        self._waited()
        return target

    def should_preempt(self, token: str, trial_id: int, run_id: int) -> bool:
        return self.master.run_for_token(token, trial_id, run_id).stopping is not None

    def report_metrics(
        self, token: str, trial_id: int, run_id: int, group: str, report: MetricReport
    ) -> None:
        master, self.pending = self.master, True
        master.report_metrics(master.run_for_token(token, trial_id, run_id), group, [report])

    def report_checkpoint(
        self, token: str, trial_id: int, run_id: int, checkpoint: CheckpointRecord
    ) -> None:
        master, self.pending = self.master, True
        master.report_checkpoint(master.run_for_token(token, trial_id, run_id), checkpoint)

    def complete_operation(
        self, token: str, trial_id: int, run_id: int, total: int, metric: float, *, stop: bool
    ) -> None:
        master = self.master
        run = master.run_for_token(token, trial_id, run_id)
        master.complete_operation(run, total, metric, stop_requested=stop)
        self._waited()

    def report_progress(self, token: str, trial_id: int, run_id: int, progress: float) -> None:
        master, self.pending = self.master, True
        master.report_progress(master.run_for_token(token, trial_id, run_id), progress)

    def best_validation(self, token: str, trial_id: int, run_id: int) -> float | None:
        master = self.master
        return master.best_validation(master.run_for_token(token, trial_id, run_id))

    def moves(self) -> list[Move]:
        """The states written since the last call, in order."""
        moves, self.master.moves = self.master.moves, []
        return moves

    def snapshot(self, *, search: bool = False) -> Snapshot:
        """The master's memory as plain data; with the searchers' state if `search`."""
        m = self.master
        with m.lock:
            experiments = {
                e.id: ExperimentView(
                    str(e.state),
                    e.progress,
                    e.shutdown,
                    json.dumps(e.searcher.snapshot(), sort_keys=True) if search else "",
                    tuple(sorted(e.trials)),
                    e.config.max_restarts,
                )
                for e in m.experiments.values()
            }
            trials = {
                t.id: TrialView(
                    t.experiment_id,
                    str(t.state),
                    t.run_id,
                    t.restarts,
                    t.total_batches,
                    t.best_validation,
                    t.target,
                    t.closed,
                    t.checkpoint.uuid if t.checkpoint else None,
                )
                for t in m.trials.values()
            }
            runs = {
                r.trial_id: RunView(
                    r.allocation_id,
                    r.run_id,
                    r.placement,
                    frozenset(r.exit_codes),
                    frozenset(r.awaiting),
                    r.stopping,
                )
                for r in m.runs.values()
            }
            if len(runs) != len(m.runs):
                raise InvariantError("two runs of one trial")
            allocations = {int(k): p for k, p in m.scheduler.allocations.items()}
            agents = {a.id: a.slots for a in m.scheduler.agents}
            return Snapshot(experiments, trials, runs, frozenset(m.queued), allocations, agents)


# --- the fake cluster ---------------------------------------------------------------------


class Outbox:
    """An agent's stream: what the master sent and the agent has not read yet."""

    def __init__(self) -> None:
        self.messages: list[StartRun | KillRun | None] = []

    def put(self, message: StartRun | KillRun | None) -> None:
        self.messages.append(message)


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
    unreported: dict[str, tuple[list[int], str]] = field(default_factory=dict)  # exits queued


@dataclass
class Stats:
    """What one simulation played and how it ended."""

    seed: int
    steps: int = 0
    events: Counter[str] = field(default_factory=Counter)
    trials: Counter[str] = field(default_factory=Counter)  # ended trials by final state
    experiments: Counter[str] = field(default_factory=Counter)  # ended, by final state
    restarts: int = 0
    drain_steps: int = 0
    drain_canceled: int = 0  # experiments the drain had to cancel
    errors: list[str] = field(default_factory=list)  # ERROR lines the master logged
    # Deviations recognised as the master's known bugs (KNOWN_BUGS), by name.
    known: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    @property
    def events_per_second(self) -> float:
        return self.steps / self.seconds if self.seconds else 0.0


@functools.cache
def model_archive() -> bytes:
    """A tiny valid model directory (the master only stores and forwards it)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        data = b"# the Trial lives here\n"
        info = tarfile.TarInfo("model_def.py")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def experiment_config(rng: random.Random) -> dict[str, Any]:
    """A small experiment: one of the searchers, a short length, 1-2 slots per trial."""
    name = rng.choice(["single", "random", "grid", "asha", "adaptive_asha"])
    length = rng.choice([4, 8, 16])
    searcher: dict[str, Any] = {
        "name": name,
        "metric": "loss",
        "smaller_is_better": rng.random() < 0.8,
        "max_length": {"batches": length},
    }
    if name != "single":
        searcher["max_concurrent_trials"] = rng.choice([0, 1, 2])
    if name == "random":
        searcher["max_trials"] = rng.randint(1, 4)
    elif name in ("asha", "adaptive_asha"):
        searcher["max_trials"] = rng.randint(2, 5)
        searcher["max_length"] = {"batches": 16}
        searcher["num_rungs" if name == "asha" else "max_rungs"] = 2
    # A Trial class, or now and then a script (exiting 0 before its target ends it).
    script = rng.random() < 0.2
    return {
        "name": f"sim-{name}",
        "entrypoint": "python3 model_def.py" if script else "model_def:T",
        "hyperparameters": {
            "global_batch_size": 8,
            "lr": {"type": "double", "minval": 0.001, "maxval": 0.1, "count": 2},
            "opt": {"type": "categorical", "vals": ["sgd", "adam"]},
        },
        "searcher": searcher,
        "resources": {
            "slots_per_trial": rng.choice([1, 1, 2]),
            "priority": rng.choice([10, 42, 80]),
        },
        "max_restarts": rng.randint(0, 2),
        "reproducibility": {"experiment_seed": rng.randrange(1000)},
    }


class _ErrorLog(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.lines: list[str] = []
        self.failures: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        line = record.getMessage()
        if record.msg != "trial %d: %s":  # a trial's own log line (its run failed)
            self.lines.append(line)
        if record.exc_info:
            self.failures.append(f"{line}: {record.exc_info[1]!r}")


@contextlib.contextmanager
def _master_errors() -> Iterator[_ErrorLog]:
    """Keep the master's ERROR lines; drop its chatter below them (it costs time)."""
    logger = logging.getLogger("assay.master")
    handler, level = _ErrorLog(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.ERROR)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


class Simulation:
    """A master, its agents and their processes, played one random step at a time."""

    max_agents = 5
    max_experiments = 4

    def __init__(self, seed: int, directory: Path, errors: _ErrorLog) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.window = self.rng.random() < 0.5  # runs of lost agents wait for them
        self.adapter = MasterAdapter(
            directory,
            reconnect_wait_s=1e9 if self.window else 0.0,
            preemption=self.rng.random() < 0.5,
        )
        self.errors = errors
        self.stats = Stats(seed)
        self.agents: dict[str, FakeAgent] = {}
        self.processes: dict[str, Process] = {}
        self.checkpoints: dict[str, tuple[int, int]] = {}  # uuid -> (trial, batches)
        self.newest: dict[int, str] = {}  # trial -> its newest checkpoint (by batches)
        # Only to recognise KNOWN_BUGS["restore-shadowed"]: the trial's batch count as the
        # master keeps it, and the checkpoints reported below it.
        self.high: dict[int, int] = {}
        self.shadowed: set[str] = set()
        self.storages: dict[int, Any] = {}
        self.seen_experiments: dict[int, str] = {}
        self.seen_trials: dict[int, str] = {}
        self.ended: set[int] = set()
        self.breaches: set[tuple[str, int]] = set()  # (KNOWN_BUGS name, trial) seen
        self.step_name = "start"
        self.snapshot = self.adapter.snapshot()

    # --- the loop -----------------------------------------------------------------------

    def run(self, events: int) -> Stats:
        started = time.perf_counter()
        try:
            for _ in range(events):
                self.step(self._random_event())
            self.drain()
        finally:
            self.stats.seconds = time.perf_counter() - started
            self.stats.errors = list(self.errors.lines)
            self.adapter.close()
        return self.stats

    def step(self, event: tuple[str, Callable[[], None]]) -> None:
        name, play = event
        self.stats.steps += 1
        self.stats.events[name] += 1
        self.step_name = name
        try:
            play()
            self.adapter.flush()
            self._observe()
        except InvariantError as e:
            raise InvariantError(f"seed {self.seed}, step {self.stats.steps} ({name}): {e}") from e
        except Exception as e:
            e.add_note(f"simulate(seed={self.seed}): step {self.stats.steps} ({name})")
            raise

    def _observe(self) -> None:
        for kind, key, old, state in self.adapter.moves():
            check_move(kind, key, old, state, TRIAL_EDGES if kind == "trial" else EXPERIMENT_EDGES)
        new = self.adapter.snapshot()
        check_snapshot(new, tolerate=KNOWN_BUGS.keys())
        check_progress(self.snapshot, new)
        for name, trials in trial_breaches(new).items():
            for trial_id in trials:
                if (name, trial_id) not in self.breaches:
                    self.breaches.add((name, trial_id))
                    self.stats.known[name] += 1
        for experiment_id, experiment in new.experiments.items():
            old = self.seen_experiments.get(experiment_id, NEW)
            check_move("experiment", experiment_id, old, experiment.state, EXPERIMENT_MOVES)
            self.seen_experiments[experiment_id] = experiment.state
        for trial_id, trial in new.trials.items():
            old = self.seen_trials.get(trial_id, NEW)
            check_move("trial", trial_id, old, trial.state, TRIAL_MOVES)
            self.seen_trials[trial_id] = trial.state
        for experiment_id in self.seen_experiments.keys() - new.experiments.keys() - self.ended:
            self._ended(experiment_id)
        if self.errors.failures:
            raise InvariantError(f"the master logged a failure: {self.errors.failures[0]}")
        self.snapshot = new

    def _ended(self, experiment_id: int) -> None:
        state, trials = self.adapter.final_states(experiment_id)
        old = self.seen_experiments[experiment_id]
        check_move("experiment", experiment_id, old, state, EXPERIMENT_MOVES)
        if state not in TERMINAL:
            raise InvariantError(f"experiment {experiment_id} left memory {state}")
        for trial_id, trial_state in trials.items():
            check_move(
                "trial", trial_id, self.seen_trials.get(trial_id, NEW), trial_state, TRIAL_MOVES
            )
            if trial_state not in TERMINAL:
                raise InvariantError(
                    f"experiment {experiment_id} ended with trial {trial_id} {trial_state}"
                )
            self.seen_trials[trial_id] = trial_state
            self.stats.trials[trial_state] += 1
        self.seen_experiments[experiment_id] = state
        self.stats.experiments[state] += 1
        self.ended.add(experiment_id)

    def _random_event(self) -> tuple[str, Callable[[], None]]:
        rng = self.rng
        agents = list(self.agents.values())
        connected = [a for a in agents if a.handle is not None and a.alive]
        reading = [a for a in agents if a.alive and a.outbox is not None and a.outbox.messages]
        away = [a for a in agents if a.handle is None]
        dead_unseen = [a for a in agents if not a.alive and a.handle is not None]
        chiefs = self._chiefs()
        parts = self._parts()
        orphans = [p for p in parts if self.processes[p[1]].chief is None]
        live = sorted(self.snapshot.experiments)
        choices: list[tuple[float, str, Callable[[], None]]] = [
            (8.0 if reading else 0.0, "deliver", lambda: self._deliver(rng.choice(reading))),
            (12.0 if chiefs else 0.0, "harness", lambda: self._harness(rng.choice(chiefs))),
            (
                1.0 if orphans else 0.0,
                "orphan-exit",
                lambda: self._part_exit(*rng.choice(orphans), 1),
            ),
            (0.5 if parts else 0.0, "fail", lambda: self._fail(rng.choice(parts))),
            (
                0.2 if chiefs else 0.0,
                "invalid-hp",
                lambda: self._exit_all(rng.choice(chiefs), INVALID_HP_EXIT_CODE),
            ),
            (0.1 if chiefs else 0.0, "exit-early", lambda: self._exit_all(rng.choice(chiefs), 0)),
            (
                0.15 if connected else 0.0,
                "agent-stop",
                lambda: self._agent_stop(rng.choice(connected)),
            ),
            (3.0 * len(away) + (1.0 if len(agents) < self.max_agents else 0.0), "join", self._join),
            (
                0.4 if connected else 0.0,
                "disconnect",
                lambda: self._disconnect(rng.choice(connected)),
            ),
            (0.15 if connected else 0.0, "die", lambda: self._die(rng.choice(connected))),
            (1.5 if dead_unseen else 0.0, "notice", lambda: self._notice(rng.choice(dead_unseen))),
            (1.5 if len(live) < self.max_experiments else 0.1, "create", self._create),
            (0.8 if live else 0.0, "action", lambda: self._action(rng.choice(live))),
            (0.3 if connected else 0.0, "enable", lambda: self._toggle(rng.choice(connected))),
            (0.2, "reap", self.adapter.reap),
            (
                0.2 if connected else 0.0,
                "heartbeat",
                lambda: self.adapter.heartbeat(rng.choice(connected).id),
            ),
            (0.12, "restart", self._restart),
        ]
        total = sum(w for w, _, _ in choices)
        pick = rng.random() * total
        for weight, name, play in choices:
            pick -= weight
            if pick < 0 and weight:
                return name, play
        return "reap", self.adapter.reap

    def _chiefs(self) -> list[Process]:
        return [p for p in self.processes.values() if p.chief is not None]

    def _parts(self) -> list[tuple[FakeAgent, str]]:
        return [(a, alloc) for a in self.agents.values() if a.alive for alloc in a.parts]

    # --- agents -------------------------------------------------------------------------

    def _join(self) -> None:
        away = [a for a in self.agents.values() if a.handle is None]
        if away and (len(self.agents) >= self.max_agents or self.rng.random() < 0.8):
            agent = self.rng.choice(away)
        else:
            n = len(self.agents)
            slots = 2 if n == 0 else self.rng.randint(1, 4)
            cuda = n > 0 and self.rng.random() < 0.15
            agent = FakeAgent(f"agent-{n}", "cuda" if cuda else "cpu", slots)
            self.agents[agent.id] = agent
        self._register(agent)

    def _register(self, agent: FakeAgent) -> None:
        if not agent.alive:  # it restarted: whatever it ran died with it
            agent.alive, agent.parts, agent.killed, agent.unreported = True, {}, set(), {}
        outbox = Outbox()
        running = frozenset(agent.parts) | frozenset(agent.unreported)
        agent.handle = self.adapter.register(
            agent.id, agent.slot_type, agent.slots, running, outbox
        )
        agent.outbox = outbox
        for allocation_id, (codes, message) in agent.unreported.items():
            self.adapter.exited(agent.id, allocation_id, codes, message)
        agent.unreported.clear()

    def _disconnect(self, agent: FakeAgent) -> None:
        """The stream breaks; the agent's processes run on."""
        assert agent.handle is not None
        handle, agent.handle, agent.outbox = agent.handle, None, None
        self.adapter.disconnected(agent.id, handle)

    def _die(self, agent: FakeAgent) -> None:
        """The agent's machine goes down with its processes; nobody tells the master."""
        agent.alive, agent.outbox = False, None
        for allocation_id in list(agent.parts):
            self._drop_part(agent, allocation_id)
        agent.unreported.clear()

    def _notice(self, agent: FakeAgent) -> None:
        """The master sees the dead agent's stream end."""
        assert agent.handle is not None
        handle, agent.handle = agent.handle, None
        self.adapter.disconnected(agent.id, handle)

    def _agent_stop(self, agent: FakeAgent) -> None:
        """The agent shuts down: its processes stop at a checkpoint (preempted), then it
        leaves."""
        for allocation_id in list(agent.parts):
            process = self.processes[allocation_id]
            if process.chief == agent.id:
                try:
                    self._checkpoint(process)
                except (PermissionDeniedError, StaleRunError) as e:
                    self._refused(process, e)
            self._part_exit(agent, allocation_id, PREEMPTED_EXIT_CODE)
        self._disconnect(agent)

    def _toggle(self, agent: FakeAgent) -> None:
        self.adapter.set_enabled(agent.id, self.rng.random() < 0.6)

    def _deliver(self, agent: FakeAgent) -> None:
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
        abandoned = self._abandoned(agent) if agent.parts else set()
        killed, zombies = check_start(agent, start, abandoned=abandoned, tolerate=KNOWN_BUGS)
        for allocation_id in killed:
            self._part_exit(agent, allocation_id, -9)  # it goes within the grace
        for allocation_id in zombies:
            self.stats.known["zombie-part"] += 1
            self._part_exit(agent, allocation_id, 1)  # its gang's other ranks are gone
        process = self.processes.get(start.allocation_id)
        if process is None:
            process = self.processes[start.allocation_id] = self._process(start)
        process.parts[agent.id] = start.slots
        agent.parts[start.allocation_id] = start.slots
        if 0 in start.ranks:
            process.chief = agent.id
            self._restore(process, start.checkpoint_uuid)
        self.adapter.running(agent.id, start.allocation_id)

    def _abandoned(self, agent: FakeAgent) -> set[str]:
        """The allocations `agent` runs that the master has given up on there."""
        runs = {r.allocation_id: r for r in self.adapter.snapshot().runs.values()}
        return {a for a in agent.parts if a not in runs or agent.id in runs[a].gone}

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
        newest = self.newest.get(process.trial_id)
        if check_restore(
            process.trial_id, uuid_, newest, self.checkpoints, self.shadowed, tolerate=KNOWN_BUGS
        ):
            self.stats.known["restore-shadowed"] += 1
        batches = self.checkpoints[uuid_][1] if uuid_ else 0
        if uuid_:
            self.high[process.trial_id] = batches
        process.total = process.last_checkpoint = batches

    def _kill(self, agent: FakeAgent, kill: KillRun) -> None:
        if kill.allocation_id not in agent.parts:
            self.adapter.exited(agent.id, kill.allocation_id, [], "not running on this agent")
            return
        agent.killed.add(kill.allocation_id)
        if kill.graceful:
            self.processes[kill.allocation_id].sigterm = True
        else:
            self._part_exit(agent, kill.allocation_id, -9)

    # --- processes ----------------------------------------------------------------------

    def _part_exit(self, agent: FakeAgent, allocation_id: str, code: int) -> None:
        """One agent's part of an allocation ends with `code` on every rank."""
        slots = self._drop_part(agent, allocation_id)
        codes = [code] * len(slots)
        message = "" if code in (0, PREEMPTED_EXIT_CODE) else f"exited with code {code}"
        if agent.handle is not None and agent.alive:
            self.adapter.exited(agent.id, allocation_id, codes, message)
        else:
            agent.unreported[allocation_id] = (codes, message)

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

    def _exit_all(self, process: Process, code: int) -> None:
        """Rank 0 ends the gang: every part exits with `code`."""
        for agent_id in list(process.parts):
            self._part_exit(self.agents[agent_id], process.allocation_id, code)

    def _fail(self, part: tuple[FakeAgent, str]) -> None:
        agent, allocation_id = part
        if self.rng.random() < 0.1:  # its processes could not start at all
            self._drop_part(agent, allocation_id)
            if agent.handle is not None:
                self.adapter.exited(agent.id, allocation_id, [], "cannot start")
            return
        self._part_exit(agent, allocation_id, 1)

    def _harness(self, process: Process) -> None:
        """Rank 0 makes its next call to the master."""
        ids = (process.token, process.trial_id, process.run_id)
        adapter = self.adapter
        try:
            if process.sigterm or (process.phase == "train" and adapter.should_preempt(*ids)):
                self._checkpoint(process)
                self._exit_all(process, PREEMPTED_EXIT_CODE)
            elif process.phase == "ask":
                target = adapter.next_operation(*ids, process.total)
                if target is None:
                    self._exit_all(process, 0)
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
                self._reported(process)
                if self.rng.random() < 0.1:  # a script's own estimate
                    adapter.report_progress(*ids, min(1.0, process.total / 32))
                if process.total >= process.target:
                    process.phase = "validate"
            elif process.phase == "validate":
                values = {process.metric: self._metric(process)}
                adapter.report_metrics(*ids, "validation", MetricReport(process.total, values))
                self._reported(process)
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
            self._exit_all(process, 1)  # the process gives up

    def _refused(self, process: Process, error: Exception) -> None:
        """A call of `process` was refused: only right if the master gave its run up (a
        restart, a lost agent)."""
        runs = self.adapter.snapshot().runs.values()
        if any(r.allocation_id == process.allocation_id for r in runs):
            raise InvariantError(f"a call of {process.allocation_id}, which runs, failed: {error}")
        self.stats.events["harness-refused"] += 1

    def _reported(self, process: Process) -> None:
        self.high[process.trial_id] = max(self.high.get(process.trial_id, 0), process.total)

    def _metric(self, process: Process) -> float:
        return round(1.0 / (1 + process.total) + (process.trial_id % 7) / 10, 6)

    def _checkpoint(self, process: Process) -> None:
        if process.total <= process.last_checkpoint:
            return
        name = str(uuid.UUID(int=self.rng.getrandbits(128), version=4))
        location = checkpoint_location(process.storage, name, process.root)
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
        if total < self.high.get(trial_id, 0):
            self.shadowed.add(name)
        else:
            self.high[trial_id] = total

    # --- users --------------------------------------------------------------------------

    def _create(self) -> None:
        config = experiment_config(self.rng)
        activate = self.rng.random() < 0.9
        self.adapter.create(yaml.safe_dump(config), model_archive(), activate=activate)

    def _action(self, experiment_id: int) -> None:
        action = self.rng.choice(["pause", "pause", "activate", "activate", "cancel", "kill"])
        state = self.snapshot.experiments[experiment_id].state
        self.step_name = f"{action} {experiment_id}"
        try:
            self.adapter.action(experiment_id, action)
        except ConflictError:
            if state in _ACTIONS[action]:
                raise InvariantError(f"{action} refused for a {state} experiment") from None
            self.stats.events[f"{action}-refused"] += 1
            return
        if state not in _ACTIONS[action]:
            raise InvariantError(f"{action} accepted for a {state} experiment")

    # --- restarts -----------------------------------------------------------------------

    def _restart(self) -> None:
        old = self.adapter.snapshot(search=True)
        self.adapter.restart()
        self.stats.restarts += 1
        for agent in self.agents.values():
            agent.handle, agent.outbox = None, None
        check_restart(old, self.adapter.snapshot(search=True), keep_runs=self.window)

    # --- the end ------------------------------------------------------------------------

    def drain(self, limit: int = 3000, cancel_after: int = 1500) -> None:
        """Bring every agent back and let every run finish; every experiment must end."""
        self.step_name = "drain"
        for agent in self.agents.values():
            if not agent.alive and agent.handle is not None:
                self.step(("drain-notice", functools.partial(self._notice, agent)))
            if agent.handle is None:
                self.step(("drain-join", functools.partial(self._register, agent)))
        if not self.agents:
            self.step(("drain-join", self._join))
        for agent in self.agents.values():
            self.step(("drain-enable", functools.partial(self.adapter.set_enabled, agent.id, True)))
        for experiment_id, experiment in sorted(self.snapshot.experiments.items()):
            if experiment.state == "PAUSED":
                activate = functools.partial(self.adapter.action, experiment_id, "activate")
                self.step(("drain-activate", activate))
        steps = 0
        while self.snapshot.experiments or self.processes or self.snapshot.runs:
            steps += 1
            if steps > limit:
                raise InvariantError(
                    f"seed {self.seed}: the drain did not end after {limit} steps: "
                    f"experiments {dict(self.snapshot.experiments)}, runs "
                    f"{dict(self.snapshot.runs)}, processes {sorted(self.processes)}"
                )
            if steps == cancel_after:
                self._cancel_all()
            event = self._drain_event()
            if event is None:
                self._stalled()
            else:
                self.step(event)
        self.stats.drain_steps = steps

    def _drain_event(self) -> tuple[str, Callable[[], None]] | None:
        """The next thing the cluster does on its own, if anything."""
        rng = self.rng
        reading = [a for a in self.agents.values() if a.outbox is not None and a.outbox.messages]
        if reading and rng.random() < 0.5:
            return "deliver", functools.partial(self._deliver, rng.choice(reading))
        chiefs = self._chiefs()
        if chiefs:
            return "harness", functools.partial(self._harness, rng.choice(chiefs))
        orphans = [p for p in self._parts() if self.processes[p[1]].chief is None]
        if orphans:
            return "orphan-exit", functools.partial(self._part_exit, *rng.choice(orphans), 1)
        if reading:
            return "deliver", functools.partial(self._deliver, rng.choice(reading))
        return None

    def _stalled(self) -> None:
        """Nothing runs and nothing is on its way, yet experiments are live: each must be
        stuck on a known bug (it is canceled), or the master lost track of it."""
        s = self.snapshot
        stuck = set(trial_breaches(s)["closed-paused"]) if "closed-paused" in KNOWN_BUGS else set()
        for experiment_id, experiment in sorted(s.experiments.items()):
            if s.runs or not stuck & set(experiment.trials):
                trials = {t: s.trials[t].state for t in experiment.trials}
                raise InvariantError(
                    f"seed {self.seed}: the cluster is idle, yet experiment {experiment_id} "
                    f"is {experiment.state} with trials {trials}, runs {dict(s.runs)}, queue "
                    f"{sorted(s.queue)}"
                )
        self._cancel_all()

    def _cancel_all(self) -> None:
        for experiment_id, experiment in sorted(self.snapshot.experiments.items()):
            if experiment.state in ("ACTIVE", "PAUSED"):
                self.stats.drain_canceled += 1
                cancel = functools.partial(self.adapter.action, experiment_id, "cancel")
                self.step(("drain-cancel", cancel))


def simulate(seed: int, events: int, *, directory: Path | str | None = None) -> Stats:
    """Play `events` random steps and a drain on a fresh master; `InvariantError` on any
    breach. The database lives in a temporary directory under `directory` (default: the
    system's, /dev/shm when it exists: the store commits once per step)."""
    if directory is None and Path("/dev/shm").is_dir():
        directory = "/dev/shm"
    with (
        tempfile.TemporaryDirectory(prefix="assay-sim-", dir=directory) as tmp,
        _master_errors() as errors,
    ):
        return Simulation(seed, Path(tmp), errors).run(events)
