"""The in-memory store's writing of a `WriteBatch`, in the order the SQL store writes it.

Inserts (parents first), updates, usage records opened and closed, the steps in order,
then the master's log lines: the same rows, the same defaults, and the same refusals
(a key taken, a parent missing) as _batch_sql.py, in one `Transaction`.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping
from typing import Any

from assay.master.errors import ConflictError, NotFoundError
from assay.master.store._batch import (
    TABLES,
    AgentCredentialWithdrawn,
    AgentRegistered,
    AgentRemoved,
    AgentStateSet,
    ArchiveWritten,
    LabelsAdded,
    MetricsSuperseded,
    Step,
    UsageOrphansClosed,
    WriteBatch,
)
from assay.master.store._memory_tables import DEFAULT_PROJECT_ID, Row, Transaction, as_json
from assay.master.store._metrics import VALIDATION

# Columns a batch's row may leave out, and what the SQL schema gives them then.
_DEFAULTS: dict[str, Row] = {
    "experiments": {"config_text": None, "project_id": DEFAULT_PROJECT_ID},
    "trials": {"parent_trial_id": None, "search_round": None},
    "allocations": {},
}
_JSON = {
    "experiments": ("config", "searcher_state"),
    "trials": ("hparams",),
    "allocations": ("placement",),
}
# The parent each table's rows must have: (column, table).
_PARENTS = {
    "experiments": ("project_id", "projects"),
    "trials": ("experiment_id", "experiments"),
    "allocations": ("trial_id", "trials"),
}


def write_batch(tx: Transaction, batch: WriteBatch) -> None:
    """Write everything in `tx` (the caller's transaction)."""
    for table in TABLES:
        for key, row in batch.inserts.get(table, {}).items():
            _insert(tx, table, key, {**_DEFAULTS[table], **row})
    for table in TABLES:
        for key, fields in batch.updates.get(table, {}).items():
            tx.update(table, key, **stored_fields(table, fields))  # no row: nothing, as in SQL
    for opened in batch.usage_opened:
        _usage_opened(tx, opened)
    for closed in batch.usage_closed:
        _usage_closed(tx, closed["allocation_id"], closed["ended_at"], None)
    for closed in batch.usage_closed_parts:
        _usage_closed(tx, closed["allocation_id"], closed["ended_at"], closed["agent_id"])
    for step in batch.steps:
        _STEPS[type(step)](tx, step)
    for line in batch.logs:
        _require(tx, "trials", line["trial_id"], "task_logs")
        log_id = tx.db.new_id("task_logs")
        tx.insert("task_logs", log_id, {"id": log_id, **line})


def stored_fields(table: str, fields: Row) -> Row:
    """`fields` as the columns give them back: JSON as JSON, an enum as its value."""
    json_columns = _JSON.get(table, ())
    return {k: as_json(v) if k in json_columns else _plain(v) for k, v in fields.items()}


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, enum.Enum) else value


def _require(tx: Transaction, table: str, key: Any, child: str) -> None:
    if key not in tx[table]:
        raise NotFoundError(f"{child}: no row {key!r} in {table} (a foreign key)")


def _insert(tx: Transaction, table: str, key: Any, row: Row) -> None:
    column, parent = _PARENTS[table]
    _require(tx, parent, row[column], table)
    try:
        tx.insert(table, key, stored_fields(table, row))
    except KeyError as e:
        raise ConflictError(str(e)) from None


def _usage_opened(tx: Transaction, row: Row) -> None:
    """A usage record charged to the experiment's owner (user 0 if it has no row)."""
    experiment = tx["experiments"].get(row["experiment_id"])
    key = (row["allocation_id"], row["agent_id"])
    record = {**row, "user_id": experiment["owner_id"] if experiment else 0, "ended_at": None}
    try:
        tx.insert("slot_usage", key, record)
    except KeyError as e:
        raise ConflictError(str(e)) from None


