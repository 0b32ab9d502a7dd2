"""What the master counts as it works, for its Prometheus metrics (`_metrics.py`).

The hot paths (a scheduling round, a group commit, an allocation's start and end, a
metrics report) call a `Telemetry`; this base class counts nothing, so a master whose
`metrics` setting is off pays a method call and imports no Prometheus code. The
counting subclass lives in `_metrics.py`, imported only when metrics are on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import ParamSpec, TypeVar

_P = ParamSpec("_P")
_R = TypeVar("_R")


class Telemetry:
    """The master's counters: each call is a counter's `inc` or a histogram's `observe`."""

    def round(self, schedule: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs) -> _R:
        """`schedule(*args)`, timed as one scheduling round."""
        started = time.perf_counter()
        try:
            return schedule(*args, **kwargs)
        finally:
            self.scheduled(time.perf_counter() - started)

    def scheduled(self, seconds: float) -> None:
        """A scheduling round took `seconds`."""

    def committed(self, seconds: float) -> None:
        """A group commit's batch took `seconds` to write (its retries included)."""

    def allocation_started(self) -> None:
        """An allocation (a run of a trial) was placed and started."""

    def allocation_ended(self, outcome: str) -> None:
        """An allocation ended; `outcome` is one of a few words (`lifecycle.Outcome`)."""

    def metric_rows(self, count: int) -> None:
        """`count` metric rows were stored (retried reports count 0)."""


NO_TELEMETRY = Telemetry()

__all__ = ["NO_TELEMETRY", "Telemetry"]
