"""`MemoryStore`: the `MasterStore` aggregates kept in memory, for the lifecycle simulation.

It answers as the SQL store does: the same records, ids counted up from the largest
stored one (as SQLite's), the same order of what it lists, the same errors for a
missing row, a stale run or a conflicting retry, and every write all or nothing (see
_memory_tables.py). A master restarted on it opens a new `MemoryStore` on the same
`MemoryDatabase`, so what each store keeps for itself (reserved ids, the users it
knows) starts over, as with a new SQL store.

What it leaves out: everything beyond `MasterStore` (users' logins and roles,
workspaces' and projects' writes, the registry, templates, usage reports, curves and
rollups), so no model version ever references or pins a checkpoint here.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

from assay.config import METRIC_NAMES_PER_TRIAL
from assay.master.errors import (
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
    StaleRunError,
)
from assay.master.store._batch import EXPERIMENT_FIELDS, WriteBatch
from assay.master.store._checkpoints import DELETED, with_validation
from assay.master.store._directory import Directory
from assay.master.store._experiments import ENDED_EXPERIMENT, MAX_PAGE, SORT_COLUMNS
from assay.master.store._memory_batch import live_best, stored_fields, write_batch
from assay.master.store._memory_logs import MemoryLogs
from assay.master.store._memory_tables import MemoryDatabase, Row, Transaction, as_json
from assay.master.store._memory_workspaces import MemoryWorkspaces
from assay.master.store._metric_names import refusal
from assay.master.store._metrics import VALIDATION, best_value, check_group, flatten_reports
from assay.master.store._records import (
    AgentRecord,
    AllocationRecord,
    CheckpointRecord,
    ExperimentRecord,
    MetricReport,
    MetricsReported,
    Page,
    TrialRecord,
)

if TYPE_CHECKING:
    from assay.master.store._protocols import MasterStore
    from assay.master.store._store import Store


class MemoryStore(MemoryLogs, MemoryWorkspaces):
    """A store on a `MemoryDatabase` (a new, empty one unless given)."""

    def __init__(self, database: MemoryDatabase | None = None) -> None:
        self.database = database if database is not None else MemoryDatabase()
        self._top: dict[str, int] = {}  # the largest id handed out per table
        self.directory = Directory(self._load_directory)

    # --- the group commit and secrets ------------------------------------------------

    def apply(self, batch: WriteBatch) -> None:
        """Write a batch all or nothing (`Store.apply`)."""
        if batch:
            with self.database.write() as tx:
                write_batch(tx, batch)

    def close(self) -> None:
        """Nothing to let go: the database lives on for the next store opened on it."""

    def secret(self, name: str) -> bytes:
        with self.database.write() as tx:
            found = tx["secrets"].get(name)
            if found is None:
                found = {"value": secrets.token_bytes(32)}
                tx.insert("secrets", name, found)
            return bytes(found["value"])

    # --- experiments and trials -----------------------------------------------------------

    def reserve_id(self, table: str) -> int:
        if table not in ("experiments", "trials"):
            raise InvalidArgumentError(f"no ids are reserved for table {table!r}")
        with self.database.read():
            top = max(self.database.next_id(table) - 1, self._top.get(table, 0)) + 1
            self._top[table] = top
        return top

    def get_experiment(self, experiment_id: int) -> ExperimentRecord:
        with self.database.read() as db:
            row = db["experiments"].get(experiment_id)
            if row is None:
                raise NotFoundError(f"experiment {experiment_id} does not exist")
            return self._experiment(row)

    def _experiment(self, e: Row) -> ExperimentRecord:
        db = self.database
        project = db["projects"][e["project_id"]]
        labels = sorted(label for eid, label in db["labels"] if eid == e["id"])
        return ExperimentRecord(
            id=e["id"],
            name=e["name"],
            description=e["description"],
            owner=db["users"][e["owner_id"]]["username"],
            state=e["state"],
            labels=tuple(labels),
            priority=e["priority"],
            progress=e["progress"],
            archived=e["archived"],
            config=as_json(e["config"]),
            searcher_state=as_json(e["searcher_state"]),
            created_at=e["created_at"],
            start_time=e["start_time"],
            end_time=e["end_time"],
            project_id=project["id"],
            project=project["name"],
            workspace=db["workspaces"][project["workspace_id"]]["name"],
        )

    def list_experiments(
        self,
        *,
        states: Sequence[str] = (),
        sort: str = "id",
        descending: bool = True,
        limit: int = 50,
        offset: int = 0,
    ) -> Page[ExperimentRecord]:
        """Filter by state, sort (missing values last, then by id) and page."""
        if sort not in SORT_COLUMNS:
            allowed = ", ".join(sorted(SORT_COLUMNS))
            raise InvalidArgumentError(f"cannot sort by {sort!r}; sort by one of: {allowed}")
        if not 1 <= limit <= MAX_PAGE:
            raise InvalidArgumentError(f"limit must be between 1 and {MAX_PAGE}, got {limit}")
        if offset < 0:
            raise InvalidArgumentError(f"offset must not be negative, got {offset}")
        with self.database.read() as db:
            records = [
                self._experiment(row)
                for row in db["experiments"].values()
                if not states or row["state"] in states
            ]
        present = [r for r in records if _sort_value(r, sort) is not None]
        present.sort(key=lambda r: (_sort_value(r, sort), r.id), reverse=descending)
        missing = sorted(
            (r for r in records if _sort_value(r, sort) is None),
            key=lambda r: r.id,
            reverse=descending,
        )
        ordered = present + missing
        return Page(ordered[offset : offset + limit], len(ordered), offset, limit)

    def get_model_definition(self, experiment_id: int) -> bytes:
        with self.database.read() as db:
            row = db["experiments"].get(experiment_id)
            if row is None:
                raise NotFoundError(f"experiment {experiment_id} does not exist")
            return bytes(row["model_definition"])

    def model_definition_bytes(self, owner_id: int) -> int:
        with self.database.read() as db:
            rows = db["experiments"].values()
            return sum(len(r["model_definition"]) for r in rows if r["owner_id"] == owner_id)

    def update_experiment(self, experiment_id: int, **fields: Any) -> None:
        """Set the named fields (idempotent)."""
        unknown = set(fields) - EXPERIMENT_FIELDS
        if unknown:
            raise InvalidArgumentError(f"cannot update experiment fields {sorted(unknown)}")
        with self.database.write() as tx:
            if experiment_id not in tx["experiments"]:
                raise NotFoundError(f"experiment {experiment_id} does not exist")
            tx.update("experiments", experiment_id, **stored_fields("experiments", fields))

    def delete_experiment(self, experiment_id: int) -> None:
        """Delete an ended experiment's rows (its usage records stay); `ConflictError` if
        it has not ended. No model version pins a checkpoint here."""
        with self.database.write() as tx:
            experiment = tx["experiments"].get(experiment_id)
            if experiment is None:
                raise NotFoundError(f"experiment {experiment_id} does not exist")
            if experiment["state"] not in ENDED_EXPERIMENT:
                raise ConflictError(
                    f"experiment {experiment_id} is {experiment['state']}: only an ended "
                    "experiment (COMPLETED, CANCELED or ERROR) can be deleted"
                )
            trials = {t for t, row in tx["trials"].items() if row["experiment_id"] == experiment_id}
            for table in ("metrics", "task_logs", "allocations", "checkpoints"):
                for key, row in list(tx[table].items()):
                    trial_id = key[0] if table == "metrics" else row["trial_id"]
                    if trial_id in trials:
                        tx.delete(table, key)
            for trial_id in trials:
                tx.delete("trials", trial_id)
            for key in [k for k in tx["labels"] if k[0] == experiment_id]:
                tx.delete("labels", key)
            tx.delete("experiments", experiment_id)

    def get_trial(self, trial_id: int) -> TrialRecord:
        with self.database.read() as db:
            row = db["trials"].get(trial_id)
            if row is None:
                raise NotFoundError(f"trial {trial_id} does not exist")
            return _trial(row)

    def list_trials(self, experiment_id: int) -> list[TrialRecord]:
        with self.database.read() as db:
            rows = [t for t in db["trials"].values() if t["experiment_id"] == experiment_id]
            return [_trial(t) for t in sorted(rows, key=lambda t: int(t["id"]))]

    # --- metrics --------------------------------------------------------------------------

    def report_metrics(
        self,
        trial_id: int,
        run_id: int,
        group: str,
        reports: Sequence[MetricReport],
        *,
        max_names: int = METRIC_NAMES_PER_TRIAL,
    ) -> int:
        return self.report_metrics_and_progress(
            trial_id, run_id, group, reports, max_names=max_names
        ).stored

    def report_metrics_and_progress(
        self,
        trial_id: int,
        run_id: int,
        group: str,
        reports: Sequence[MetricReport],
        *,
        searcher_metric: str | None = None,
        smaller_is_better: bool = True,
        max_names: int = METRIC_NAMES_PER_TRIAL,
    ) -> MetricsReported:
        """Store the reports and raise the trial's progress, as `Store` does (idempotent,
        fenced by run, capped at `max_names` distinct names per trial)."""
        check_group(group)
        rows, names = flatten_reports(reports)
        latest = max((r.total_batches for r in reports), default=0)
        best = None
        if group == VALIDATION and searcher_metric is not None:
            best = best_value(rows, searcher_metric, smaller_is_better)
        with self.database.write() as tx:
            _check_run(tx, trial_id, run_id)
            _admit_names(tx, trial_id, group, names, max_names)
            stored = 0
            for batches, name, value in rows:
                key = (trial_id, group, name, batches, run_id)
                found = tx["metrics"].get(key)
                if found is None:
                    tx.insert("metrics", key, {"value": value, "superseded": False})
                    stored += 1
                elif found["value"] != value:
                    raise ConflictError(
                        f"trial {trial_id} run {run_id} already reported {group} metric "
                        f"{name!r} at batch {batches} as {found['value']!r}; a different "
                        f"value ({value!r}) is refused"
                    )
            total, best_validation = _advance(tx, trial_id, latest, best, smaller_is_better)
        return MetricsReported(stored, total, best_validation)

    def best_validation_through(
        self, trial_id: int, through_batches: int, metric: str, smaller_is_better: bool
    ) -> float | None:
        with self.database.read() as db:
            return live_best(db["metrics"], trial_id, metric, smaller_is_better, through_batches)

    # --- checkpoints ----------------------------------------------------------------------

    def add_checkpoint(self, record: CheckpointRecord) -> None:
        """Record a checkpoint of the trial's current run (idempotent, fenced by run)."""
        with self.database.write() as tx:
            trial = tx["trials"].get(record.trial_id)
            if trial is None:
                raise NotFoundError(f"trial {record.trial_id} does not exist")
            existing = tx["checkpoints"].get(record.uuid)
            if existing is not None:
                if _checkpoint(existing) != record:
                    raise ConflictError(
                        f"checkpoint {record.uuid} is already recorded with other content"
                    )
                return
            if record.run_id != trial["run_id"]:
                raise StaleRunError(
                    f"trial {record.trial_id} is on run {trial['run_id']}; a checkpoint from "
                    f"run {record.run_id} comes from a process that was replaced and is refused"
                )
            tx.insert("checkpoints", record.uuid, _checkpoint_row(record))
            if record.total_batches >= trial["total_batches"]:
                tx.update(
                    "trials",
                    record.trial_id,
                    latest_checkpoint=record.uuid,
                    total_batches=record.total_batches,
                )

    def get_checkpoint(self, uuid: str) -> CheckpointRecord:
        with self.database.read() as db:
            row = db["checkpoints"].get(uuid)
            if row is None:
                raise NotFoundError(f"checkpoint {uuid} does not exist")
            return _validated(db, row)

    def list_checkpoints(self, trial_id: int) -> list[CheckpointRecord]:
        """The trial's checkpoints by batches, then by when they were recorded."""
        with self.database.read() as db:
            rows = [c for c in db["checkpoints"].values() if c["trial_id"] == trial_id]
            rows.sort(key=lambda c: int(c["total_batches"]))  # stable: recorded order
            return [_validated(db, c) for c in rows]

    def set_checkpoint_state(self, uuid: str, state: str) -> None:
        """Mark it; a DELETED latest checkpoint gives way to the newest one still stored."""
        with self.database.write() as tx:
            row = tx["checkpoints"].get(uuid)
            if row is None:
                raise NotFoundError(f"checkpoint {uuid} does not exist")
            tx.update("checkpoints", uuid, state=state)
            trial = tx["trials"].get(row["trial_id"])
            if state != DELETED or trial is None or trial["latest_checkpoint"] != uuid:
                return
            kept = [
                c
                for c in tx["checkpoints"].values()
                if c["trial_id"] == row["trial_id"] and c["state"] != DELETED
            ]
            # The newest by batches; of equals, the one recorded last.
            newest = max(reversed(kept), key=lambda c: int(c["total_batches"]), default=None)
            latest = None if newest is None else newest["uuid"]
            tx.update("trials", row["trial_id"], latest_checkpoint=latest)

    def checkpoint_references(self, uuids: Collection[str]) -> dict[str, list[tuple[str, int]]]:
        """None: this store has no model registry."""
        return {}

    def checkpoint_pins(self, uuids: Collection[str]) -> dict[str, list[tuple[str, int]]]:
        """None: this store has no model registry."""
        return {}

    # --- agents, allocations and usage -------------------------------------------

    def list_agents(self) -> list[AgentRecord]:
        with self.database.read() as db:
            return [
                AgentRecord(
                    a["id"],
                    a["address"],
                    a["slot_type"],
                    a["slots"],
                    list(a["devices"]),
                    a["state"],
                    a["last_heartbeat"],
                )
                for _, a in sorted(db["agents"].items())
            ]

    def agent_credentials(self) -> dict[str, str]:
        with self.database.read() as db:
            rows = db["agents"].values()
            return {a["id"]: a["credential_sha256"] for a in rows if a["credential_sha256"]}

    def active_allocations(self) -> list[AllocationRecord]:
        with self.database.read() as db:
            return [
                AllocationRecord(
                    a["id"],
                    a["trial_id"],
                    a["run_id"],
                    a["state"],
                    as_json(a["placement"]),
                    a["stopping"],
                )
                for _, a in sorted(db["allocations"].items())
                if a["ended_at"] is None
            ]

    def open_usage(self) -> list[tuple[str, str]]:
        with self.database.read() as db:
            return sorted(k for k, row in db["slot_usage"].items() if row["ended_at"] is None)


