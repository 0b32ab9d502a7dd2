"""Checkpoints: one row per checkpoint a trial's run wrote, fenced by run.

A checkpoint is recorded once (a retry with the same content is a no-op) and only from
the trial's current run; the newest one by batches becomes the trial's latest. Garbage
collection marks deleted ones, keeping the row.

A checkpoint's validation metrics are the ones its run reported at the checkpoint's own
batch count: what the trial reported with it (the Trial harness does), completed, as it
is read, with the validation group's metric rows of the same run and batch. A Core API
script reports the two separately, in either order, so neither report can carry the
other; reading them together pairs them whatever the order, across master restarts, and
for checkpoints stored before the rule was applied. A checkpoint with no validation at
its batch has none.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from assay.master.errors import ConflictError, NotFoundError, StaleRunError
from assay.master.store._base import StoreBase, now
from assay.master.store._metrics import VALIDATION
from assay.master.store._models import Checkpoint, Metric, ModelVersion, Trial
from assay.master.store._records import CheckpointRecord

DELETED = "DELETED"  # a checkpoint whose files garbage collection or a user removed


class CheckpointQueries(StoreBase):
    """Checkpoints."""

    def add_checkpoint(self, record: CheckpointRecord) -> None:
        """Record a checkpoint of the trial's current run.

        Idempotent: a retry with the same content is a no-op, even after the trial moved
        on to a newer run; other content under the same uuid raises `ConflictError`.
        """
        for attempt in range(2):
            try:
                with self.write() as s:
                    self._add_checkpoint(s, record)
                    return
            except IntegrityError:
                if attempt == 1:
                    raise  # not a concurrent duplicate: let the database's error speak

    def _add_checkpoint(self, s: Session, record: CheckpointRecord) -> None:
        # Lock the trial first: a concurrent restart or checkpoint waits for us.
        trial = s.get(Trial, record.trial_id, with_for_update=True)
        if trial is None:
            raise NotFoundError(f"trial {record.trial_id} does not exist")
        existing = s.get(Checkpoint, record.uuid)
        if existing is not None:
            if _checkpoint(existing) != record:
                raise ConflictError(
                    f"checkpoint {record.uuid} is already recorded with other content"
                )
            return
        if record.run_id != trial.run_id:
            raise StaleRunError(
                f"trial {record.trial_id} is on run {trial.run_id}; a checkpoint from run "
                f"{record.run_id} comes from a process that was replaced and is refused"
            )
        s.add(
            Checkpoint(
                uuid=record.uuid,
                trial_id=record.trial_id,
                run_id=record.run_id,
                total_batches=record.total_batches,
                state=record.state,
                location=record.location,
                files=dict(record.files),
                size_bytes=record.size_bytes,
                user_metadata=dict(record.user_metadata),
            )
        )
        if record.total_batches >= trial.total_batches:
            trial.latest_checkpoint = record.uuid
            trial.total_batches = record.total_batches

    def get_checkpoint(self, uuid: str) -> CheckpointRecord:
        """The checkpoint, with its validation metrics (see the module docstring)."""
        with self.read() as s:
            c = s.get(Checkpoint, uuid)
            if c is None:
                raise NotFoundError(f"checkpoint {uuid} does not exist")
            return _validated(s, c.trial_id, [c])[0]

    def list_checkpoints(self, trial_id: int) -> list[CheckpointRecord]:
        """The trial's checkpoints by batches, each with its validation metrics."""
        with self.read() as s:
            rows = s.execute(
                select(Checkpoint)
                .where(Checkpoint.trial_id == trial_id)
                .order_by(Checkpoint.total_batches, Checkpoint.created_at)
            ).scalars()
            return _validated(s, trial_id, list(rows))

    def set_checkpoint_state(self, uuid: str, state: str) -> None:
        """Mark the checkpoint `state`. A trial whose latest checkpoint is marked DELETED
        (only an ended trial's can be) gets its newest checkpoint still stored as its
        latest, or none: what `describe` shows and `--latest` downloads. The model
        versions naming a DELETED one are marked as having lost it."""
        with self.write() as s:
            c = s.get(Checkpoint, uuid)
            if c is None:
                raise NotFoundError(f"checkpoint {uuid} does not exist")
            c.state = state
            if state != DELETED:
                return
            mark_versions_bereft(s, [uuid])
            trial = s.get(Trial, c.trial_id, with_for_update=True)
            if trial is None or trial.latest_checkpoint != uuid:
                return
            trial.latest_checkpoint = s.execute(
                select(Checkpoint.uuid)
                .where(Checkpoint.trial_id == c.trial_id, Checkpoint.state != DELETED)
                .order_by(Checkpoint.total_batches.desc(), Checkpoint.created_at.desc())
                .limit(1)
            ).scalar_one_or_none()


def mark_versions_bereft(s: Session, uuids: Any) -> None:
    """Mark the model versions naming one of `uuids` (a list, or a select of uuids) as
    having lost their checkpoint (deleted by its owner), in the caller's transaction."""
    s.execute(
        update(ModelVersion)
        .where(
            ModelVersion.checkpoint_uuid.in_(uuids), ModelVersion.checkpoint_deleted_at.is_(None)
        )
        .values(checkpoint_deleted_at=now())
        .execution_options(synchronize_session=False)
    )


def _checkpoint(c: Checkpoint) -> CheckpointRecord:
    """The row as it was reported (what a retried report is compared with)."""
    return CheckpointRecord(
        uuid=c.uuid,
        trial_id=c.trial_id,
        run_id=c.run_id,
        total_batches=c.total_batches,
        state=c.state,
        location=c.location,
        files={k: int(v) for k, v in c.files.items()},
        user_metadata=c.user_metadata,
    )


def _validated(s: Session, trial_id: int, rows: Sequence[Checkpoint]) -> list[CheckpointRecord]:
    """`rows`, checkpoints of trial `trial_id`, as records whose `validation_metrics`
    hold the validation their run reported at their batch count, beside what the report
    of the checkpoint itself carried (which wins: it was measured on these weights)."""
    if not rows:
        return []
    wanted = {(c.run_id, c.total_batches) for c in rows}
    query = select(Metric.run_id, Metric.total_batches, Metric.name, Metric.value).where(
        Metric.trial_id == trial_id, Metric.group == VALIDATION
    )
    if len(rows) == 1:
        query = query.where(
            Metric.run_id == rows[0].run_id, Metric.total_batches == rows[0].total_batches
        )
    else:
        batches = select(Checkpoint.total_batches).where(Checkpoint.trial_id == trial_id)
        query = query.where(Metric.total_batches.in_(batches))
    found: dict[tuple[int, int], dict[str, float]] = {}
    for run_id, at, name, value in s.execute(query):
        if (run_id, at) in wanted:
            found.setdefault((run_id, at), {})[name] = math.nan if value is None else value
    return [with_validation(_checkpoint(c), found.get((c.run_id, c.total_batches))) for c in rows]


def with_validation(
    record: CheckpointRecord, validation: Mapping[str, float] | None
) -> CheckpointRecord:
    if not validation:
        return record
    reported = record.user_metadata.get("validation_metrics")
    metrics = {**validation, **(reported if isinstance(reported, Mapping) else {})}
    return replace(record, user_metadata={**record.user_metadata, "validation_metrics": metrics})


__all__ = ["CheckpointQueries"]
