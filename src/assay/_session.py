"""What the trial controller talks to: the searcher's targets and the metric/checkpoint sink.

On a cluster the session forwards to the master over gRPC; `LocalSession` serves
`run_local`, training one target of `searcher.max_length` and keeping every report.
Only rank 0 calls a session; the controller broadcasts its answers to the other ranks.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from assay._checkpoint import CheckpointMetadata
from assay.common.archive import format_bytes

log = logging.getLogger("assay")


@dataclass(frozen=True)
class MetricsReport:
    total_batches: int
    epoch: int
    metrics: dict[str, float]


@dataclass(frozen=True)
class CheckpointReport:
    path: Path
    metadata: CheckpointMetadata


class Session(Protocol):
    def next_target(self, total_batches: int) -> int | None:
        """Total batches to train until before the next report, or None to stop."""

    def report_training_metrics(self, report: MetricsReport) -> None: ...

    def report_validation_metrics(self, report: MetricsReport) -> None: ...

    def report_metrics(self, group: str, report: MetricsReport) -> None:
        """A custom group's metrics (the harness's own: `system`, per rank)."""

    def report_checkpoint(self, report: CheckpointReport) -> None: ...

    def complete_target(
        self, total_batches: int, searcher_metric: float, *, stop_requested: bool = False
    ) -> None:
        """Trained and validated to `total_batches`; `stop_requested`: the trial's code
        asked to end here (it ends as completed)."""

    def preempt_requested(self) -> bool: ...


@dataclass
class LocalSession:
    """Train to `max_batches` once; remember every report (and log it)."""

    max_batches: int
    echo: bool = True
    training: list[MetricsReport] = field(default_factory=list)
    validation: list[MetricsReport] = field(default_factory=list)
    # Other groups' reports (`system`: each rank's memory and step time), by group.
    groups: dict[str, list[MetricsReport]] = field(default_factory=dict)
    checkpoints: list[CheckpointReport] = field(default_factory=list)
    completed: list[tuple[int, float]] = field(default_factory=list)

    def next_target(self, total_batches: int) -> int | None:
        if total_batches >= self.max_batches:
            return None
        return self.max_batches

    def report_training_metrics(self, report: MetricsReport) -> None:
        self.training.append(report)
        if self.echo:
            log_metrics("training", report)

    def report_validation_metrics(self, report: MetricsReport) -> None:
        self.validation.append(report)
        if self.echo:
            log_metrics("validation", report)

    def report_metrics(self, group: str, report: MetricsReport) -> None:
        self.groups.setdefault(group, []).append(report)

    def report_checkpoint(self, report: CheckpointReport) -> None:
        self.checkpoints.append(report)
        if self.echo:
            log.info(
                "batch %d checkpoint: %s (%s)",
                report.metadata.total_batches,
                report.path,
                format_bytes(report.metadata.size_bytes),
            )

    def complete_target(
        self, total_batches: int, searcher_metric: float, *, stop_requested: bool = False
    ) -> None:
        self.completed.append((total_batches, searcher_metric))

    def preempt_requested(self) -> bool:
        return False


def log_metrics(group: str, report: MetricsReport) -> None:
    """`batch 100 training: loss=0.27853`: the line a report makes in a local run's output
    and in a cluster trial's logs alike."""
    log.info("batch %d %s: %s", report.total_batches, group, _fmt(report.metrics))


def _fmt(metrics: dict[str, Any]) -> str:
    return " ".join(
        f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(metrics.items())
    )
