"""What a searcher says (operations) and what it is told (events), and its interface.

The master applies operations in the order a call returns them and persists them with the
searcher's snapshot. A trial is *live* while it has an outstanding `ValidateAfter`; when
its validation is reported and the same call returns neither a new `ValidateAfter` nor a
`Close` for it, it is *paused*: the master checkpoints it and frees its slot, and a later
`ValidateAfter` (a promotion) resumes it from that checkpoint. `Close` is final.

A `Create` with `checkpoint_from` (population-based training's exploit) names a paused or
closed trial: the new trial's first run starts from that trial's latest checkpoint,
continuing its batch count. If that trial is still running, the master stops it at a
checkpoint first (it resumes from there) so that the copy starts where it validated.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

ExitedReason: TypeAlias = Literal["invalid_hp", "errored", "user_canceled"]
EXITED_REASONS: tuple[ExitedReason, ...] = ("invalid_hp", "errored", "user_canceled")


@dataclass(frozen=True)
class Create:
    """Create a trial with these hyperparameters and seed; its first `ValidateAfter`
    always follows in the same list. With `checkpoint_from` (a request id) it starts from
    that trial's latest checkpoint; `round` is the search round that created it (pbt's
    lineage, 0 for other searchers)."""

    request_id: str
    hparams: dict[str, Any]
    seed: int
    checkpoint_from: str | None = None
    round: int = 0

    def __repr__(self) -> str:
        # The lineage only when there is one: a plain Create reads (and digests) as before.
        lineage = ""
        if self.checkpoint_from is not None or self.round:
            lineage = f", checkpoint_from={self.checkpoint_from!r}, round={self.round!r}"
        return (
            f"Create(request_id={self.request_id!r}, hparams={self.hparams!r}, "
            f"seed={self.seed!r}{lineage})"
        )


@dataclass(frozen=True)
class ValidateAfter:
    """Train the trial until its total batch count is `length`, then validate and report."""

    request_id: str
    length: int


@dataclass(frozen=True)
class Close:
    """The trial is done: checkpoint it (if it is running) and stop it for good."""

    request_id: str


@dataclass(frozen=True)
class Shutdown:
    """The experiment is done: every trial is closed or exited and none is left to create.
    Emitted once."""


Operation: TypeAlias = Create | ValidateAfter | Close | Shutdown


class Searcher(ABC):
    """A pure state machine: events in, operations out; no I/O, clocks or threads.

    Metrics are passed as the trial reported them; the searcher applies
    `smaller_is_better` itself. A metric that is not finite (NaN, +-inf) ranks below every
    finite one, whatever the direction, and is never promoted.
    """

    @abstractmethod
    def initial_operations(self) -> list[Operation]:
        """The first trials, up to the concurrency limit."""

    @abstractmethod
    def on_trial_created(self, request_id: str) -> list[Operation]:
        """The master created the trial of a `Create`."""

    @abstractmethod
    def on_validation_completed(
        self, request_id: str, metric: float, length: int
    ) -> list[Operation]:
        """A live trial reached the `length` of its `ValidateAfter` and validated."""

    @abstractmethod
    def on_trial_closed(self, request_id: str) -> list[Operation]:
        """A trial the searcher closed has stopped."""

    @abstractmethod
    def on_trial_exited_early(self, request_id: str, reason: ExitedReason) -> list[Operation]:
        """A trial stopped on its own: unusable hyperparameters, an error, or a user."""

    @abstractmethod
    def progress(self) -> float:
        """How far the search is, from 0 to 1 (1 once `Shutdown` was emitted)."""

    @abstractmethod
    def snapshot(self) -> dict[str, Any]:
        """The whole state as plain JSON values; `restore_searcher` rebuilds it."""
