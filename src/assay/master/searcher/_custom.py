"""The custom searcher (`searcher.name: custom`): its operations come from user code.

The user's `SearchMethod` runs outside the master, in a runner driven through the Python
SDK (`assay.client.searcher`): no user code runs in the master or on its host. This
searcher is the master's side of that conversation, a pure state machine like the others:

- every event the master tells it (the search started, a trial was created, validated,
  closed or exited early) joins an ordered queue, numbered 1, 2, ...; it answers none of
  them itself, so while no runner is attached the experiment waits (its trials run the
  lengths they were given, then pause);
- the runner reads the events after the last it has seen (`events_after`) and answers
  with one batch of operations (`apply`), naming the last event the batch answers. The
  batch is checked whole before anything is applied (an unknown trial, a length that is
  not positive or does not grow, hyperparameters outside the config's space, anything
  after `Shutdown` are refused with the reason), and the events it answers leave the
  queue;
- with each batch the runner hands over its own state (`SearchMethod.save_method_state`,
  at most `MAX_METHOD_STATE` bytes) and its progress. All of it is in `snapshot()`, which
  the master persists with the operations it carries out, so after a restart of the
  master the queue and the runner's state are as they were after the last batch, and a
  restarted runner resumes from that state with the events after that batch: nothing is
  lost or answered twice.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping, Sequence
from typing import Any

from assay.config import Categorical, Const, Double, HParam, Int, Log, leaves

from ._ops import (
    EXITED_REASONS,
    Close,
    Create,
    ExitedReason,
    Operation,
    Searcher,
    Shutdown,
    ValidateAfter,
)
from ._samplers import derive_seed

SNAPSHOT_VERSION = 1
MAX_METHOD_STATE = 1 << 20
"""The most bytes of a runner's saved state the master keeps (it is persisted with every
batch of operations): a larger state belongs in the runner's own storage."""
MAX_REQUEST_ID = 64
EVENT_KINDS = (
    "initial_operations",
    "trial_created",
    "validation_completed",
    "trial_closed",
    "trial_exited_early",
)


class OperationsError(ValueError):
    """A batch of operations the searcher will not apply; the message says why."""


