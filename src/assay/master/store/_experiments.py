"""Experiments and their trials: reads, the fields set outside the group commit, and ids.

The master writes experiments and trials through `WriteBatch` (its group commit); here
are the reads the CLI and web UI make (the experiment list filters, sorts and pages on
indexed columns), the one update made outside a batch (archiving) and the ids a batch's
new rows take.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Sequence
from typing import Any

from sqlalchemy import Engine, delete, exists, func, select, text
from sqlalchemy.orm import Session, undefer

from assay.config import MAX_LABELS
from assay.master.errors import (
    CheckpointInUseError,
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
)
from assay.master.store._base import StoreBase
from assay.master.store._batch import EXPERIMENT_FIELDS
from assay.master.store._checkpoints import mark_versions_bereft
from assay.master.store._models import (
    Allocation,
    Checkpoint,
    Experiment,
    ExperimentLabel,
    Metric,
    MetricRollup,
    Project,
    TaskLog,
    Trial,
    User,
    Workspace,
)
from assay.master.store._records import ExperimentRecord, Page, TrialRecord
from assay.master.store._registry import pinning_versions

# Columns the experiment list may be sorted by (user input never names a column).
SORT_COLUMNS: dict[str, Any] = {
    "id": Experiment.id,
    "name": Experiment.name,
    "state": Experiment.state,
    "owner": User.username,
    "priority": Experiment.priority,
    "progress": Experiment.progress,
    "created_at": Experiment.created_at,
    "start_time": Experiment.start_time,
    "end_time": Experiment.end_time,
}
MAX_PAGE = 1000
ENDED_EXPERIMENT = frozenset({"COMPLETED", "CANCELED", "ERROR"})
# Ids reserved per database read: a restart on PostgreSQL skips what was left of a block.
_ID_BLOCK = 256


class ExperimentQueries(StoreBase):
    """Experiments and trials."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self._ids: dict[str, list[int]] = {}  # reserved, unused ids per table
        self._id_lock = threading.Lock()
        self._sqlite_top: dict[str, int] = {}  # the largest id handed out per table

    def reserve_id(self, table: str) -> int:
        """A new id for a row of `table` (experiments, trials), before the row is written.

        The master records rows in a `WriteBatch` and writes them later, so it needs ids
        up front. PostgreSQL hands them out from the table's sequence (in blocks, so
        most calls need no round trip; a crash leaves a gap, never a duplicate). SQLite
        counts on from the largest id: one master owns a SQLite file.
        """
        with self._id_lock:
            free = self._ids.get(table)
            if not free:
                free = self._ids[table] = self._fetch_ids(table)
            return free.pop()

    def _fetch_ids(self, table: str) -> list[int]:
        if table not in ("experiments", "trials"):
            raise InvalidArgumentError(f"no ids are reserved for table {table!r}")
        with self.engine.connect() as c:
            if self.engine.dialect.name == "postgresql":
                rows = c.execute(
                    text(
                        "SELECT nextval(pg_get_serial_sequence(:table, 'id')) "
                        "FROM generate_series(1, :n)"
                    ),
                    {"table": table, "n": _ID_BLOCK},
                ).scalars()
                return sorted((int(i) for i in rows), reverse=True)
            top = c.execute(text(f"SELECT coalesce(max(id), 0) FROM {table}")).scalar_one()
            known = self._sqlite_top.get(table, 0)
            start = max(int(top), known) + 1
            self._sqlite_top[table] = start + _ID_BLOCK - 1
            return list(range(start + _ID_BLOCK - 1, start - 1, -1))

    def get_experiment(self, experiment_id: int) -> ExperimentRecord:
        with self.read() as s:
            row = s.execute(_experiment_query().where(Experiment.id == experiment_id)).first()
            if row is None:
                raise NotFoundError(f"experiment {experiment_id} does not exist")
            return _experiment(s, *row)

    def get_model_definition(self, experiment_id: int) -> bytes:
        with self.read() as s:
            data = s.execute(
                select(Experiment.model_definition).where(Experiment.id == experiment_id)
            ).scalar()
            if data is None:
                raise NotFoundError(f"experiment {experiment_id} does not exist")
            return bytes(data)

    def model_definition_bytes(self, owner_id: int) -> int:
        """The bytes of the model definitions of every experiment `owner_id` submitted."""
        with self.read() as s:
            total = s.execute(
                select(func.coalesce(func.sum(func.length(Experiment.model_definition)), 0)).where(
                    Experiment.owner_id == owner_id
                )
            ).scalar()
            return int(total or 0)

    def get_config_text(self, experiment_id: int) -> str | None:
        """The config as its submitter wrote it (None if it was stored before it was kept)."""
        with self.read() as s:
            row = s.execute(
                select(Experiment.config_text).where(Experiment.id == experiment_id)
            ).first()
            if row is None:
                raise NotFoundError(f"experiment {experiment_id} does not exist")
            return row[0]

    def update_experiment(self, experiment_id: int, **fields: Any) -> None:
        """Set the named fields (idempotent)."""
        unknown = set(fields) - EXPERIMENT_FIELDS
        if unknown:
            raise InvalidArgumentError(f"cannot update experiment fields {sorted(unknown)}")
        with self.write() as s:
            experiment = s.get(Experiment, experiment_id)
            if experiment is None:
                raise NotFoundError(f"experiment {experiment_id} does not exist")
            for key, value in fields.items():
                setattr(experiment, key, value)

    def patch_experiment(
        self,
        experiment_id: int,
        *,
        name: str | None = None,
        description: str | None = None,
        labels: Sequence[str] | None = None,
        add_labels: Sequence[str] = (),
        remove_labels: Sequence[str] = (),
    ) -> None:
        """Set its name and description (None: as they are) and its labels: `labels`
        replaces them, then `add_labels` and `remove_labels` apply. Idempotent. The
        caller checks the texts (`assay.config` limits)."""
        with self.write() as s:
            experiment = s.get(Experiment, experiment_id)
            if experiment is None:
                raise NotFoundError(f"experiment {experiment_id} does not exist")
            if name is not None:
                experiment.name = name
            if description is not None:
                experiment.description = description
            current = set(
                s.execute(
                    select(ExperimentLabel.label).where(
                        ExperimentLabel.experiment_id == experiment_id
                    )
                ).scalars()
            )
            wanted = set(current if labels is None else labels)
            wanted = (wanted | set(add_labels)) - set(remove_labels)
            if len(wanted) > MAX_LABELS:
                raise InvalidArgumentError(
                    f"experiment {experiment_id} would have {len(wanted)} labels; an "
                    f"experiment may have at most {MAX_LABELS}"
                )
            for label in current - wanted:
                row = s.get(ExperimentLabel, (experiment_id, label))
                if row is not None:
                    s.delete(row)
            for label in sorted(wanted - current):
                s.add(ExperimentLabel(experiment_id=experiment_id, label=label))

    def list_experiments(
        self,
        *,
        states: Sequence[str] = (),
        name: str | None = None,
        label: str | None = None,
        owner: str | None = None,
        archived: bool | None = None,
        workspaces: Collection[int] | None = None,
        workspace: str | None = None,
        project: str | None = None,
        sort: str = "id",
        descending: bool = True,
        limit: int = 50,
        offset: int = 0,
    ) -> Page[ExperimentRecord]:
        """Filter, sort (a whitelisted column) and paginate; values are bound, never spliced.

        `workspaces`: only experiments in these workspaces (by id; None: every one);
        `workspace`, `project`: only those in the workspace or project of that name.
        """
        if sort not in SORT_COLUMNS:
            allowed = ", ".join(sorted(SORT_COLUMNS))
            raise InvalidArgumentError(f"cannot sort by {sort!r}; sort by one of: {allowed}")
        if not 1 <= limit <= MAX_PAGE:
            raise InvalidArgumentError(f"limit must be between 1 and {MAX_PAGE}, got {limit}")
        if offset < 0:
            raise InvalidArgumentError(f"offset must not be negative, got {offset}")
        query = _experiment_query()
        if states:
            query = query.where(Experiment.state.in_(list(states)))
        if name:
            query = query.where(func.lower(Experiment.name).contains(name.lower(), autoescape=True))
        if label:
            query = query.where(
                exists().where(
                    ExperimentLabel.experiment_id == Experiment.id, ExperimentLabel.label == label
                )
            )
        if owner:
            query = query.where(User.username == owner)
        if archived is not None:
            query = query.where(Experiment.archived.is_(archived))
        if workspaces is not None:
            query = query.where(Project.workspace_id.in_(list(workspaces)))
        if workspace:
            query = query.where(Workspace.name == workspace)
        if project:
            query = query.where(Project.name == project)
        column = SORT_COLUMNS[sort]
        # Explicit NULL placement: SQLite and PostgreSQL disagree by default.
        if descending:
            order = [column.desc().nulls_last(), Experiment.id.desc()]
        else:
            order = [column.asc().nulls_last(), Experiment.id]
        with self.read() as s:
            total = s.execute(select(func.count()).select_from(query.subquery())).scalar_one()
            rows = s.execute(query.order_by(*order).limit(limit).offset(offset)).all()
            items = [_experiment(s, *row) for row in rows]
        return Page(items=items, total=total, offset=offset, limit=limit)

    def get_trial(self, trial_id: int) -> TrialRecord:
        with self.read() as s:
            trial = s.get(Trial, trial_id, options=_LINEAGE)
            if trial is None:
                raise NotFoundError(f"trial {trial_id} does not exist")
            return _trial(trial)

    def delete_experiment(self, experiment_id: int) -> None:
        """Delete an ended experiment's rows in one transaction: its labels, trials,
        metrics and their rollups, logs, allocations and checkpoint records (its slot
        usage stays: usage outlives what it counts). Nothing is deleted when it has not
        ended (`ConflictError`) or when a registered model version pins one of its
        checkpoints (`CheckpointInUseError`, naming the versions; a version of a model in
        another workspace does not, and is marked as having lost its checkpoint); the
        experiment row is locked first, so a version registered meanwhile is seen here or
        refused there."""
        with self.write() as s:
            experiment = s.get(Experiment, experiment_id, with_for_update=True)
            if experiment is None:
                raise NotFoundError(f"experiment {experiment_id} does not exist")
            if experiment.state not in ENDED_EXPERIMENT:
                raise ConflictError(
                    f"experiment {experiment_id} is {experiment.state}: only an ended "
                    "experiment (COMPLETED, CANCELED or ERROR) can be deleted"
                )
            trials = select(Trial.id).where(Trial.experiment_id == experiment_id)
            checkpoints = select(Checkpoint.uuid).where(Checkpoint.trial_id.in_(trials))
            s.execute(checkpoints.with_for_update()).all()  # as register_version does
            pinned = s.execute(pinning_versions(checkpoints)).all()
            if pinned:
                raise CheckpointInUseError(pinned_message(experiment_id, pinned))
            mark_versions_bereft(s, checkpoints)  # of models in other workspaces
            for table in (Metric, MetricRollup, TaskLog, Allocation, Checkpoint):
                s.execute(delete(table).where(table.trial_id.in_(trials)))
            s.execute(delete(Trial).where(Trial.experiment_id == experiment_id))
            s.execute(delete(ExperimentLabel).where(ExperimentLabel.experiment_id == experiment_id))
            s.execute(delete(Experiment).where(Experiment.id == experiment_id))

    def list_trials(self, experiment_id: int) -> list[TrialRecord]:
        with self.read() as s:
            trials = s.execute(
                select(Trial)
                .options(*_LINEAGE)
                .where(Trial.experiment_id == experiment_id)
                .order_by(Trial.id)
            ).scalars()
            return [_trial(t) for t in trials]