def _usage_closed(tx: Transaction, allocation_id: str, ended_at: Any, agent_id: str | None) -> None:
    for key, row in list(tx["slot_usage"].items()):
        if key[0] == allocation_id and row["ended_at"] is None and agent_id in (None, key[1]):
            tx.update("slot_usage", key, ended_at=ended_at)


# --- the steps, each by its own function (`_STEPS`) -----------------------------------------


def _archive(tx: Transaction, step: ArchiveWritten) -> None:
    tx.update("experiments", step.experiment_id, model_definition=step.archive.read())


def _labels(tx: Transaction, step: LabelsAdded) -> None:
    for label in step.labels:
        _require(tx, "experiments", step.experiment_id, "labels")
        try:
            tx.insert("labels", (step.experiment_id, label), {})
        except KeyError as e:
            raise ConflictError(str(e)) from None


def _orphans(tx: Transaction, step: UsageOrphansClosed) -> None:
    """Close every open record whose allocation is not open: at its end, else now."""
    for key, row in list(tx["slot_usage"].items()):
        if row["ended_at"] is not None:
            continue
        allocation = tx["allocations"].get(row["allocation_id"])
        if allocation is not None and allocation["ended_at"] is None:
            continue
        ended = allocation["ended_at"] if allocation is not None else None
        tx.update("slot_usage", key, ended_at=ended if ended is not None else step.now)


def _supersede(tx: Transaction, step: MetricsSuperseded) -> None:
    for key, row in list(tx["metrics"].items()):
        if key[0] == step.trial_id and key[3] > step.after_batches and not row["superseded"]:
            tx.update("metrics", key, superseded=True)
    if step.metric is not None:
        best = live_best(tx["metrics"], step.trial_id, step.metric, step.smaller_is_better)
        tx.update("trials", step.trial_id, best_validation=best)


def live_best(
    metrics: Mapping[Any, Row],
    trial_id: int,
    metric: str,
    smaller_is_better: bool,
    through_batches: int | None = None,
) -> float | None:
    """The best finite live validation value of `metric` the trial reported (at or before
    `through_batches` where given), or None: `_rollups.live_best` on the metrics table."""
    values: list[float] = [
        row["value"]
        for key, row in metrics.items()
        if key[0] == trial_id
        and key[1] == VALIDATION
        and key[2] == metric
        and (through_batches is None or key[3] <= through_batches)
        and not row["superseded"]
        and row["value"] is not None
        and math.isfinite(row["value"])
    ]
    if not values:
        return None
    return min(values) if smaller_is_better else max(values)


def _agent_registered(tx: Transaction, step: AgentRegistered) -> None:
    values = {k: as_json(v) if k == "devices" else _plain(v) for k, v in step.values.items()}
    if not tx.update("agents", step.agent_id, **values):
        row = {"address": "", "devices": [], "credential_sha256": None, **values}
        tx.insert("agents", step.agent_id, {**row, "id": step.agent_id, "registered_at": step.now})


def _agent_state(tx: Transaction, step: AgentStateSet) -> None:
    tx.update("agents", step.agent_id, state=_plain(step.state))


def _credential_withdrawn(tx: Transaction, step: AgentCredentialWithdrawn) -> None:
    row = tx["agents"].get(step.agent_id)
    if row is not None and row["credential_sha256"] == step.digest:
        tx.update("agents", step.agent_id, credential_sha256=None)


def _agent_removed(tx: Transaction, step: AgentRemoved) -> None:
    tx.delete("agents", step.agent_id)


_STEPS: dict[type[Step], Callable[[Transaction, Any], None]] = {
    ArchiveWritten: _archive,
    LabelsAdded: _labels,
    UsageOrphansClosed: _orphans,
    MetricsSuperseded: _supersede,
    AgentRegistered: _agent_registered,
    AgentStateSet: _agent_state,
    AgentCredentialWithdrawn: _credential_withdrawn,
    AgentRemoved: _agent_removed,
}


__all__ = ["stored_fields", "write_batch"]
