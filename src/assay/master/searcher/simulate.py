"""A simulated master: drives a `Searcher` with synthetic trials, no processes, no clock.

It applies operations the way the master does and checks the protocol as it goes (a
`Create` is followed by its `ValidateAfter`, lengths only grow, nothing is sent to a closed
trial, `Shutdown` comes once and last, at most `max_live` trials run at once); any breach
raises `ProtocolError`. The tests use it to play thousands of trials a second and
`bench/search_quality.py` to measure search quality on synthetic learning curves.

Order "time" completes the trial whose work ends first (each batch takes one time unit,
every live trial trains at once): an asynchronous cluster. Order "random" picks any
pending event (a validation or a close) at random: every interleaving the master allows.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ._ops import Close, Create, ExitedReason, Operation, Searcher, Shutdown, ValidateAfter

Objective = Callable[[Mapping[str, Any], int, int], float]
"""(hyperparameters, length in batches, trial seed) -> the metric a validation reports."""
ExitPolicy = Callable[[str, Mapping[str, Any], int], "ExitedReason | None"]
"""(request id, hyperparameters, target length) -> a reason to exit instead of reporting."""


class ProtocolError(AssertionError):
    """The searcher broke the operation protocol."""


@dataclass
class SimulatedTrial:
    hparams: dict[str, Any]
    seed: int
    created_at: int  # the event count when it was created
    lengths: list[int] = field(default_factory=list)  # the lengths it validated at
    metrics: list[float] = field(default_factory=list)
    target: int | None = None  # the outstanding ValidateAfter's length
    batches: int = 0
    closing: bool = False
    closed: bool = False
    exited: ExitedReason | None = None


@dataclass
class SimulationResult:
    trials: dict[str, SimulatedTrial]
    events: int = 0
    shutdowns: int = 0
    max_live: int = 0
    batches: int = 0  # batches trained, all trials together
    progress: list[float] = field(default_factory=list)  # after every event
    # (batches trained so far, metric, length) for every validation, in order
    trace: list[tuple[int, float, int]] = field(default_factory=list)

    def counted(self) -> list[str]:
        """Request ids of trials that count toward max_trials (not invalid_hp exits)."""
        return [rid for rid, t in self.trials.items() if t.exited != "invalid_hp"]


class SimulatedMaster:
    """Plays the master for one searcher; `run()` drives it to Shutdown."""

    def __init__(
        self,
        searcher: Searcher,
        objective: Objective,
        *,
        max_live: int = 0,
        order: Literal["time", "random"] = "time",
        exit_policy: ExitPolicy | None = None,
        seed: int = 0,
    ) -> None:
        self.searcher = searcher
        self.objective = objective
        self.max_live = max_live  # 0: unchecked
        self.order = order
        self.exit_policy = exit_policy
        self.rng = random.Random(seed)
        self.result = SimulationResult(trials={})
        self.now = 0
        self._queue: list[tuple[int, int, str]] = []  # (time done, tie, request id)
        self._closing: list[str] = []
        self._tie = 0
        self._started = False

    @property
    def trials(self) -> dict[str, SimulatedTrial]:
        return self.result.trials

    def live(self) -> list[str]:
        return [rid for rid, t in self.trials.items() if t.target is not None]

    def start(self) -> None:
        self._started = True
        self.apply(self.searcher.initial_operations())

    def run(self, max_events: int = 10_000_000) -> SimulationResult:
        if not self._started:
            self.start()
        while self.step():
            if self.result.events >= max_events:
                raise ProtocolError(f"no Shutdown after {max_events} events")
        return self.result

    def step(self) -> bool:
        """Deliver one event; False when none is left (after Shutdown)."""
        event = self._next_event()
        if event is None:
            if self.result.shutdowns != 1:
                raise ProtocolError("no event left to deliver and no Shutdown: the search stalled")
            return False
        kind, rid = event
        self.result.events += 1
        if kind == "close":
            trial = self.trials[rid]
            trial.closing, trial.closed = False, True
            self.apply(self.searcher.on_trial_closed(rid))
        else:
            self._complete(rid)
        self.result.progress.append(self.searcher.progress())
        return True

    def _next_event(self) -> tuple[str, str] | None:
        if self.order == "random":
            pending = [("close", r) for r in self._closing] + [("validate", r) for r in self.live()]
            if not pending:
                return None
            kind, rid = pending[self.rng.randrange(len(pending))]
            if kind == "close":
                self._closing.remove(rid)
            return kind, rid
        if self._closing:
            return "close", self._closing.pop(0)
        if not self._queue:
            return None
        self.now, _, rid = heapq.heappop(self._queue)
        return "validate", rid

    def _complete(self, rid: str) -> None:
        trial = self.trials[rid]
        assert trial.target is not None
        length = trial.target
        self.result.batches += length - trial.batches
        trial.batches, trial.target = length, None
        reason = self.exit_policy(rid, trial.hparams, length) if self.exit_policy else None
        if reason is not None:
            trial.exited = reason
            self.apply(self.searcher.on_trial_exited_early(rid, reason))
            return
        metric = self.objective(trial.hparams, length, trial.seed)
        trial.lengths.append(length)
        trial.metrics.append(metric)
        self.result.trace.append((self.result.batches, metric, length))
        self.apply(self.searcher.on_validation_completed(rid, metric, length))

    def apply(self, ops: list[Operation]) -> None:
        """Check and carry out operations as the master would."""
        expect_validate: str | None = None
        for i, op in enumerate(ops):
            if expect_validate is not None and not (
                isinstance(op, ValidateAfter) and op.request_id == expect_validate
            ):
                raise ProtocolError(f"Create({expect_validate}) not followed by its ValidateAfter")
            expect_validate = None
            if self.result.shutdowns:
                raise ProtocolError(f"{op} after Shutdown")
            if isinstance(op, Create):
                if op.request_id in self.trials:
                    raise ProtocolError(f"request id {op.request_id} created twice")
                self.trials[op.request_id] = SimulatedTrial(
                    dict(op.hparams), op.seed, created_at=self.result.events
                )
                if op.checkpoint_from is not None:
                    # It starts from the parent's checkpoint: where the parent paused.
                    parent = self._known(op.checkpoint_from)
                    if parent.target is not None or not parent.lengths:
                        raise ProtocolError(
                            f"{op}: its parent is training or has not validated yet"
                        )
                    self.trials[op.request_id].batches = parent.batches
                self.apply(self.searcher.on_trial_created(op.request_id))
                expect_validate = op.request_id
            elif isinstance(op, ValidateAfter):
                self._validate_after(op)
            elif isinstance(op, Close):
                self._close(op.request_id)
            elif isinstance(op, Shutdown):
                self._shutdown(is_last=i == len(ops) - 1)
        if expect_validate is not None:
            raise ProtocolError(f"Create({expect_validate}) not followed by its ValidateAfter")
        live = len(self.live())
        self.result.max_live = max(self.result.max_live, live)
        if self.max_live and live > self.max_live:
            raise ProtocolError(f"{live} trials run at once; the limit is {self.max_live}")

    def _validate_after(self, op: ValidateAfter) -> None:
        trial = self._known(op.request_id)
        if trial.closing or trial.closed or trial.exited or trial.target is not None:
            raise ProtocolError(f"{op} for a trial that is not paused")
        if op.length <= trial.batches:
            raise ProtocolError(f"{op}: the trial is already at {trial.batches} batches")
        trial.target = op.length
        if self.order == "time":
            self._tie += 1
            done = self.now + op.length - trial.batches
            heapq.heappush(self._queue, (done, self._tie, op.request_id))

    def _close(self, rid: str) -> None:
        trial = self._known(rid)
        if trial.closing or trial.closed or trial.exited or trial.target is not None:
            raise ProtocolError(f"Close({rid}) for a trial that is running or done")
        trial.closing = True
        self._closing.append(rid)

    def _shutdown(self, *, is_last: bool) -> None:
        if not is_last:
            raise ProtocolError("Shutdown is not the last operation of its list")
        still_open = [r for r, t in self.trials.items() if not (t.closed or t.exited)]
        if still_open:
            raise ProtocolError(f"Shutdown while trials are open: {still_open[:5]}")
        self.result.shutdowns += 1

    def _known(self, rid: str) -> SimulatedTrial:
        if rid not in self.trials:
            raise ProtocolError(f"operation for unknown request id {rid}")
        return self.trials[rid]