def pinned_message(experiment_id: int, pinned: Sequence[Any]) -> str:
    """Why experiment `experiment_id` cannot be deleted: `pinned` rows of (checkpoint
    uuid, model name, version) that register its checkpoints."""
    named = ", ".join(f"model {model!r} version {version}" for _, model, version in pinned)
    return (
        f"experiment {experiment_id} cannot be deleted: its checkpoints are registered as "
        f"{named}; delete those versions (assay model delete-version) first"
    )


def _experiment_query() -> Any:  # Select[Experiment, str, ...]; its spelling differs in 2.0/2.1
    return (
        select(Experiment, User.username, Project.name, Workspace.name)
        .join(User, User.id == Experiment.owner_id)
        .join(Project, Project.id == Experiment.project_id)
        .join(Workspace, Workspace.id == Project.workspace_id)
    )


def _experiment(
    s: Session, e: Experiment, owner: str, project: str = "", workspace: str = ""
) -> ExperimentRecord:
    labels = s.execute(
        select(ExperimentLabel.label)
        .where(ExperimentLabel.experiment_id == e.id)
        .order_by(ExperimentLabel.label)
    ).scalars()
    return ExperimentRecord(
        id=e.id,
        name=e.name,
        description=e.description,
        owner=owner,
        state=e.state,
        labels=tuple(labels),
        priority=e.priority,
        progress=e.progress,
        archived=e.archived,
        config=e.config,
        searcher_state=e.searcher_state,
        created_at=e.created_at,
        start_time=e.start_time,
        end_time=e.end_time,
        project_id=e.project_id,
        project=project,
        workspace=workspace,
    )


_LINEAGE = (undefer(Trial.parent_trial_id), undefer(Trial.search_round))


def _trial(t: Trial) -> TrialRecord:
    return TrialRecord(
        id=t.id,
        experiment_id=t.experiment_id,
        request_id=t.request_id,
        hparams=t.hparams,
        seed=t.seed,
        state=t.state,
        run_id=t.run_id,
        restarts=t.restarts,
        total_batches=t.total_batches,
        best_validation=t.best_validation,
        latest_checkpoint=t.latest_checkpoint,
        start_time=t.start_time,
        end_time=t.end_time,
        last_error=t.last_error,
        parent_trial_id=t.parent_trial_id,
        search_round=t.search_round,
    )


__all__ = ["MAX_PAGE", "SORT_COLUMNS", "ExperimentQueries"]
