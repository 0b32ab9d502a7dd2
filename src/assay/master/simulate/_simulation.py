"""The simulation's loop: it picks each step of the cluster, the users and the master's
restarts at random, checks the master after every step, and drains the cluster at the
end."""

from __future__ import annotations

import contextlib
import functools
import logging
import random
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import yaml

from assay.errors import INVALID_HP_EXIT_CODE
from assay.master.errors import ConflictError, InvalidArgumentError
from assay.master.simulate._adapter import MasterAdapter, StoreKind
from assay.master.simulate._checks import (
    check_move,
    check_progress,
    check_restart,
    check_snapshot,
    check_usage_closed,
)
from assay.master.simulate._cluster import Cluster, FakeAgent
from assay.master.simulate._snapshot import (
    CONTINUE_EXPERIMENT_EDGES,
    CONTINUE_EXPERIMENT_MOVES,
    CONTINUE_TRIAL_EDGES,
    CONTINUE_TRIAL_MOVES,
    EXPERIMENT_EDGES,
    EXPERIMENT_MOVES,
    NEW,
    TERMINAL,
    TRIAL_EDGES,
    TRIAL_MOVES,
    InvariantError,
)
from assay.master.simulate._workload import experiment_config, model_archive

# The experiment states each user action applies to.

_ACTIONS: Mapping[str, frozenset[str]] = {
    "pause": frozenset({"ACTIVE"}),
    "activate": frozenset({"PAUSED"}),
    "cancel": frozenset({"ACTIVE", "PAUSED"}),
    "kill": frozenset({"ACTIVE", "PAUSED", "STOPPING_CANCELED", "STOPPING_KILLED"}),
}


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
    errors: list[str] = field(default_factory=list)  # ERROR lines the master logged
    seconds: float = 0.0

    @property
    def events_per_second(self) -> float:
        return self.steps / self.seconds if self.seconds else 0.0


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
    """A master, its cluster and its users, played one random step at a time."""

    max_experiments = 4

    def __init__(
        self, seed: int, directory: Path, errors: _ErrorLog, store: StoreKind = "memory"
    ) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.window = self.rng.random() < 0.5  # runs of lost agents wait for them
        self.adapter = MasterAdapter(
            directory,
            reconnect_wait_s=1e9 if self.window else 0.0,
            preemption=self.rng.random() < 0.5,
            store=store,
        )
        self.errors = errors
        self.stats = Stats(seed)
        self.cluster = Cluster(self.rng, self.adapter, self.stats.events)
        self.seen_experiments: dict[int, str] = {}
        self.seen_trials: dict[int, str] = {}
        self.ended: set[int] = set()
        self.step_name = "start"  # what the step under way does, for its errors
        self.snapshot = self.adapter.snapshot()

    # --- the loop -----------------------------------------------------------------------

    def run(self, events: int) -> Stats:
        started = time.perf_counter()
        try:
            for _ in range(events):
                self.step(self._random_event())
            self.drain()
            check_usage_closed(self.adapter.store.open_usage())
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
            where = f"seed {self.seed}, step {self.stats.steps} ({self.step_name})"
            raise InvariantError(f"{where}: {e}") from e
        except Exception as e:
            e.add_note(f"simulate(seed={self.seed}): step {self.stats.steps} ({self.step_name})")
            raise

    def _observe(self) -> None:
        # Only a continue step may bring an ended experiment and its trial back.
        continuing = self.step_name.startswith("continue ")
        trial_edges = CONTINUE_TRIAL_EDGES if continuing else TRIAL_EDGES
        experiment_edges = CONTINUE_EXPERIMENT_EDGES if continuing else EXPERIMENT_EDGES
        for kind, key, old, state in self.adapter.moves():
            check_move(kind, key, old, state, trial_edges if kind == "trial" else experiment_edges)
        new = self.adapter.snapshot()
        check_snapshot(new)
        check_progress(self.snapshot, new)
        experiment_moves = CONTINUE_EXPERIMENT_MOVES if continuing else EXPERIMENT_MOVES
        trial_moves = CONTINUE_TRIAL_MOVES if continuing else TRIAL_MOVES
        for experiment_id, experiment in new.experiments.items():
            old = self.seen_experiments.get(experiment_id, NEW)
            check_move("experiment", experiment_id, old, experiment.state, experiment_moves)
            self.seen_experiments[experiment_id] = experiment.state
        for trial_id, trial in new.trials.items():
            old = self.seen_trials.get(trial_id, NEW)
            check_move("trial", trial_id, old, trial.state, trial_moves)
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
        cluster = self.cluster
        agents = list(cluster.agents.values())
        connected = [a for a in agents if a.handle is not None and a.alive]
        reading = [a for a in agents if a.alive and a.outbox is not None and a.outbox.messages]
        away = [a for a in agents if a.handle is None]
        dead_unseen = [a for a in agents if not a.alive and a.handle is not None]
        chiefs = cluster.chiefs()
        parts = cluster.parts()
        orphans = [p for p in parts if cluster.processes[p[1]].chief is None]
        live = sorted(self.snapshot.experiments)
        choices: list[tuple[float, str, Callable[[], None]]] = [
            (8.0 if reading else 0.0, "deliver", lambda: cluster.deliver(rng.choice(reading))),
            (12.0 if chiefs else 0.0, "harness", lambda: cluster.harness(rng.choice(chiefs))),
            (
                1.0 if orphans else 0.0,
                "orphan-exit",
                lambda: cluster.part_exit(*rng.choice(orphans), 1),
            ),
            (0.5 if parts else 0.0, "fail", lambda: cluster.fail(rng.choice(parts))),
            (
                0.2 if chiefs else 0.0,
                "invalid-hp",
                lambda: cluster.exit_all(rng.choice(chiefs), INVALID_HP_EXIT_CODE),
            ),
            (0.1 if chiefs else 0.0, "exit-early", lambda: cluster.exit_all(rng.choice(chiefs), 0)),
            (
                0.15 if connected else 0.0,
                "agent-stop",
                lambda: cluster.agent_stop(rng.choice(connected)),
            ),
            (
                3.0 * len(away) + (1.0 if len(agents) < cluster.max_agents else 0.0),
                "join",
                cluster.join,
            ),
            (
                0.4 if connected else 0.0,
                "disconnect",
                lambda: cluster.disconnect(rng.choice(connected)),
            ),
            (0.15 if connected else 0.0, "die", lambda: cluster.die(rng.choice(connected))),
            (
                1.5 if dead_unseen else 0.0,
                "notice",
                lambda: cluster.notice(rng.choice(dead_unseen)),
            ),
            (1.5 if len(live) < self.max_experiments else 0.1, "create", self._create),
            (0.8 if live else 0.0, "action", lambda: self._action(rng.choice(live))),
            (
                0.3 if self.ended else 0.0,
                "continue",
                lambda: self._continue(rng.choice(sorted(self.ended))),
            ),
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

    def _continue(self, experiment_id: int) -> None:
        """Continue an ended experiment 8 batches past its trial's newest checkpoint; it
        must be refused unless that is a `single` search's one trial with a checkpoint."""
        self.step_name = f"continue {experiment_id}"
        at = self.adapter.continuable(experiment_id)
        length = {"searcher": {"max_length": {"batches": (at or 0) + 8}}}
        try:
            self.adapter.continue_(experiment_id, length)
        except (ConflictError, InvalidArgumentError) as e:
            if at is not None:
                raise InvariantError(f"continue refused for experiment {experiment_id}: {e}") from e
            self.stats.events["continue-refused"] += 1
            return
        if at is None:
            raise InvariantError(f"continue accepted for experiment {experiment_id}")
        if self.adapter.snapshot().experiments[experiment_id].state != "ACTIVE":
            raise InvariantError(f"experiment {experiment_id} continued, yet not active")
        self.ended.discard(experiment_id)

    def _toggle(self, agent: FakeAgent) -> None:
        self.adapter.set_enabled(agent.id, self.rng.random() < 0.6)

    # --- restarts -----------------------------------------------------------------------

    def _restart(self) -> None:
        old = self.adapter.snapshot(search=True)
        self.adapter.restart()
        self.stats.restarts += 1
        self.cluster.master_restarted()
        check_restart(old, self.adapter.snapshot(search=True), keep_runs=self.window)

    # --- the end ------------------------------------------------------------------------

    def drain(self, limit: int = 3000) -> None:
        """Bring every agent back and let every run finish: every experiment must end on
        its own, within `limit` steps."""
        cluster = self.cluster
        for agent in cluster.agents.values():
            if not agent.alive and agent.handle is not None:
                self.step(("drain-notice", functools.partial(cluster.notice, agent)))
            if agent.handle is None:
                self.step(("drain-join", functools.partial(cluster.register, agent)))
        if not cluster.agents:
            self.step(("drain-join", cluster.join))
        for agent in cluster.agents.values():
            self.step(("drain-enable", functools.partial(self.adapter.set_enabled, agent.id, True)))
        for experiment_id, experiment in sorted(self.snapshot.experiments.items()):
            if experiment.state == "PAUSED":
                activate = functools.partial(self.adapter.action, experiment_id, "activate")
                self.step(("drain-activate", activate))
        steps = 0
        while self.snapshot.experiments or cluster.processes or self.snapshot.runs:
            steps += 1
            if steps > limit:
                raise InvariantError(
                    f"seed {self.seed}: the drain did not end after {limit} steps: "
                    f"experiments {dict(self.snapshot.experiments)}, runs "
                    f"{dict(self.snapshot.runs)}, processes {sorted(cluster.processes)}"
                )
            event = self._drain_event()
            if event is None:
                self._stalled()
            self.step(event)
        self.stats.drain_steps = steps

    def _drain_event(self) -> tuple[str, Callable[[], None]] | None:
        """The next thing the cluster does on its own, if anything."""
        rng, cluster = self.rng, self.cluster
        agents = cluster.agents.values()
        reading = [a for a in agents if a.outbox is not None and a.outbox.messages]
        if reading and rng.random() < 0.5:
            return "deliver", functools.partial(cluster.deliver, rng.choice(reading))
        chiefs = cluster.chiefs()
        if chiefs:
            return "harness", functools.partial(cluster.harness, rng.choice(chiefs))
        orphans = [p for p in cluster.parts() if cluster.processes[p[1]].chief is None]
        if orphans:
            return "orphan-exit", functools.partial(cluster.part_exit, *rng.choice(orphans), 1)
        if reading:
            return "deliver", functools.partial(cluster.deliver, rng.choice(reading))
        return None

    def _stalled(self) -> NoReturn:
        """Nothing runs and nothing is on its way, yet something is live: the master lost
        track of it."""
        s = self.snapshot
        experiments = {
            e: (x.state, {t: s.trials[t].state for t in x.trials})
            for e, x in sorted(s.experiments.items())
        }
        raise InvariantError(
            f"seed {self.seed}: the cluster is idle, yet experiments (state, trials) are "
            f"{experiments}, runs {dict(s.runs)}, queue {sorted(s.queue)}, processes "
            f"{sorted(self.cluster.processes)}"
        )


def simulate(
    seed: int,
    events: int,
    *,
    directory: Path | str | None = None,
    store: StoreKind = "memory",
) -> Stats:
    """Play `events` random steps and a drain on a fresh master; `InvariantError` on any
    breach. The master's store is in memory, or with `store="sqlite"` a database in a
    temporary directory under `directory` (default: the system's, /dev/shm when it
    exists: the store commits once per step), which also holds the master's files."""
    if directory is None and Path("/dev/shm").is_dir():
        directory = "/dev/shm"
    with (
        tempfile.TemporaryDirectory(prefix="assay-sim-", dir=directory) as tmp,
        _master_errors() as errors,
    ):
        return Simulation(seed, Path(tmp), errors, store).run(events)
