"""Checkpoints: one row per checkpoint a trial's run wrote, fenced by run.

A checkpoint is recorded once (a retry with the same content is a no-op) and only from
the trial's current run; the newest one by batches becomes the trial's latest. Garbage
collection marks deleted ones, keeping the row.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from assay.master.errors import ConflictError, NotFoundError, StaleRunError
from assay.master.store._base import StoreBase
from assay.master.store._models import Checkpoint, Trial
from assay.master.store._records import CheckpointRecord


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
        with self.read() as s:
            c = s.get(Checkpoint, uuid)
            if c is None:
                raise NotFoundError(f"checkpoint {uuid} does not exist")
            return _checkpoint(c)

    def list_checkpoints(self, trial_id: int) -> list[CheckpointRecord]:
        with self.read() as s:
            rows = s.execute(
                select(Checkpoint)
                .where(Checkpoint.trial_id == trial_id)
                .order_by(Checkpoint.total_batches, Checkpoint.created_at)
            ).scalars()
            return [_checkpoint(c) for c in rows]

    def set_checkpoint_state(self, uuid: str, state: str) -> None:
        with self.write() as s:
            c = s.get(Checkpoint, uuid)
            if c is None:
                raise NotFoundError(f"checkpoint {uuid} does not exist")
            c.state = state


def _checkpoint(c: Checkpoint) -> CheckpointRecord:
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


__all__ = ["CheckpointQueries"]