def _sort_value(record: ExperimentRecord, sort: str) -> Any:
    return getattr(record, sort)


def _trial(t: Row) -> TrialRecord:
    fields = {k: t[k] for k in TrialRecord.__dataclass_fields__}
    return TrialRecord(**{**fields, "hparams": as_json(t["hparams"])})


def _check_run(tx: Transaction, trial_id: int, run_id: int) -> None:
    """Fence: only the trial's current run may write."""
    trial = tx["trials"].get(trial_id)
    if trial is None:
        raise NotFoundError(f"trial {trial_id} does not exist")
    current = trial["run_id"]
    if run_id < current:
        raise StaleRunError(
            f"trial {trial_id} is on run {current}; a report from run {run_id} comes from a "
            "process that was replaced and is refused"
        )
    if run_id > current:
        raise ConflictError(f"trial {trial_id} has no run {run_id} (current run: {current})")


def _admit_names(
    tx: Transaction, trial_id: int, group: str, names: Collection[str], limit: int
) -> None:
    """`ResourceExhaustedError` if `names` would take the trial past `limit` distinct
    metric names (0: no limit), counting every name it reported (as the SQL store's
    cache does while its process lives)."""
    if limit <= 0:
        return
    known = {(g, n) for (t, g, n, _, _), row in tx["metrics"].items() if t == trial_id}
    new = {n for n in names if (group, n) not in known}
    if new and len(known) + len(new) > limit:
        raise ResourceExhaustedError(refusal(trial_id, len(known), new, limit))


