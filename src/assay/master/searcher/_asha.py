"""One bracket of asynchronous successive halving (ASHA; Li et al., MLSys 2020).

Rung `k` trains to `lengths[k]` batches (see `assay.config._search.rung_lengths`). When a
slot is free, it goes to the best trial that is in the top `floor(n / divisor)` of the
`n` results of its rung and not yet promoted, looking at the highest rung first; failing
that, to a new trial at the bottom rung while fewer than `max_trials` were created. A
promoted trial resumes from its checkpoint. A trial that reports and is not promoted at
once is paused; it may be promoted later, when its rung has grown. Trials are closed when
they reach the top rung, when their result is not finite, when their rank in the bottom
rung is past `floor(max_trials / divisor)` (the bottom rung never holds more than
`max_trials` results, so they can never be promoted), and when the bracket has nothing
left to run.

Single, grid and random searches are brackets of one rung: every trial trains to
`max_length` and is closed. Ties rank by arrival (the earlier result first).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from assay.config import BracketSpec, Divisor, divide

from ._ops import Close, ExitedReason, Operation, ValidateAfter

LIVE, PAUSED, CLOSING, CLOSED, EXITED = "live", "paused", "closing", "closed", "exited"
INVALID_HP_FACTOR = 10
"""`invalid_hp` exits are replaced, uncounted, up to this many times `max_trials`; past
that each counts as an errored trial, so a Trial that always raises InvalidHP ends."""

# (0 for a finite value | 1 for none, value, arrival number, request id): sorts best first.
Entry = tuple[int, float, int, str]


def rank_entry(value: float | None, seq: int, request_id: str) -> Entry:
    """A rung entry; `value` is smaller-is-better, None (not finite, or an exit) is worst."""
    return (1, 0.0, seq, request_id) if value is None else (0, value, seq, request_id)


def promotion_quota(results: int, divisor: Divisor) -> int:
    """How many of a rung's best results may be promoted: floor(results / divisor), exact
    for a divisor such as 2.5 (see `assay.config._search`)."""
    return divide(results, divisor)


@dataclass
class _Trial:
    rung: int  # the rung it trains toward (live) or last reported at
    state: str
    batches: int  # the length of its last validation


class Bracket:
    """The rungs, trials and counters of one bracket; plain data, snapshotted as JSON."""

    def __init__(self, spec: BracketSpec, divisor: Divisor, *, replace_invalid: bool) -> None:
        self.lengths = spec.lengths
        self.max_trials = spec.max_trials
        self.limit = spec.max_concurrent_trials  # 0 = unlimited
        self.divisor = divisor
        self.replace_invalid = replace_invalid
        self.trials: dict[str, _Trial] = {}
        self.rungs: list[list[Entry]] = [[] for _ in self.lengths]
        self.promoted: list[set[str]] = [set() for _ in self.lengths]
        self.counted = 0  # created trials that count toward max_trials
        self.invalid = 0  # invalid_hp exits replaced so far
        self.seq = 0
        self.live = 0
        self.work = 0  # batches trained, plus those an exit left untrained at its rung

    @property
    def top(self) -> int:
        return len(self.lengths) - 1

    # --- what could run next -------------------------------------------------------------

    def has_room(self) -> bool:
        return self.limit == 0 or self.live < self.limit

    def can_create(self) -> bool:
        return self.counted < self.max_trials

    def best_promotable(self) -> tuple[str, int] | None:
        """(request id, rung) of the trial a free slot should resume, if any."""
        for k in range(self.top - 1, -1, -1):
            quota = promotion_quota(len(self.rungs[k]), self.divisor)
            for worst, _, _, rid in self.rungs[k][:quota]:
                if not worst and rid not in self.promoted[k] and self.trials[rid].state == PAUSED:
                    return rid, k
        return None

    def idle(self) -> bool:
        """Nothing runs and nothing could: the paused trials can never be promoted."""
        return self.live == 0 and not self.can_create() and self.best_promotable() is None

    def finished(self) -> bool:
        return self.idle() and all(t.state in (CLOSED, EXITED) for t in self.trials.values())

    # --- transitions ---------------------------------------------------------------------

    def add_trial(self, request_id: str) -> ValidateAfter:
        self.trials[request_id] = _Trial(rung=0, state=LIVE, batches=0)
        self.counted += 1
        self.live += 1
        return ValidateAfter(request_id, self.lengths[0])

    def promote(self, request_id: str, rung: int) -> ValidateAfter:
        trial = self.trials[request_id]
        self.promoted[rung].add(request_id)
        trial.rung, trial.state = rung + 1, LIVE
        self.live += 1
        return ValidateAfter(request_id, self.lengths[rung + 1])

    def report(self, request_id: str, value: float | None, length: int) -> list[Operation]:
        trial = self.trials[request_id]
        target = self.lengths[trial.rung]
        if trial.state != LIVE:
            raise ValueError(f"trial {request_id} reported a validation but is {trial.state}")
        if length != target:
            raise ValueError(
                f"trial {request_id} reported a validation at {length} batches; "
                f"it was asked to validate after {target}"
            )
        self.work += length - trial.batches
        trial.batches = length
        self.live -= 1
        if trial.rung == self.top or value is None:
            pushed = self._insert(trial.rung, value, request_id)
            return [self._close(request_id), *pushed]
        trial.state = PAUSED
        return self._insert(trial.rung, value, request_id)

    def exit(self, request_id: str, reason: ExitedReason) -> tuple[list[Operation], bool]:
        """Apply an early exit; also say whether it is replaced (and so not counted)."""
        trial = self.trials[request_id]
        if trial.state in (CLOSED, EXITED):
            return [], False
        if trial.state == CLOSING:
            trial.state = CLOSED
            return [], False
        was_live = trial.state == LIVE
        if was_live:
            self.live -= 1
        trial.state = EXITED
        replace = (
            reason == "invalid_hp"
            and self.replace_invalid
            and self.invalid < INVALID_HP_FACTOR * self.max_trials
        )
        if replace:
            self.invalid += 1
            self.counted -= 1
            self._remove(request_id)
            return [], True
        if not was_live:
            return [], False
        # As if it had stopped at its rung with the worst result: the rung grows by one.
        self.work += self.lengths[trial.rung] - trial.batches
        return self._insert(trial.rung, None, request_id), False

    def closed(self, request_id: str) -> None:
        trial = self.trials[request_id]
        if trial.state == CLOSING:
            trial.state = CLOSED
        elif trial.state in (LIVE, PAUSED):
            raise ValueError(f"trial {request_id} closed, but the searcher did not close it")

    def close_paused(self) -> list[Operation]:
        return [self._close(rid) for rid, t in self.trials.items() if t.state == PAUSED]

    def _close(self, request_id: str) -> Close:
        self.trials[request_id].state = CLOSING
        return Close(request_id)

    def _insert(self, rung: int, value: float | None, request_id: str) -> list[Operation]:
        """Add a result to a rung; close bottom-rung trials pushed past any chance."""
        entry = rank_entry(value, self.seq, request_id)
        self.seq += 1
        entries = self.rungs[rung]
        index = bisect.bisect_left(entries, entry)
        entries.insert(index, entry)
        if rung != 0 or self.top == 0:
            return []
        # Every paused entry at or past `bound` was closed before; this insertion can only
        # have added itself there or pushed the entry at bound - 1 to bound.
        bound = promotion_quota(self.max_trials, self.divisor)
        at = index if index >= bound else bound
        if at >= len(entries):
            return []
        rid = entries[at][3]
        trial = self.trials[rid]
        if trial.state == PAUSED and trial.rung == 0:
            return [self._close(rid)]
        return []

    def _remove(self, request_id: str) -> None:
        for k, entries in enumerate(self.rungs):
            self.rungs[k] = [e for e in entries if e[3] != request_id]
            self.promoted[k].discard(request_id)

    # --- snapshot ------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        return {
            "lengths": list(self.lengths),
            "max_trials": self.max_trials,
            "counted": self.counted,
            "invalid": self.invalid,
            "seq": self.seq,
            "work": self.work,
            "trials": {rid: [t.rung, t.state, t.batches] for rid, t in self.trials.items()},
            "rungs": [[[None if w else v, s, r] for w, v, s, r in es] for es in self.rungs],
            "promoted": [sorted(p) for p in self.promoted],
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        if list(state["lengths"]) != list(self.lengths) or state["max_trials"] != self.max_trials:
            raise ValueError(
                f"the snapshot's bracket has rungs {state['lengths']} and "
                f"{state['max_trials']} trials; the config gives {list(self.lengths)} and "
                f"{self.max_trials}"
            )
        self.counted, self.invalid = int(state["counted"]), int(state["invalid"])
        self.seq, self.work = int(state["seq"]), int(state["work"])
        self.trials = {
            rid: _Trial(int(rung), str(s), int(b)) for rid, (rung, s, b) in state["trials"].items()
        }
        self.rungs = [[rank_entry(v, int(s), str(r)) for v, s, r in es] for es in state["rungs"]]
        self.promoted = [set(p) for p in state["promoted"]]
        self.live = sum(1 for t in self.trials.values() if t.state == LIVE)
