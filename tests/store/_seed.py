"""Store fixtures written the way the master writes them.

The master records its changes in a `WriteBatch` and the group commit writes each batch
with `Store.apply` (master/_commit.py); these helpers do the same, one batch per call, so
the contract tests exercise the path production uses. The master takes a trial's next
run id from its memory; here it is read from the store.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import select

from assay.master.store import Store, Trial, WriteBatch


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def commit(store: Store, batch: WriteBatch) -> None:
    """Write `batch` in one transaction, as `GroupCommit` does."""
    store.apply(batch)


def experiment(
    store: Store,
    *,
    name: str = "exp",
    owner: str = "alice",
    config: Mapping[str, Any] | None = None,
    model_definition: bytes = b"",
    state: str = "ACTIVE",
    description: str = "",
    labels: Sequence[str] = (),
    priority: int = 42,
) -> int:
    """A new experiment's id."""
    experiment_id = store.reserve_id("experiments")
    batch = WriteBatch()
    batch.add_experiment(
        experiment_id,
        name=name,
        owner_id=store.user_id(owner),
        config=dict(config or {}),
        model_definition=model_definition,
        state=state,
        description=description,
        labels=labels,
        priority=priority,
        now=now(),
    )
    commit(store, batch)
    return experiment_id


def trial(
    store: Store,
    experiment_id: int,
    *,
    request_id: str = "r1",
    hparams: Mapping[str, Any] | None = None,
    seed: int = 0,
    state: str = "ACTIVE",
) -> int:
    """A new trial's id (it has no run yet)."""
    trial_id = store.reserve_id("trials")
    batch = WriteBatch()
    batch.add_trial(
        trial_id,
        experiment_id=experiment_id,
        request_id=request_id,
        hparams=dict(hparams or {}),
        seed=seed,
        state=state,
        now=now(),
    )
    commit(store, batch)
    return trial_id


def start_run(store: Store, trial_id: int, *, restored_batches: int | None = None) -> int:
    """Move the trial to its next run, as the master starts one; return the run id.

    With `restored_batches`, the run resumes from a checkpoint at that batch count: the
    trial's metrics past it are superseded in the same transaction.
    """
    # The run id alone: the tests of older schemas run this on stores that lack later columns.
    with store.read() as s:
        run_id = s.execute(select(Trial.run_id).where(Trial.id == trial_id)).scalar_one() + 1
    batch = WriteBatch()
    fields: dict[str, Any] = {"run_id": run_id, "state": "RUNNING"}
    if restored_batches is not None:
        fields["total_batches"] = restored_batches
        batch.supersede_metrics(trial_id, restored_batches)
    batch.set_trial(trial_id, **fields)
    commit(store, batch)
    return run_id


def set_trial(store: Store, trial_id: int, **fields: Any) -> None:
    batch = WriteBatch()
    batch.set_trial(trial_id, **fields)
    commit(store, batch)


def trial_with_run(store: Store, name: str = "exp") -> tuple[int, int, int]:
    """(experiment, trial, run): an experiment of one trial on its first run."""
    experiment_id = experiment(store, name=name)
    trial_id = trial(store, experiment_id, request_id=f"{name}-r1", hparams={"lr": 0.1}, seed=7)
    return experiment_id, trial_id, start_run(store, trial_id)
