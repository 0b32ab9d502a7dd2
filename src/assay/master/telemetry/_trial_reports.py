"""What a trial reports that goes to the store without the master's lock: metrics, log
lines, checkpoints, and the validation a multi-objective searcher is told.

Each function does its store I/O and returns what memory should learn (or nothing); the
shell (`_core.Master`) applies that under its lock. The store fences stale runs and
makes retries no-ops by itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from assay.config import ExperimentConfig
from assay.master.auth import mask_secrets
from assay.master.checkpoints import recorded_sha256, reported_location
from assay.master.lifecycle import ExperimentState, Restore, Run, TrialState
from assay.master.store import (
    CheckpointRecord,
    LogLine,
    MetricReport,
    MetricsReported,
    Store,
)
from assay.master.telemetry._multi_objective import validation_vector


def masked(lines: Sequence[LogLine]) -> list[LogLine]:
    """Log lines as they are stored: secrets masked."""
    return [replace(line, message=mask_secrets(line.message)) for line in lines]


def store_metrics(
    store: Store,
    experiment: ExperimentState | None,
    run: Run,
    group: str,
    reports: Sequence[MetricReport],
    *,
    max_names: int,
) -> MetricsReported:
    """Store a run's metrics and the trial's progress in one transaction; refused whole
    (`ResourceExhaustedError`) if it would take the trial past `max_names` distinct
    metric names (the master's `metric_names_per_trial`)."""
    searcher = experiment.config.searcher if experiment is not None else None
    return store.report_metrics_and_progress(
        run.trial_id,
        run.run_id,
        group,
        reports,
        searcher_metric=searcher.metric if searcher is not None else None,
        smaller_is_better=searcher.smaller_is_better if searcher is not None else True,
        max_names=max_names,
    )


def metrics_stored(trial: TrialState, done: MetricsReported) -> None:
    """Memory's copy of what `store_metrics` changed in the trial's row."""
    trial.total_batches = max(trial.total_batches, done.total_batches)
    trial.best_validation = done.best_validation


def validation_result(
    store: Store,
    experiment: ExperimentState | None,
    run: Run,
    total_batches: int,
    metric: float,
) -> float | list[float | None]:
    """What the searcher is told of a validation: `metric`, or for a multi-objective
    search every metric it names (`searcher.objectives`), read from the store."""
    if experiment is None or not experiment.config.searcher.objectives:
        return metric
    names = [o.name for o in experiment.config.searcher.objectives]
    return validation_vector(store, run.trial_id, total_batches, names)


def store_checkpoint(
    store: Store,
    config: ExperimentConfig | None,
    run: Run,
    checkpoint: CheckpointRecord,
    root: Path,
) -> str:
    """Record a checkpoint the run wrote, at the location the experiment's storage gives
    its uuid (the one garbage collection and `DeleteCheckpoints` delete); return it.

    The trial runs its user's code, so a report may say anything: `reported_location`
    refuses any other place, and anything but a uuid.
    """
    location = reported_location(store, run.experiment_id, config, checkpoint, root)
    store.add_checkpoint(
        replace(checkpoint, trial_id=run.trial_id, run_id=run.run_id, location=location)
    )
    return location


def checkpoint_stored(trial: TrialState, checkpoint: CheckpointRecord, location: str) -> None:
    """Memory's copy of a stored checkpoint: as the store does, the newest by batches is
    the one the trial's next run restores."""
    trial.checkpointed = True
    if checkpoint.total_batches >= trial.total_batches:
        trial.checkpoint = Restore(
            checkpoint.uuid, checkpoint.total_batches, location, recorded_sha256(checkpoint)
        )
        trial.total_batches = checkpoint.total_batches