class CustomSearcher(Searcher):
    """Events queued for a runner, operations from it (see the module doc)."""

    def __init__(
        self,
        space: Mapping[str, HParam],
        *,
        seed: int,
        max_trials: int | None = None,
        max_length: int | None = None,
    ) -> None:
        self._space = space
        self._seed = seed
        self.max_trials = max_trials
        self.max_length = max_length
        self.events: list[dict[str, Any]] = []  # not yet answered, in order
        self.next_event = 1
        self.acknowledged = 0  # the last event a batch of operations answered
        # request id -> {"length": the last ValidateAfter's, "state": open|closed|exited}
        self.trials: dict[str, dict[str, Any]] = {}
        self.method_state = b""
        self._progress = 0.0
        self._started = False
        self.shutdown = False

    # --- events --------------------------------------------------------------------------

    def _event(self, kind: str, **fields: Any) -> list[Operation]:
        self.events.append({"id": self.next_event, "kind": kind, **fields})
        self.next_event += 1
        return []

    def initial_operations(self) -> list[Operation]:
        if self._started:
            return []
        self._started = True
        return self._event("initial_operations")

    def on_trial_created(self, request_id: str) -> list[Operation]:
        self._trial(request_id)
        return self._event("trial_created", request_id=request_id)

    def on_validation_completed(
        self, request_id: str, metric: float, length: int
    ) -> list[Operation]:
        self._trial(request_id)
        value = float(metric)
        # JSON (and PostgreSQL's jsonb) has no NaN or infinity: those are kept as text.
        kept: float | str = value if math.isfinite(value) else repr(value)
        return self._event(
            "validation_completed", request_id=request_id, metric=kept, length=int(length)
        )

    def on_trial_closed(self, request_id: str) -> list[Operation]:
        self._trial(request_id)["state"] = "closed"
        return self._event("trial_closed", request_id=request_id)

    def on_trial_exited_early(self, request_id: str, reason: ExitedReason) -> list[Operation]:
        if reason not in EXITED_REASONS:
            raise ValueError(f"exit reason must be one of {EXITED_REASONS}, got {reason!r}")
        trial = self._trial(request_id)
        if trial["state"] == "open":
            trial["state"] = "exited"
        return self._event("trial_exited_early", request_id=request_id, reason=reason)

    def progress(self) -> float:
        return 1.0 if self.shutdown else min(0.99, self._progress)

    def _trial(self, request_id: str) -> dict[str, Any]:
        trial = self.trials.get(request_id)
        if trial is None:
            raise ValueError(f"unknown trial request id {request_id!r}")
        return trial

    # --- the runner's side ---------------------------------------------------------------

    def events_after(self, event_id: int) -> list[dict[str, Any]]:
        """The queued events after `event_id` (those up to `acknowledged` are gone)."""
        return [dict(e) for e in self.events if e["id"] > event_id]

    def apply(
        self,
        triggered_by: int,
        ops: Sequence[Operation],
        *,
        method_state: bytes = b"",
        progress: float | None = None,
    ) -> list[Operation]:
        """Check a runner's batch, answering the events up to `triggered_by`, and return
        the operations for the master to carry out (a `Create`'s negative seed replaced by
        one derived from the experiment seed; `Shutdown` preceded by a `Close` of every
        trial still open). Raise `OperationsError`, changing nothing, for a bad batch."""
        kept = self._check(triggered_by, ops, method_state, progress)
        out: list[Operation] = []
        for op in kept:
            if isinstance(op, Create):
                seed = op.seed
                if seed < 0:
                    seed = derive_seed(self._seed, "trial", len(self.trials))
                hparams = complete_hparams(self._space, op.hparams)
                self.trials[op.request_id] = {"length": 0, "state": "open"}
                out.append(Create(op.request_id, hparams, seed))
            elif isinstance(op, ValidateAfter):
                self.trials[op.request_id]["length"] = op.length
                out.append(op)
            elif isinstance(op, Close):
                self.trials[op.request_id]["state"] = "closed"
                out.append(op)
            elif isinstance(op, Shutdown):
                for request_id, trial in self.trials.items():
                    if trial["state"] == "open":
                        trial["state"] = "closed"
                        out.append(Close(request_id))
                self.shutdown = True
                out.append(op)
        self.acknowledged = triggered_by
        self.events = [e for e in self.events if e["id"] > triggered_by]
        self.method_state = bytes(method_state)
        if progress is not None:
            self._progress = progress
        return out

    def _check(
        self,
        triggered_by: int,
        ops: Sequence[Operation],
        method_state: bytes,
        progress: float | None,
    ) -> list[Operation]:
        """The batch's operations to carry out (those `_dropped` left out), or raise
        `OperationsError` for a bad batch."""
        last = self.next_event - 1
        if triggered_by <= self.acknowledged:
            raise OperationsError(
                f"event {triggered_by} was already answered (events up to "
                f"{self.acknowledged} are); read the events after {self.acknowledged}"
            )
        if triggered_by > last:
            raise OperationsError(
                f"event {triggered_by} has not happened (the last event is {last})"
            )
        if self.shutdown and ops:
            raise OperationsError("the search has shut down: it takes no more operations")
        if len(method_state) > MAX_METHOD_STATE:
            raise OperationsError(
                f"the saved method state is {len(method_state):,} bytes, more than "
                f"{MAX_METHOD_STATE:,}; keep large state in the runner's own storage"
            )
        if progress is not None and not (math.isfinite(progress) and 0 <= progress <= 1):
            raise OperationsError(f"progress must be from 0 to 1, got {progress!r}")
        state = {rid: t["state"] for rid, t in self.trials.items()}
        length = {rid: int(t["length"]) for rid, t in self.trials.items()}
        awaiting: set[str] = set()  # created in this batch, no ValidateAfter yet
        created = sum(1 for _ in self.trials)
        kept: list[Operation] = []
        for i, op in enumerate(ops):
            where = f"operation {i + 1} ({type(op).__name__})"
            if isinstance(op, Shutdown):
                if i != len(ops) - 1:
                    raise OperationsError(f"{where}: Shutdown must be the last operation")
                kept.append(op)
                continue
            rid = op.request_id
            if isinstance(op, Create):
                if not rid or len(rid) > MAX_REQUEST_ID or not rid.isprintable():
                    raise OperationsError(
                        f"{where}: a request id is 1 to {MAX_REQUEST_ID} printable "
                        f"characters, got {rid!r}"
                    )
                if rid in state:
                    raise OperationsError(f"{where}: trial {rid!r} already exists")
                created += 1
                if self.max_trials is not None and created > self.max_trials:
                    raise OperationsError(
                        f"{where}: searcher.max_trials is {self.max_trials}: no more trials"
                    )
                problems = hparams_problems(self._space, op.hparams)
                if problems:
                    raise OperationsError(f"{where} of {rid!r}: {'; '.join(problems)}")
                state[rid], length[rid] = "open", 0
                awaiting.add(rid)
                kept.append(op)
                continue
            if rid not in state:
                raise OperationsError(f"{where}: unknown trial {rid!r}")
            if _dropped(op, state[rid]):
                continue
            if state[rid] != "open":
                raise OperationsError(f"{where}: trial {rid!r} is {state[rid]}")
            if isinstance(op, ValidateAfter):
                n = op.length
                if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
                    raise OperationsError(
                        f"{where} of {rid!r}: length must be a positive number of batches, "
                        f"got {n!r}"
                    )
                if n <= length[rid]:
                    raise OperationsError(
                        f"{where} of {rid!r}: length {n} does not go past the trial's "
                        f"previous length {length[rid]}"
                    )
                if self.max_length is not None and n > self.max_length:
                    raise OperationsError(
                        f"{where} of {rid!r}: length {n} is past searcher.max_length "
                        f"({self.max_length} batches)"
                    )
                length[rid] = n
                awaiting.discard(rid)
            elif isinstance(op, Close):
                state[rid] = "closed"
                awaiting.discard(rid)
            kept.append(op)
        if awaiting:
            raise OperationsError(
                f"trials {sorted(awaiting)} are created without a ValidateAfter: give each "
                "new trial its first length in the same batch"
            )
        return kept

    # --- snapshot ------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        return {
            "version": SNAPSHOT_VERSION,
            "searcher": "custom",
            "events": [dict(e) for e in self.events],
            "next_event": self.next_event,
            "acknowledged": self.acknowledged,
            "trials": {rid: dict(t) for rid, t in self.trials.items()},
            "method_state": base64.b64encode(self.method_state).decode(),
            "progress": self._progress,
            "started": self._started,
            "shutdown": self.shutdown,
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Load a `snapshot()`; raise ValueError if it belongs to another search."""
        if state.get("version") != SNAPSHOT_VERSION or state.get("searcher") != "custom":
            raise ValueError(
                f"the snapshot is of a {state.get('searcher')!r} searcher (version "
                f"{state.get('version')!r}); the config gives custom (version "
                f"{SNAPSHOT_VERSION})"
            )
        self.events = [dict(e) for e in state["events"]]
        self.next_event = int(state["next_event"])
        self.acknowledged = int(state["acknowledged"])
        self.trials = {
            str(rid): {"length": int(t["length"]), "state": str(t["state"])}
            for rid, t in state["trials"].items()
        }
        self.method_state = base64.b64decode(state["method_state"])
        self._progress = float(state["progress"])
        self._started = bool(state["started"])
        self.shutdown = bool(state["shutdown"])


def _value_problem(hp: Any, value: Any) -> str | None:
    """Why `value` is not a point of `hp`, or None."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if isinstance(hp, Const):
        return None if value == hp.val else f"is the constant {hp.val!r}, got {value!r}"
    if isinstance(hp, Categorical):
        return None if value in hp.vals else f"expected one of {list(hp.vals)!r}, got {value!r}"
    if isinstance(hp, Int):
        ok = isinstance(value, int) and not isinstance(value, bool)
        if ok and hp.minval <= value <= hp.maxval:
            return None
        return f"expected an integer from {hp.minval} to {hp.maxval}, got {value!r}"
    if isinstance(hp, Log):
        low, high = sorted((hp.base**hp.minval, hp.base**hp.maxval))
    elif isinstance(hp, Double):
        low, high = hp.minval, hp.maxval
    else:  # pragma: no cover - leaves() yields only the types above
        return None
    # A relative slack of 1e-9: a value computed as base**x may round past its bound.
    slack = 1e-9 * max(abs(low), abs(high), 1e-300)
    if number and math.isfinite(value) and low - slack <= value <= high + slack:
        return None
    return f"expected a number from {low:g} to {high:g}, got {value!r}"


