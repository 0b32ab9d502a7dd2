"""What a lifecycle decision asks the master to do.

Decisions never write, send or schedule themselves: they return these, in order. Most
are changes (`Change`) that the master's `Interpreter` applies to memory, the open
`WriteBatch` and the agents' outboxes. The rest are follow-up decisions (`FollowUp`):
a decision that needs the state after the changes before it (the searcher's answer, an
experiment's end, a run's end) names it, and the interpreter runs it there and then, and
applies what it returns in its place.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from assay.master.lifecycle._model import Run, StopKind, TrialStatus
from assay.master.lifecycle._orders import StartRun as AgentStart


@dataclass(frozen=True)
class SetTrial:
    """Change a trial's fields (stored unless `MEMORY_ONLY`)."""

    trial_id: int
    fields: Mapping[str, Any]


@dataclass(frozen=True)
class SetExperiment:
    experiment_id: int
    fields: Mapping[str, Any]


@dataclass(frozen=True)
class RecordSearch:
    """Store the experiment's search state as memory has it now (a trial's marks changed:
    its last failure, the agents it avoids)."""

    experiment_id: int


@dataclass(frozen=True)
class Enqueue:
    """Queue the trial for slots; `to_back`: behind every trial queued so far."""

    trial_id: int
    to_back: bool = False


@dataclass(frozen=True)
class Dequeue:
    trial_id: int


@dataclass(frozen=True)
class Kill:
    """Stop a run's processes on every agent that has not reported them gone; `stopping`
    records why, for the run's end (`run_outcome`)."""

    allocation_id: str
    graceful: bool
    stopping: StopKind | None = None


@dataclass(frozen=True)
class Log:
    """A line in the trial's log (and the master's), as the run's."""

    trial_id: int
    run_id: int
    message: str
    level: Literal["INFO", "WARNING", "ERROR"] = "WARNING"


@dataclass(frozen=True)
class CollectGarbage:
    """Once committed, delete the checkpoints the experiment's policy does not keep."""

    experiment_id: int
    ended_trial_ids: tuple[int, ...] = ()
    experiment_ended: bool = False


@dataclass(frozen=True)
class Drop:
    """Forget an ended experiment: memory keeps live ones only."""

    experiment_id: int


@dataclass(frozen=True)
class NewTrial:
    """Create a trial for a searcher's Create (the interpreter gives it its id)."""

    experiment_id: int
    request_id: str
    hparams: Mapping[str, Any] = field(default_factory=dict)
    seed: int = 0
    state: TrialStatus = TrialStatus.QUEUED
    checkpoint_from: str | None = None  # the request id of the trial it starts from
    search_round: int = 0


@dataclass(frozen=True)
class StartRun:
    """Record a new run of a trial on `placement` and send each agent its part."""

    run: Run
    messages: tuple[tuple[str, AgentStart], ...]  # (agent id, its part)
    supersede_after: int | None  # metrics past this batch count leave the curves


@dataclass(frozen=True)
class Adopt:
    """A restarted master's run confirmed by its agent: its slots are the run's again."""

    allocation_id: str
    agent_id: str


@dataclass(frozen=True)
class PartEnded:
    """Record that an agent's part of a run is gone: its exit codes, one per rank (none:
    its processes could not start, or the agent lost them), and what the agent said.
    `lost`: the agent lost it, which is not the user's doing (`Outcome.LOST`)."""

    allocation_id: str
    agent_id: str
    exit_codes: tuple[int, ...] = ()
    message: str = ""  # masked of secrets when recorded
    lost: bool = False
    failure: str = ""  # how its first rank to fail ended (AllocationStateChange.failure)


@dataclass(frozen=True)
class KillUnknown:
    """An agent runs an allocation the master has no run for: kill it there."""

    agent_id: str
    allocation_id: str


Change = (
    SetTrial
    | SetExperiment
    | RecordSearch
    | Enqueue
    | Dequeue
    | Kill
    | Log
    | CollectGarbage
    | Drop
    | NewTrial
    | StartRun
    | Adopt
    | PartEnded
    | KillUnknown
)
"""What the interpreter applies to memory, the open batch and the agents' outboxes."""


# --- follow-up decisions: run by the interpreter where they stand -------------------------


@dataclass(frozen=True)
class Tell:
    """Tell the searcher what became of a trial (`event` is a `Searcher` method) and
    carry out the operations it answers with."""

    experiment_id: int
    request_id: str
    event: Literal[
        "on_trial_created", "on_validation_completed", "on_trial_closed", "on_trial_exited_early"
    ]
    args: tuple[Any, ...] = ()


@dataclass(frozen=True)
class Settle:
    """End the experiment if its search is over and all its trials have ended (decided
    when the effects before this one have been applied)."""

    experiment_id: int


@dataclass(frozen=True)
class PartLost:
    """An agent's part of a run is gone without an exit code (the agent lost it)."""

    allocation_id: str
    agent_id: str
    why: str = ""  # for the master's log


@dataclass(frozen=True)
class FinishRun:
    """Every part of the run is gone: release its slots and decide its trial's fate
    (`run.finish_run`)."""

    allocation_id: str


@dataclass(frozen=True)
class DropAgent:
    """Give up on an agent: its slots leave the scheduler, its runs' parts are lost."""

    agent_id: str
    why: str


FollowUp = Tell | Settle | PartLost | FinishRun | DropAgent
"""A decision the interpreter runs where it stands in a decision's answer: its own
answer is applied in its place, before what follows."""

Effect = Change | FollowUp
"""One step of a decision's answer, applied in order."""
