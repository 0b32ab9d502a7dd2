"""The SQL store's writing of a `WriteBatch`: one transaction, a few statements.

Inserts are grouped per table and shape and written with one executemany each, updates
grouped by the fields they set; the statements are compiled once per dialect and shape
and handed to the driver with plain parameters (see `_Prepared`). The batch's steps run
in order after them, and the master's log lines go last in one statement.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Table, bindparam, delete, func, insert, select, update
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import Session

from assay.master.store import _rollups, _usage
from assay.master.store._archive_file import ArchiveFile
from assay.master.store._batch import (
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
from assay.master.store._engine import CLOSE_AT_CHECKIN
from assay.master.store._models import (
    Agent,
    Allocation,
    Base,
    Experiment,
    ExperimentLabel,
    TaskLog,
    Trial,
)

_TABLE_ORDER = {table.name: i for i, table in enumerate(Base.metadata.sorted_tables)}
_EXPERIMENTS: Table = Experiment.__table__  # type: ignore[assignment]
# Bound at execution, never in the statement: a compiled statement is cached, and would
# keep the last archive it was built with.
_SET_MODEL_DEFINITION = (
    update(_EXPERIMENTS)
    .where(_EXPERIMENTS.c.id == bindparam("eid"))
    .values(model_definition=bindparam("archive"))
)
_ARCHIVE_PIECE = 1 << 20
_TRIALS: Table = Trial.__table__  # type: ignore[assignment]
_ALLOCATIONS: Table = Allocation.__table__  # type: ignore[assignment]
_AGENTS: Table = Agent.__table__  # type: ignore[assignment]
_TASK_LOGS: Table = TaskLog.__table__  # type: ignore[assignment]


def write_batch(session: Session, batch: WriteBatch) -> None:
    """Write everything in `session`'s transaction (the caller commits)."""
    connection = session.connection()
    tables = Base.metadata.tables
    for name in sorted(batch.inserts, key=_TABLE_ORDER.__getitem__):
        table = tables[name]
        by_shape: dict[tuple[str, ...], list[dict[str, Any]]] = {}
        for row in batch.inserts[name].values():
            by_shape.setdefault(tuple(sorted(row)), []).append(dict(row))
        for shape, rows in by_shape.items():
            _executemany(connection, _statement(connection, "insert", table, shape), rows)
    for name in sorted(batch.updates, key=_TABLE_ORDER.__getitem__):
        table = tables[name]
        by_fields: dict[tuple[str, ...], list[dict[str, Any]]] = {}
        for key, fields in batch.updates[name].items():
            params = dict(fields)
            params[_KEY] = key
            by_fields.setdefault(tuple(sorted(fields)), []).append(params)
        for shape, params_list in by_fields.items():
            statement = _statement(connection, "update", table, shape)
            _executemany(connection, statement, params_list)
    for kind, rows in (
        ("usage-open", batch.usage_opened),
        ("usage-close", batch.usage_closed),
        ("usage-close-part", batch.usage_closed_parts),
    ):
        if rows:
            _executemany(connection, _usage_statement(connection, kind), [dict(r) for r in rows])
    for step in batch.steps:
        _STEPS[type(step)](session, step)
    if batch.logs:
        _write_logs(session, [dict(r) for r in batch.logs])


# --- the steps, each by its own function (`_STEPS`) -----------------------------------------


def _archive(session: Session, step: ArchiveWritten) -> None:
    _write_archive(session, step.experiment_id, step.archive)


def _labels(session: Session, step: LabelsAdded) -> None:
    rows = [{"experiment_id": step.experiment_id, "label": label} for label in step.labels]
    session.execute(insert(ExperimentLabel), rows)


def _orphans(session: Session, step: UsageOrphansClosed) -> None:
    _usage.close_orphans(session, step.now)


def _supersede(session: Session, step: MetricsSuperseded) -> None:
    _rollups.supersede(
        session, step.trial_id, step.after_batches, step.metric, step.smaller_is_better
    )


def _agent_registered(session: Session, step: AgentRegistered) -> None:
    values, agent_id = dict(step.values), step.agent_id
    found = session.execute(update(_AGENTS).where(_AGENTS.c.id == agent_id).values(values))
    if not found.rowcount:  # type: ignore[attr-defined]
        session.execute(insert(_AGENTS).values(id=agent_id, registered_at=step.now, **values))


