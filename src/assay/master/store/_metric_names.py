"""The cap on the distinct metric names one trial may report (`metric_names_per_trial`).

Every name a trial reports becomes a curve on its pages and a row in every list of its
experiment's metrics, so a trial that reports names without end (175,002 once) makes
those pages unreadable. A report that would take a trial past the cap is refused whole,
saying which limit it hit and which setting raises it; names the trial has reported
before are always taken, so a trial that passed the cap before it was lowered keeps
reporting what it reported.

The names of the trials reported to lately are kept in memory (`MetricNameCap`): a
report checks its names against that set, without a query, and only a trial's first
report after a master start reads its names from the store. The check and the set's
update run inside the report's transaction, after the trial's row is locked (see
`check_run`), so two reports of one trial cannot both pass the cap.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Set

from sqlalchemy import select
from sqlalchemy.orm import Session

from assay.master.errors import ResourceExhaustedError
from assay.master.store._models import MetricRollup

SETTING = "metric_names_per_trial"


class _Known:
    """A trial's metric names by group, and how many there are in all."""

    __slots__ = ("by_group", "count")

    def __init__(self) -> None:
        self.by_group: dict[str, set[str]] = {}
        self.count = 0


class MetricNameCap:
    """The names of the last `max_trials` trials that reported (thread-safe)."""

    def __init__(self, max_trials: int = 4096) -> None:
        self.max_trials = max_trials
        self._lock = threading.Lock()
        self._trials: OrderedDict[int, _Known] = OrderedDict()

    def admit(
        self, session: Session, trial_id: int, group: str, names: Set[str], limit: int
    ) -> bool:
        """Count `names` of `group` as reported by `trial_id`, or raise
        `ResourceExhaustedError` (changing nothing) if that would pass `limit` (0: none).

        Call inside the report's transaction, with the trial's row locked; when it
        returns True (names were new) and that transaction does not commit, `forget`."""
        if limit <= 0:
            return False
        known = self._known(session, trial_id)
        with self._lock:
            seen = known.by_group.get(group)
            new = set(names) if seen is None else names - seen
            if not new:
                return False
            if known.count + len(new) > limit:
                raise ResourceExhaustedError(refusal(trial_id, known.count, new, limit))
            known.by_group.setdefault(group, set()).update(new)
            known.count += len(new)
            return True

    def forget(self, trial_id: int) -> None:
        """Drop what is known of the trial: its next report reads its names again."""
        with self._lock:
            self._trials.pop(trial_id, None)

    def _known(self, session: Session, trial_id: int) -> _Known:
        with self._lock:
            known = self._trials.get(trial_id)
            if known is not None:
                self._trials.move_to_end(trial_id)
                return known
        known = _load(session, trial_id)
        with self._lock:
            # Reports of one trial take turns (its row is locked): none loaded it meanwhile.
            self._trials[trial_id] = known
            while len(self._trials) > self.max_trials:
                self._trials.popitem(last=False)
        return known


def _load(session: Session, trial_id: int) -> _Known:
    known = _Known()
    rows = session.execute(
        select(MetricRollup.group, MetricRollup.name)
        .where(MetricRollup.trial_id == trial_id, MetricRollup.level == 1)
        .distinct()
    )
    for group, name in rows:
        known.by_group.setdefault(group, set()).add(name)
        known.count += 1
    return known


def refusal(trial_id: int, count: int, new: Set[str], limit: int) -> str:
    shown = ", ".join(repr(n) for n in sorted(new)[:3]) + (", ..." if len(new) > 3 else "")
    return (
        f"trial {trial_id} has reported {count} distinct metric names; {len(new)} new ones "
        f"({shown}) would pass the master's limit of {limit} per trial ({SETTING}): report "
        f"fewer distinct names, or ask an administrator to raise {SETTING}"
    )


__all__ = ["SETTING", "MetricNameCap"]
