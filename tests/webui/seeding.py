"""An adaptive ASHA search written straight into a store, as the master writes one: most
trials stopped at the first rung with a single validation, a log-scale `lr`, one
checkpoint, and log lines with and without a level. The pages are checked against it with
a master that serves the store and no agent."""

from __future__ import annotations

import datetime as dt
import io
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from assay.master.store import CheckpointRecord, LogLine, MetricReport, Store, WriteBatch

# The search's model definition: a tar.gz of one file, which a fork of it copies.
MODEL_DEF_SOURCE = b"class DigitsTrial:  # seeded: never run\n    pass\n"


def _model_definition() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        info = tarfile.TarInfo("model_def.py")
        info.size = len(MODEL_DEF_SOURCE)
        archive.addfile(info, io.BytesIO(MODEL_DEF_SOURCE))
    return buffer.getvalue()


CONFIG = {
    "name": "asha-rungs",
    "entrypoint": "model_def:DigitsTrial",
    "hyperparameters": {
        "global_batch_size": 32,
        "lr": {"type": "log", "minval": -4, "maxval": -1.5, "base": 10},
        "dropout": {"type": "double", "minval": 0.0, "maxval": 0.5},
    },
    "searcher": {
        "name": "adaptive_asha",
        "metric": "accuracy",
        "smaller_is_better": False,
        "max_length": {"batches": 900},
        "max_trials": 7,
    },
}

# (lr, dropout, validations at these batch counts, accuracy at the first): five stopped at
# the first rung, their accuracies far enough apart for their markers not to overlap.
TRIALS = [
    (1.2e-4, 0.10, [100], 0.30),
    (4.0e-4, 0.40, [100], 0.36),
    (1.1e-3, 0.25, [100, 300, 900], 0.55),
    (2.9e-3, 0.05, [100, 300, 900], 0.62),
    (7.5e-3, 0.30, [100], 0.42),
    (1.6e-2, 0.20, [100], 0.48),
    (2.8e-2, 0.45, [100], 0.24),
]

# The log of the first trial: what a program prints (no level) and lines that name one.
LOG = [
    LogLine("epoch 1: loss 0.51", level=None),
    LogLine("epoch 2: loss 0.33", level=""),
    LogLine("WARNING: the learning rate is large", level="WARNING"),
    LogLine("INFO: saved a checkpoint", level="INFO"),
]


@dataclass
class Seeded:
    experiment_id: int
    trial_ids: list[int]
    lrs: list[float]
    checkpoint: str


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _accuracy(first: float, batches: int) -> float:
    return first + 0.2 * (batches - 100) / 800


def _loss(batches: int, last: int) -> float:
    if batches == last:
        return -0.1
    return 0.0 if batches == last - 1 else 1.0 / batches


def seed_asha(store: Store) -> Seeded:
    experiment_id = store.reserve_id("experiments")
    batch = WriteBatch()
    batch.add_experiment(
        experiment_id,
        name=str(CONFIG["name"]),
        owner_id=store.user_id("admin"),
        config=CONFIG,
        model_definition=_model_definition(),
        state="COMPLETED",
        description="",
        labels=[],
        priority=42,
        now=_now(),
    )
    store.apply(batch)
    trial_ids: list[int] = []
    checkpoint = "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9"
    for i, (lr, dropout, validations, first) in enumerate(TRIALS):
        trial_id, run_id = store.reserve_id("trials"), 1
        trial_ids.append(trial_id)
        batch = WriteBatch()
        hparams = {"global_batch_size": 32, "lr": lr, "dropout": dropout}
        batch.add_trial(
            trial_id,
            experiment_id=experiment_id,
            request_id=f"seed-{i}",
            hparams=hparams,
            seed=i,
            state="RUNNING",
            now=_now(),
        )
        batch.set_trial(trial_id, run_id=run_id)
        store.apply(batch)
        last = validations[-1]
        # A training loss that touches 0 and goes below: a log axis must start above it.
        losses = [MetricReport(b, {"loss": _loss(b, last)}) for b in range(1, last + 1)]
        store.report_metrics(trial_id, run_id, "training", losses)
        reports = [MetricReport(b, {"accuracy": _accuracy(first, b)}) for b in validations]
        store.report_metrics(trial_id, run_id, "validation", reports)
        if i == 3:  # the best trial, the only one with a checkpoint
            store.add_checkpoint(
                CheckpointRecord(
                    uuid=checkpoint,
                    trial_id=trial_id,
                    run_id=run_id,
                    total_batches=last,
                    state="COMPLETED",
                    location=f"/var/lib/assay/checkpoints/{checkpoint}",
                    files={"models.pt": 48_213},
                )
            )
        if i == 0:
            store.append_logs(trial_id, run_id, LOG)
        batch = WriteBatch()
        batch.set_trial(
            trial_id,
            state="COMPLETED",
            total_batches=last,
            best_validation=max(r.values["accuracy"] or 0.0 for r in reports),
            latest_checkpoint=checkpoint if i == 3 else None,
            start_time=_now(),
            end_time=_now(),
        )
        store.apply(batch)
    batch = WriteBatch()
    batch.set_experiment(experiment_id, progress=1.0, end_time=_now())
    store.apply(batch)
    return Seeded(experiment_id, trial_ids, [t[0] for t in TRIALS], checkpoint)