def _advance(
    tx: Transaction, trial_id: int, latest: int, best: float | None, smaller_is_better: bool
) -> tuple[int, float | None]:
    """Raise total_batches to `latest`; move best_validation to `best` where that is
    better, or where the stored one is missing or not finite. Neither goes back."""
    trial = tx["trials"][trial_id]
    total = max(int(trial["total_batches"]), latest)
    stored = trial["best_validation"]
    if best is not None:
        usable = stored is not None and math.isfinite(stored)
        if not usable or (stored > best if smaller_is_better else stored < best):
            stored = best
    tx.update("trials", trial_id, total_batches=total, best_validation=stored)
    return total, stored


def _checkpoint_row(record: CheckpointRecord) -> Row:
    return {
        "uuid": record.uuid,
        "trial_id": record.trial_id,
        "run_id": record.run_id,
        "total_batches": record.total_batches,
        "state": record.state,
        "location": record.location,
        "files": as_json(dict(record.files)),
        "user_metadata": as_json(dict(record.user_metadata)),
    }


def _checkpoint(c: Row) -> CheckpointRecord:
    """The row as it was reported (what a retried report is compared with)."""
    return CheckpointRecord(
        uuid=c["uuid"],
        trial_id=c["trial_id"],
        run_id=c["run_id"],
        total_batches=c["total_batches"],
        state=c["state"],
        location=c["location"],
        files={k: int(v) for k, v in c["files"].items()},
        user_metadata=as_json(c["user_metadata"]),
    )


def _validated(db: MemoryDatabase, c: Row) -> CheckpointRecord:
    """The checkpoint with the validation its run reported at its batch count."""
    found: dict[str, float] = {}
    for (trial_id, group, name, batches, run_id), row in db["metrics"].items():
        if (trial_id, group, batches, run_id) == (
            c["trial_id"],
            VALIDATION,
            c["total_batches"],
            c["run_id"],
        ):
            found[name] = math.nan if row["value"] is None else row["value"]
    return with_validation(_checkpoint(c), found)


if TYPE_CHECKING:
    # Both stores are what a master needs: mypy checks each against every aggregate.
    def _sql_store_conforms(store: Store) -> MasterStore:
        return store

    def _memory_store_conforms(store: MemoryStore) -> MasterStore:
        return store


__all__ = ["MemoryDatabase", "MemoryStore"]
