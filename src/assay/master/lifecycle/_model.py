"""The master's live state as plain data: states, their allowed moves, trials, runs."""

from __future__ import annotations

import datetime as dt
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from assay.config import ExperimentConfig
from assay.master.searcher import Searcher


class ExperimentStatus(StrEnum):
    """An experiment's state; the value is what the store and the API say."""

    ACTIVE = "ACTIVE"
    PAUSED = "PAUSED"
    STOPPING_CANCELED = "STOPPING_CANCELED"
    STOPPING_KILLED = "STOPPING_KILLED"
    COMPLETED = "COMPLETED"
    CANCELED = "CANCELED"
    ERROR = "ERROR"


class TrialStatus(StrEnum):
    """A trial's state; the value is what the store and the API say."""

    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    STOPPING = "STOPPING"
    PAUSED = "PAUSED"
    COMPLETED = "COMPLETED"
    CANCELED = "CANCELED"
    ERROR = "ERROR"


E, T = ExperimentStatus, TrialStatus
TERMINAL_EXPERIMENT = frozenset({E.COMPLETED, E.CANCELED, E.ERROR})
TERMINAL_TRIAL = frozenset({T.COMPLETED, T.CANCELED, T.ERROR})
LIVE_EXPERIMENT = (E.ACTIVE, E.PAUSED, E.STOPPING_CANCELED, E.STOPPING_KILLED)

# Every move a state may make (a state may also be written again unchanged). The moves
# out of an ended state are `experiment continue`'s alone (`CONTINUE_EDGES`): nothing
# else brings an ended experiment or trial back.
EXPERIMENT_EDGES: Mapping[ExperimentStatus, frozenset[ExperimentStatus]] = {
    # ACTIVE -> CANCELED: a search whose every trial a user killed (`trial kill`).
    E.ACTIVE: frozenset(
        {E.PAUSED, E.STOPPING_CANCELED, E.STOPPING_KILLED, E.COMPLETED, E.CANCELED, E.ERROR}
    ),
    E.PAUSED: frozenset({E.ACTIVE, E.STOPPING_CANCELED, E.STOPPING_KILLED}),
    E.STOPPING_CANCELED: frozenset({E.STOPPING_KILLED, E.CANCELED}),
    E.STOPPING_KILLED: frozenset({E.CANCELED}),
    E.COMPLETED: frozenset({E.ACTIVE}),
    E.CANCELED: frozenset({E.ACTIVE}),
    E.ERROR: frozenset({E.ACTIVE}),
}
TRIAL_EDGES: Mapping[TrialStatus, frozenset[TrialStatus]] = {
    T.QUEUED: frozenset({T.RUNNING, T.PAUSED, T.COMPLETED, T.CANCELED, T.ERROR}),
    T.RUNNING: frozenset({T.STOPPING, T.QUEUED, T.PAUSED, T.COMPLETED, T.CANCELED, T.ERROR}),
    T.STOPPING: frozenset({T.QUEUED, T.PAUSED, T.COMPLETED, T.CANCELED, T.ERROR}),
    T.PAUSED: frozenset({T.QUEUED, T.COMPLETED, T.CANCELED}),
    T.COMPLETED: frozenset({T.QUEUED}),
    T.CANCELED: frozenset({T.QUEUED}),
    T.ERROR: frozenset({T.QUEUED}),
}
# The edges `experiment continue` adds (every other move out of an ended state is a bug).
CONTINUE_EDGES: frozenset[tuple[str, str]] = frozenset(
    {(str(s), str(E.ACTIVE)) for s in (E.COMPLETED, E.CANCELED, E.ERROR)}
    | {(str(s), str(T.QUEUED)) for s in (T.COMPLETED, T.CANCELED, T.ERROR)}
)

# "kill_trial": a user killed that one trial (`assay trial kill`); the others go on.
StopKind = Literal["pause", "cancel", "kill", "preempt", "kill_trial"]
# The stop a restarted master finishes for a run of an experiment in each state.
# What the store's `allocations.stopping` holds for a run the master told "no more" (its
# trial reached its target; its processes may exit 0) while no stop was under way: a
# restarted master knows that run's exit 0 for a finished step, not a failure.
RELEASED = "released"

STOP_OF_EXPERIMENT: Mapping[ExperimentStatus, StopKind] = {
    E.PAUSED: "pause",
    E.STOPPING_CANCELED: "cancel",
    E.STOPPING_KILLED: "kill",
}


@dataclass(frozen=True)
class Restore:
    """The checkpoint a trial's next run starts from."""

    uuid: str
    total_batches: int
    location: str
    # Each of its files' sha256 as its trial reported them (empty: the record has none),
    # which the harness verifies the files against before it loads any.
    sha256: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Failure:
    """How a failed run ended (the agent's word for its first rank to fail: its exit and
    last line) and where its trial stood then: a run that fails as the one before it did,
    with no batch or checkpoint gained between, would fail so every time."""

    error: str  # "exited with code 1: FileNotFoundError: [Errno 2] ... 'data.csv'"
    total_batches: int
    checkpoint: str | None  # the uuid of the trial's latest checkpoint
    run_id: int = 0

    def repeats(self, before: Failure | None) -> bool:
        """Whether this is `before` again: the same error at the same batch, from the same
        checkpoint."""
        return before is not None and (self.error, self.total_batches, self.checkpoint) == (
            before.error,
            before.total_batches,
            before.checkpoint,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "error": self.error,
            "total_batches": self.total_batches,
            "checkpoint": self.checkpoint,
            "run_id": self.run_id,
        }

    @classmethod
    def from_json(cls, data: Any) -> Failure | None:
        """The failure a search state recorded (None: none, or a shape not understood)."""
        if not isinstance(data, Mapping) or not isinstance(data.get("error"), str):
            return None
        checkpoint = data.get("checkpoint")
        return cls(
            data["error"],
            int(data.get("total_batches") or 0),
            checkpoint if isinstance(checkpoint, str) else None,
            int(data.get("run_id") or 0),
        )


