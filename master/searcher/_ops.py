"""What a searcher says (operations) and what it is told (events), and its interface.

The master applies operations in the order a call returns them and persists them with the
searcher's snapshot. A trial is *live* while it has an outstanding `ValidateAfter`; when
its validation is reported and the same call returns neither a new `ValidateAfter` nor a
`Close` for it, it is *paused*: the master checkpoints it and frees its slot, and a later
`ValidateAfter` (a promotion) resumes it from that checkpoint. `Close` is final.
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
    always follows in the same list."""

    request_id: str
    hparams: dict[str, Any]
    seed: int


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