def _agent_state(session: Session, step: AgentStateSet) -> None:
    session.execute(update(_AGENTS).where(_AGENTS.c.id == step.agent_id).values(state=step.state))


def _credential_withdrawn(session: Session, step: AgentCredentialWithdrawn) -> None:
    session.execute(
        update(_AGENTS)
        .where(_AGENTS.c.id == step.agent_id, _AGENTS.c.credential_sha256 == step.digest)
        .values(credential_sha256=None)
    )


def _agent_removed(session: Session, step: AgentRemoved) -> None:
    session.execute(delete(_AGENTS).where(_AGENTS.c.id == step.agent_id))


_STEPS: dict[type[Step], Callable[[Session, Any], None]] = {
    ArchiveWritten: _archive,
    LabelsAdded: _labels,
    UsageOrphansClosed: _orphans,
    MetricsSuperseded: _supersede,
    AgentRegistered: _agent_registered,
    AgentStateSet: _agent_state,
    AgentCredentialWithdrawn: _credential_withdrawn,
    AgentRemoved: _agent_removed,
}


def _write_archive(session: Session, experiment_id: int, archive: ArchiveFile) -> None:
    """Set the experiment's model definition from a file, so that no copy of it stays in
    memory once written. SQLite takes it in pieces (incremental blob I/O into a
    zeroblob): it keeps the values bound to a cached statement until that is run again,
    so a blob bound whole would stay. PostgreSQL takes the bytes whole; its client keeps
    a send buffer as large as the largest message it sent, so the connection is closed
    when it goes back to the pool, after the commit."""
    connection = session.connection()
    if connection.dialect.name != "sqlite":
        params = {"eid": experiment_id, "archive": archive.read()}
        connection.execute(_SET_MODEL_DEFINITION, params)
        connection.connection.info[CLOSE_AT_CHECKIN] = True
        return
    connection.execute(
        update(_EXPERIMENTS)
        .where(_EXPERIMENTS.c.id == bindparam("eid"))
        .values(model_definition=func.zeroblob(bindparam("size"))),
        {"eid": experiment_id, "size": archive.size},
    )
    raw: Any = connection.connection.driver_connection  # the sqlite3.Connection
    blob = raw.blobopen("experiments", "model_definition", experiment_id)
    with blob, archive.path.open("rb") as source:
        while piece := source.read(_ARCHIVE_PIECE):
            blob.write(piece)


# The bind name of the primary key in the updates `apply` writes (not a column name).
_KEY = "_pk_"


@dataclass(frozen=True)
class _Prepared:
    """An INSERT or UPDATE compiled once for a dialect and a set of columns.

    `apply` hands the driver plain parameters through it: SQLAlchemy's per-execution work
    (building the statement, its cache key, one parameter dict per row) is most of a
    batch's cost otherwise. `binds` lists each parameter as (name, type processor or
    None) in the order the SQL takes them; `defaults` the columns the rows do not carry
    whose Python-side default (or, for an update, `onupdate`) the driver must be given.
    """

    sql: str
    binds: tuple[tuple[str, Callable[[Any], Any] | None], ...]
    defaults: tuple[tuple[str, Callable[[], Any]], ...]
    positional: bool


_PREPARED: dict[tuple[str, str, str, tuple[str, ...]], _Prepared] = {}


def _cached(
    connection: Connection,
    key: tuple[str, str, tuple[str, ...]],
    build: Callable[[Dialect], _Prepared],
) -> _Prepared:
    """The statement `key` names, compiled for the connection's dialect once."""
    dialect = connection.dialect
    prepared = _PREPARED.get((dialect.name, *key))
    if prepared is None:
        prepared = _PREPARED[(dialect.name, *key)] = build(dialect)
    return prepared


def _statement(
    connection: Connection, kind: str, table: Table, shape: tuple[str, ...]
) -> _Prepared:
    return _cached(connection, (kind, table.name, shape), lambda d: _prepare(d, kind, table, shape))


