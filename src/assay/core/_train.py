"""`core.train`: report training and validation metrics, progress, and read the best.

Reports come from the chief (rank 0) only, as in Determined: gather what the other
processes measured with `core.distributed.gather` and report it from rank 0. A report
from another rank raises at once rather than being lost. Values are numbers (Python,
NumPy or one-element torch tensors); other values are left out with a warning.
`get_tensorboard_path()` is the directory whose TensorBoard event files are kept with the
trial (see `assay.core._tensorboard`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from assay._backend import Backend
from assay.config import MAX_METRIC_NAME_CHARS, name_problem
from assay.core._distributed import DistributedContext
from assay.core._searcher import _SearchState
from assay.core._tensorboard import TensorBoardFiles
from assay.errors import AssayError

log = logging.getLogger("assay")


class TrainContext:
    """Metric reports of one trial (see the module docstring)."""

    def __init__(
        self,
        distributed: DistributedContext,
        backend: Backend | None,
        search: _SearchState,
        tensorboard: TensorBoardFiles,
    ) -> None:
        self._dist = distributed
        self._backend = backend
        self._search = search
        self._tensorboard = tensorboard
        self._skipped: set[str] = set()
        self._names: set[str] = set()  # names already checked
        self._last_steps = 0

    def _chief(self, what: str) -> Backend:
        if not self._dist.is_chief or self._backend is None:
            raise RuntimeError(
                f"{what} was called on rank {self._dist.rank}: only the chief (rank 0) "
                "reports; gather values to it with core.distributed.gather() and report "
                "there"
            )
        return self._backend

    def report_training_metrics(
        self,
        steps_completed: int,
        metrics: Mapping[str, Any],
        batch_metrics: Any = None,
    ) -> None:
        """Training metrics after `steps_completed` steps (batches)."""
        self.report_metrics("training", steps_completed, metrics)

    def report_validation_metrics(self, steps_completed: int, metrics: Mapping[str, Any]) -> None:
        """Validation metrics after `steps_completed` steps. One that reaches the
        searcher's target and carries its metric completes the target (see
        `assay.core._searcher`)."""
        values = self.report_metrics("validation", steps_completed, metrics)
        self._search.on_validation(steps_completed, values)

    def report_metrics(
        self, group: str, steps_completed: int, metrics: Mapping[str, Any]
    ) -> dict[str, float]:
        """Metrics of any `group` (e.g. "training", "validation", "test"); returns the
        values as stored."""
        backend = self._chief(f"report_metrics({group!r}, ...)")
        if not isinstance(group, str) or not group:
            raise AssayError(f"a metric group is a non-empty string, got {group!r}")
        steps = _steps(steps_completed)
        values = self._numbers(metrics)
        backend.report_metrics(group, steps, values)
        self._last_steps = max(self._last_steps, steps)
        return values

    def report_progress(self, progress: float) -> None:
        """How far through its training this trial is, from 0 to 1 (for the web UI)."""
        if not isinstance(progress, int | float) or not 0.0 <= float(progress) <= 1.0:
            raise AssayError(f"progress must be a number from 0 to 1, got {progress!r}")
        self._chief("report_progress").report_progress(float(progress))

    def get_experiment_best_validation(self) -> float | None:
        """The best value of the searcher's metric any trial of this experiment reported
        (None before the first validation)."""
        return self._chief("get_experiment_best_validation").best_validation()

    def get_tensorboard_path(self) -> Path:
        """The directory to write TensorBoard event files into (e.g. `SummaryWriter(
        log_dir=...)`): they are kept in the checkpoint storage under
        `tensorboard/trial-<id>`, uploaded with every checkpoint and at the end on object
        storage. Every process may call it; ranks other than 0 get a `rank-<n>`
        subdirectory."""
        return self._tensorboard.path()

    def set_status(self, status: str) -> None:
        """Determined's free-form status line: logged."""
        log.info("status: %s", status)

    def _numbers(self, metrics: Mapping[str, Any]) -> dict[str, float]:
        if not isinstance(metrics, Mapping):
            raise AssayError(f"metrics must be a dict of name to number, got {metrics!r}")
        values: dict[str, float] = {}
        for name, value in metrics.items():
            number = _number(value)
            if number is None:
                if name not in self._skipped:
                    self._skipped.add(name)
                    log.warning(
                        "metric %r is %s, not a number: it is not stored",
                        name,
                        type(value).__name__,
                    )
                continue
            key = str(name)
            if key not in self._names:
                _check_metric_name(key)
                self._names.add(key)
            values[key] = number
        return values


def _check_metric_name(key: str) -> None:
    """Refused here as the master would refuse it, before it fails the run there."""
    if not 1 <= len(key) <= MAX_METRIC_NAME_CHARS:
        shown = f"{key[:40]!r}... ({len(key):,} characters)" if key else "''"
        raise AssayError(
            f"metric name {shown}: a metric name is 1 to {MAX_METRIC_NAME_CHARS} characters"
        )
    problem = name_problem(key)
    if problem is not None:
        raise AssayError(f"metric name {key!r} {problem}")


def _steps(steps_completed: Any) -> int:
    if isinstance(steps_completed, bool) or not isinstance(steps_completed, int):
        try:
            as_int = int(steps_completed)
        except (TypeError, ValueError):
            as_int = -1
        if as_int != steps_completed:
            raise AssayError(f"steps_completed must be an integer, got {steps_completed!r}")
        steps_completed = as_int
    if steps_completed < 0:
        raise AssayError(f"steps_completed must be at least 0, got {steps_completed}")
    return int(steps_completed)


def _number(value: Any) -> float | None:
    """A float from a Python, NumPy or one-element torch number; None otherwise."""
    if isinstance(value, bool | int | float):
        return float(value)
    item = getattr(value, "item", None)
    if callable(item):
        try:
            number = item()  # raises for arrays and tensors of several elements
        except (TypeError, ValueError, RuntimeError):
            return None
        if isinstance(number, bool | int | float):
            return float(number)
    return None


__all__ = ["TrainContext"]
