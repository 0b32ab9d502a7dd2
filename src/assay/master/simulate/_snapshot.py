"""The master's state as plain data (`Snapshot`), and the moves its states may make."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from assay.master.lifecycle import CONTINUE_EDGES, TERMINAL_TRIAL
from assay.master.lifecycle import EXPERIMENT_EDGES as LIFECYCLE_EXPERIMENT_EDGES
from assay.master.lifecycle import TRIAL_EDGES as LIFECYCLE_TRIAL_EDGES

Placement = tuple[tuple[str, tuple[int, ...]], ...]
Move = tuple[str, int, str, str]  # trial | experiment, id, from, to


class InvariantError(AssertionError):
    """The master broke an invariant; the message names the seed and step that did it."""


# --- the states and their moves -----------------------------------------------------------

NEW = "NEW"  # before the trial or experiment exists
TERMINAL = frozenset(str(s) for s in TERMINAL_TRIAL)
# Each move the master writes: the lifecycle's edges, where a trial or experiment starts,
# and a state written again unchanged.
# The moves out of an end (`CONTINUE_EDGES`) are allowed in a continue step only
# (`CONTINUE_TRIAL_EDGES`, ...): in any other they are a bug.
CONTINUE_TRIAL_EDGES: Mapping[str, frozenset[str]] = {
    NEW: frozenset({"QUEUED", "PAUSED"}),
    **{str(k): frozenset(str(s) for s in {k, *v}) for k, v in LIFECYCLE_TRIAL_EDGES.items()},
}
CONTINUE_EXPERIMENT_EDGES: Mapping[str, frozenset[str]] = {
    NEW: frozenset({"ACTIVE", "PAUSED"}),
    **{str(k): frozenset(str(s) for s in {k, *v}) for k, v in LIFECYCLE_EXPERIMENT_EDGES.items()},
}


def _without_continue(edges: Mapping[str, frozenset[str]]) -> dict[str, frozenset[str]]:
    return {k: frozenset(s for s in v if (k, s) not in CONTINUE_EDGES) for k, v in edges.items()}


TRIAL_EDGES = _without_continue(CONTINUE_TRIAL_EDGES)
EXPERIMENT_EDGES = _without_continue(CONTINUE_EXPERIMENT_EDGES)


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
CONTINUE_TRIAL_MOVES = step_moves(CONTINUE_TRIAL_EDGES, frozenset(TRIAL_EDGES) - TERMINAL - {NEW})
CONTINUE_EXPERIMENT_MOVES = step_moves(
    CONTINUE_EXPERIMENT_EDGES, frozenset(EXPERIMENT_EDGES) - TERMINAL - {NEW}
)


# --- the master's state -------------------------------------------------------------------


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
    released: bool  # told "no more" with no stop under way (a stop decides the end first)


@dataclass(frozen=True)
class Snapshot:
    """What the master holds in memory, taken under its lock between two steps."""

    experiments: Mapping[int, ExperimentView]
    trials: Mapping[int, TrialView]
    runs: Mapping[int, RunView]  # by trial id
    queue: frozenset[int]  # trial ids
    allocations: Mapping[int, Placement]  # the scheduler's, by trial id
    agents: Mapping[str, int]  # the scheduler's agents and their slot counts