def _prepare(dialect: Dialect, kind: str, table: Table, shape: tuple[str, ...]) -> _Prepared:
    if kind == "insert":
        statement: Any = insert(table).values({c: bindparam(c) for c in shape})
        missing = [c for c in table.columns if c.name not in shape and c.default is not None]
        pairs = [(c, c.default) for c in missing]
        statement = statement.values({c.name: bindparam(c.name) for c, _ in pairs})
    else:
        statement = (
            update(table)
            .where(table.c[_primary_key(table)] == bindparam(_KEY))
            .values({c: bindparam(c) for c in shape})
        )
        missing = [c for c in table.columns if c.name not in shape and c.onupdate is not None]
        pairs = [(c, c.onupdate) for c in missing]
        statement = statement.values({c.name: bindparam(c.name) for c, _ in pairs})
    defaults = tuple((column.name, _default_of(column.name, d)) for column, d in pairs)
    return _compile(dialect, statement, defaults)


_USAGE_STATEMENTS: dict[str, Callable[[], Any]] = {
    "usage-open": _usage.open_statement,
    "usage-close": lambda: _usage.close_statement(one_agent=False),
    "usage-close-part": lambda: _usage.close_statement(one_agent=True),
}


def _usage_statement(connection: Connection, kind: str) -> _Prepared:
    return _cached(connection, (kind, "", ()), lambda d: _compile(d, _USAGE_STATEMENTS[kind](), ()))


def _compile(
    dialect: Dialect, statement: Any, defaults: tuple[tuple[str, Callable[[], Any]], ...]
) -> _Prepared:
    compiled = statement.compile(dialect=dialect)
    processors = compiled._bind_processors  # the column types' own converters
    positional = bool(compiled.positional)
    names = list(compiled.positiontup or ()) if positional else list(compiled.binds)
    binds = tuple((name, processors.get(name)) for name in names)
    return _Prepared(str(compiled), binds, defaults, positional)


def _default_of(column: str, default: Any) -> Callable[[], Any]:
    """A column's scalar or zero-argument Python default as a function of nothing."""
    if getattr(default, "is_scalar", False):
        value = default.arg
        return lambda: value
    if getattr(default, "is_callable", False):
        fn = default.arg  # SQLAlchemy wraps a plain callable to take the execution context
        return lambda: fn(None)
    raise ValueError(f"column {column}: only scalar or callable defaults can be batched")


def _executemany(connection: Connection, prepared: _Prepared, rows: list[dict[str, Any]]) -> None:
    for name, default in prepared.defaults:
        value = default()  # one value for the batch, as one statement would give
        for row in rows:
            row.setdefault(name, value)
    binds = prepared.binds
    params: list[Any]
    if prepared.positional:
        params = [tuple(row[n] if p is None else p(row[n]) for n, p in binds) for row in rows]
    else:
        params = [{n: row[n] if p is None else p(row[n]) for n, p in binds} for row in rows]
    connection.exec_driver_sql(prepared.sql, params)


def _write_logs(session: Session, rows: list[dict[str, Any]]) -> None:
    """The master's log lines, after everything else: one statement for the whole batch.

    Serialised with the agents' appends of the same trials, as `Store.append_logs` is (on
    PostgreSQL the trials' rows are locked in id order, so two writers cannot deadlock;
    SQLite has one writer at a time anyway).
    """
    if session.get_bind().dialect.name == "postgresql":
        trial_ids = sorted({row["trial_id"] for row in rows})
        session.execute(
            select(_TRIALS.c.id)
            .where(_TRIALS.c.id.in_(trial_ids))
            .order_by(_TRIALS.c.id)
            .with_for_update()
        )
    connection = session.connection()
    by_shape: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for row in rows:
        by_shape.setdefault(tuple(sorted(row)), []).append(row)
    for shape, same in by_shape.items():
        _executemany(connection, _statement(connection, "insert", _TASK_LOGS, shape), same)


_PRIMARY_KEYS: dict[Table, str] = {}  # every row a batch inserts asks: looked up once


def _primary_key(table: Table) -> str:
    found = _PRIMARY_KEYS.get(table)
    if found is None:
        columns = list(table.primary_key.columns)
        if len(columns) != 1:
            raise ValueError(
                f"table {table.name} has a composite primary key: write it with call()"
            )
        found = _PRIMARY_KEYS[table] = columns[0].name
    return found