@dataclass
class SeededRun:
    experiment_id: int
    trial_ids: list[int]


def seed_search(
    store: Store,
    name: str,
    hyperparameters: Mapping[str, object],
    trials: Sequence[tuple[Mapping[str, object], Sequence[tuple[int, float]]]],
    metric: str = "accuracy",
    smaller_is_better: bool = False,
    checkpoint: str | None = None,
    project_id: int | None = None,
) -> SeededRun:
    """A completed experiment with these trials: (hparams, [(batches, metric value)]);
    with `checkpoint`, the first trial keeps a checkpoint of that uuid at its last batch,
    its validation metrics there in the checkpoint's metadata."""
    config = {
        "name": name,
        "entrypoint": "model_def:DigitsTrial",
        "hyperparameters": dict(hyperparameters),
        "searcher": {
            "name": "random" if len(trials) > 1 else "single",
            "metric": metric,
            "smaller_is_better": smaller_is_better,
            "max_length": {"batches": max(b for _, vs in trials for b, _ in vs)},
            "max_trials": len(trials),
        },
    }
    experiment_id = store.reserve_id("experiments")
    batch = WriteBatch()
    batch.add_experiment(
        experiment_id,
        name=name,
        owner_id=store.user_id("admin"),
        config=config,
        model_definition=b"",
        state="COMPLETED",
        description="",
        labels=[],
        priority=42,
        now=_now(),
        project_id=project_id,
    )
    store.apply(batch)
    trial_ids: list[int] = []
    for i, (hparams, validations) in enumerate(trials):
        trial_id, run_id = store.reserve_id("trials"), 1
        trial_ids.append(trial_id)
        batch = WriteBatch()
        batch.add_trial(
            trial_id,
            experiment_id=experiment_id,
            request_id=f"{name}-{i}",
            hparams=dict(hparams),
            seed=i,
            state="RUNNING",
            now=_now(),
        )
        batch.set_trial(trial_id, run_id=run_id)
        store.apply(batch)
        last = validations[-1][0]
        losses = [MetricReport(b, {"loss": 1.0 / b}) for b in range(10, last + 1, 10)]
        store.report_metrics(trial_id, run_id, "training", losses)
        reports = [MetricReport(b, {metric: v}) for b, v in validations]
        store.report_metrics(trial_id, run_id, "validation", reports)
        values = [v for _, v in validations]
        kept = checkpoint if checkpoint and i == 0 else None
        if kept:
            store.add_checkpoint(
                CheckpointRecord(
                    uuid=kept,
                    trial_id=trial_id,
                    run_id=run_id,
                    total_batches=last,
                    state="COMPLETED",
                    location=f"/var/lib/assay/checkpoints/{kept}",
                    files={"models.pt": 48_213},
                    user_metadata={"validation_metrics": {metric: values[-1]}},
                )
            )
        batch = WriteBatch()
        batch.set_trial(
            trial_id,
            state="COMPLETED",
            total_batches=last,
            best_validation=min(values) if smaller_is_better else max(values),
            latest_checkpoint=kept,
            start_time=_now(),
            end_time=_now(),
        )
        store.apply(batch)
    batch = WriteBatch()
    batch.set_experiment(experiment_id, progress=1.0, end_time=_now())
    store.apply(batch)
    return SeededRun(experiment_id, trial_ids)