@dataclass
class TrialState:
    id: int
    experiment_id: int
    request_id: str
    hparams: Mapping[str, Any]
    seed: int
    state: TrialStatus
    run_id: int = 0
    restarts: int = 0
    total_batches: int = 0
    best_validation: float | None = None
    checkpoint: Restore | None = None
    start_time: dt.datetime | None = None
    target: int | None = None  # batches of the searcher's outstanding ValidateAfter
    closed: bool = False  # the searcher closed it: it stops for good at its next question
    last_error: str | None = None  # why its last run failed
    order: int = 0  # its place in the queue, kept when it is requeued (0: not queued yet)
    # Some checkpoint of it was recorded (so its end may leave some to collect).
    checkpointed: bool = False
    # Lineage (pbt's exploit): the trial whose checkpoint it started from, and the round of
    # the search that created it.
    parent_id: int | None = None
    search_round: int = 0
    # It waits for its parent's run to end, to start from the checkpoint that run leaves.
    awaiting_parent: bool = False
    # How its last failed run failed, to tell a failure that repeats (`Failure.repeats`).
    last_failure: Failure | None = None
    # Agents its runs avoid: a line their ranks wrote matched an `exclude_node` log policy.
    excluded_agents: tuple[str, ...] = ()


# Fields of `TrialState` the store does not keep as columns: the search state holds
# `target`, `closed`, `last_failure` and `excluded_agents`, and the queue order is
# rebuilt at start-up.
MEMORY_ONLY = frozenset(
    {
        "target",
        "closed",
        "order",
        "checkpoint",
        "checkpointed",
        "awaiting_parent",
        "last_failure",
        "excluded_agents",
    }
)


@dataclass
class ExperimentState:
    id: int
    config: ExperimentConfig
    state: ExperimentStatus
    priority: int
    searcher: Searcher
    progress: float = 0.0
    trials: dict[int, TrialState] = field(default_factory=dict)
    by_request: dict[str, TrialState] = field(default_factory=dict)
    shutdown: bool = False  # the searcher has nothing more to run
    # Stored without a searcher state (by an older master): its searcher's first
    # operations are still to be matched to its trials.
    needs_start: bool = False
    owner: str = ""  # the user who submitted it: the user slot quota counts its slots

    def add_trial(self, trial: TrialState) -> None:
        self.trials[trial.id] = trial
        self.by_request[trial.request_id] = trial

    @functools.cached_property
    def config_json(self) -> str:
        """The config as every run's start message carries it (the config never changes)."""
        return json.dumps(dict(self.config.raw))

    def search_state(self) -> dict[str, Any]:
        """What the store keeps of the search: the searcher and the master's side of it."""
        return {
            "searcher": self.searcher.snapshot(),
            "shutdown": self.shutdown,
            "trials": {t.request_id: _mark(t) for t in self.trials.values()},
        }


def _mark(trial: TrialState) -> dict[str, Any]:
    """What the search state keeps of a trial besides its columns."""
    mark: dict[str, Any] = {"target": trial.target, "closed": trial.closed}
    if trial.last_failure is not None:
        mark["failure"] = trial.last_failure.to_json()
    if trial.excluded_agents:
        mark["excluded_agents"] = list(trial.excluded_agents)
    return mark


Placement = tuple[tuple[str, tuple[int, ...]], ...]


@dataclass
class Run:
    """One allocation: a trial's run on its slots."""

    allocation_id: str
    trial_id: int
    run_id: int
    experiment_id: int
    placement: Placement
    token: str
    exit_codes: dict[str, list[int]] = field(default_factory=dict)
    messages: list[str] = field(default_factory=list)
    stopping: StopKind | None = None
    lost: bool = False  # an agent vanished: not the user's fault
    # Found running by a restarted master: the agents whose part has not been confirmed
    # yet, and until when (monotonic) they may confirm it.
    awaiting: set[str] = field(default_factory=set)
    deadline: float = 0.0
    released: bool = False  # the master answered "stop": its processes may exit 0
    # How its first rank to fail ended, as the first agent to report one said it.
    failure: str | None = None
    # Lines that matched a log policy: (the policy's index, the agent) -> the first line.
    log_matches: dict[tuple[int, str], str] = field(default_factory=dict)

    @property
    def agents(self) -> tuple[str, ...]:
        return tuple(agent_id for agent_id, _ in self.placement)

    @property
    def over(self) -> bool:
        """Every agent has reported its part gone (or was given up on)."""
        return all(a in self.exit_codes for a in self.agents)
