"""`core.searcher`: the length the searcher asks a trial to train to.

Two ways to follow the searcher, as in Determined:

- Report validation metrics (Determined 0.38's way). When a validation at or past the
  current target carries the searcher's metric, the target is complete: the searcher
  decides, and if it stops the trial here (an ASHA rung it is not promoted from, or the
  end of the search) `core.preempt.should_preempt()` turns True. A promotion later starts
  the script again with `get_cluster_info().latest_checkpoint` set.
- `for op in core.searcher.operations():` train to `op.length`, then
  `op.report_completed(metric)` (the API before 0.38).

Progress is counted in steps (`steps_completed`), or in the validation metric named by
`searcher.time_metric` when the config sets one.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Iterator, Mapping

from assay._backend import Backend, LocalBackend, report_line
from assay.config import UNBOUNDED_LENGTH
from assay.core._distributed import DistributedContext
from assay.errors import AssayError, SearcherMetricError

log = logging.getLogger("assay")


class SearcherMode(enum.Enum):
    """Determined's modes: every process follows the chief's operations."""

    WorkersAskChief = "WORKERS_ASK_CHIEF"
    ChiefOnly = "CHIEF_ONLY"


class _SearchState:
    """The chief's view of its current target; shared by `train` and `searcher`."""

    def __init__(
        self,
        backend: Backend | None,
        metric: str | None,
        time_metric: str | None,
        on_stop: Callable[[], None],
    ) -> None:
        self.backend = backend
        self.metric = metric
        self.time_metric = time_metric
        self.on_stop = on_stop
        self.manual = False  # operations() drives the targets
        self._target: int | None = None
        self._asked = False
        self._stopped = False
        self._warned_time_metric = False
        # whether a validation carried the searcher's metric: until one has, a validation
        # without it is an error (a misnamed metric), as a Trial's is; after, another
        # set's validation may come without it
        self._seen_metric = False

    def target(self, units: int = 0) -> int | None:
        if self.backend is None or self._stopped:
            return None
        if not self._asked:
            self._target = self.backend.next_target(units)
            self._asked = True
            if self._target is None:
                self._stop()
        return self._target

    def complete(self, target: int, metric: float, units: int) -> int | None:
        """Tell the searcher `target` is reached; return the next target (None: stop)."""
        assert self.backend is not None
        self.backend.complete_target(target, metric)
        self._target = self.backend.next_target(units)
        if self._target is None:
            self._stop()
        return self._target

    def _stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            self.on_stop()

    def on_validation(self, steps: int, metrics: Mapping[str, float]) -> None:
        """After a validation report: complete the targets it reaches."""
        if self.manual or self.backend is None or self.metric is None:
            return
        if self.metric not in metrics:
            if not self._seen_metric:  # misnamed: the searcher would wait for it forever
                raise SearcherMetricError(
                    f"searcher.metric {self.metric!r} is not among the validation metrics "
                    f"reported ({', '.join(sorted(metrics)) or 'none'}): report it with "
                    f"report_validation_metrics, or name one of these in searcher.metric"
                )
            return  # another set's validation, after ones that carried it
        self._seen_metric = True
        units: float = steps
        if self.time_metric is not None:
            if self.time_metric not in metrics:
                if not self._warned_time_metric:
                    log.warning(
                        "validation metrics lack searcher.time_metric %r: the searcher "
                        "cannot tell how far this trial has trained",
                        self.time_metric,
                    )
                    self._warned_time_metric = True
                return
            units = metrics[self.time_metric]
        target = self.target(int(units))
        while target is not None and units >= target:
            report_line("reached the searcher's target %d: %s", target, self.metric)
            target = self.complete(target, float(metrics[self.metric or ""]), int(units))


class SearcherOperation:
    """Train to `length` (in the searcher's units), then `report_completed(metric)`."""

    def __init__(self, context: SearcherContext, length: int, is_chief: bool) -> None:
        self._context = context
        self.length = length
        self._is_chief = is_chief
        self._completed: float | None = None

    def report_progress(self, length: float) -> None:
        """How far toward `length` the trial is (for the web UI's progress)."""
        if self._is_chief and self._context._state.backend is not None and self.length > 0:
            self._context._state.backend.report_progress(max(0.0, min(1.0, length / self.length)))

    def report_completed(self, searcher_metric: float) -> None:
        """The trial trained to `length` and validated: `searcher_metric` is the result."""
        if not self._is_chief:
            raise RuntimeError("only the chief (rank 0) may report a searcher operation")
        self._completed = float(searcher_metric)


class SearcherContext:
    """The searcher's targets for this trial (see the module docstring)."""

    def __init__(
        self, state: _SearchState, distributed: DistributedContext, unit: str = "batches"
    ) -> None:
        self._state = state
        self._dist = distributed
        self._unit = unit

    def get_target(self) -> int | None:
        """The length the searcher currently asks for (chief only; None: no more)."""
        if not self._dist.is_chief:
            raise RuntimeError("only the chief (rank 0) talks to the searcher")
        return self._state.target()

    def get_configured_units(self) -> str:
        """The unit lengths are counted in: `batches`, `epochs`, or the time metric."""
        return self._state.time_metric or self._unit

    def operations(
        self,
        searcher_mode: SearcherMode = SearcherMode.WorkersAskChief,
        auto_ack: bool = True,
    ) -> Iterator[SearcherOperation]:
        """The searcher's operations for this trial, on every process; ends when the
        searcher has no more for it. Each must be `report_completed` by the chief."""
        chief = self._dist.is_chief
        if chief:
            self._state.manual = True
        done = 0
        while True:
            target = self._state.target(done) if chief else None
            if target == UNBOUNDED_LENGTH:
                # No searcher.max_length: a plain run (no config), one operation of length
                # 1, as Determined's local twin gives; on a cluster, and under run-local
                # (which runs as a cluster would), there is no length to give.
                plain = isinstance(self._state.backend, LocalBackend) and self._state.metric is None
                target = 1 if plain else -1
            if searcher_mode is SearcherMode.WorkersAskChief:
                target = self._dist.broadcast(target)
            if target is None:
                return
            if target == -1:
                raise AssayError(
                    "core.searcher.operations() needs a length: give searcher.max_length in "
                    "the experiment config (or train as long as the script decides, without "
                    "operations())"
                )
            op = SearcherOperation(self, target, chief)
            yield op
            if not chief:
                continue
            if op._completed is None:
                raise RuntimeError(
                    f"the searcher operation to train to {target} ended without "
                    "op.report_completed(metric)"
                )
            self._state.complete(target, op._completed, target)
            done = target

    def acknowledge_out_of_ops(self) -> None:
        """Determined's call; nothing to acknowledge here."""


__all__ = ["SearcherContext", "SearcherMode", "SearcherOperation"]