def hparams_problems(space: Mapping[str, HParam], hparams: Mapping[str, Any]) -> list[str]:
    """Every way `hparams` is not a point of `space` (a constant may be left out)."""
    problems: list[str] = []
    paths = leaves(space)
    known = {path for path, _ in paths}
    for path, hp in paths:
        current: Any = hparams
        for name in path:
            if not isinstance(current, Mapping) or name not in current:
                current = _MISSING
                break
            current = current[name]
        key = ".".join(path)
        if current is _MISSING:
            if not isinstance(hp, Const):
                problems.append(f"hyperparameter {key} is missing")
            continue
        problem = _value_problem(hp, current)
        if problem is not None:
            problems.append(f"hyperparameter {key}: {problem}")
    for path in _given_paths(hparams, ()):
        if path not in known and not any(path[: len(k)] == k for k in known):
            problems.append(
                f"hyperparameter {'.'.join(path)} is not in the config's hyperparameters"
            )
    return problems


def complete_hparams(space: Mapping[str, HParam], hparams: Mapping[str, Any]) -> dict[str, Any]:
    """`hparams` with the constants it left out (checked by `hparams_problems`)."""
    from assay.config import assemble

    values: dict[tuple[str, ...], Any] = {}
    for path, hp in leaves(space):
        current: Any = hparams
        for name in path:
            current = current.get(name, _MISSING) if isinstance(current, Mapping) else _MISSING
        values[path] = hp.val if current is _MISSING and isinstance(hp, Const) else current
    return assemble(space, values)


def _given_paths(value: Mapping[str, Any], prefix: tuple[str, ...]) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for name, inner in value.items():
        path = (*prefix, str(name))
        if isinstance(inner, Mapping) and inner:
            out += _given_paths(inner, path)
        else:
            out.append(path)
    return out


_MISSING = object()


def _dropped(op: Operation, state: str) -> bool:
    """An operation with nothing left to do, taken without a word: a Close of a trial
    already closed or exited, or any operation for an exited trial. A trial may exit
    (crash, or finish its script) after the events the runner answers: the runner cannot
    know yet, and refusing its batch would refuse the same batch after every restart."""
    return state == "exited" or (state == "closed" and isinstance(op, Close))
