"""`WriteBatch`: many state changes written in one transaction (group commit).

The master changes its in-memory state first and records each change here; one
transaction then writes a whole batch, and only after it commits does the master act
(send a start or kill to an agent, answer a call). A batch keeps its rows in a form that
writes cheaply: inserts are grouped per table and written with one executemany each, and
updates of the same row merge, so a trial created, started and finished between two
commits costs one insert.

Order within a batch: inserts (parents before children), then updates, then the usage
records opened and then closed (one statement each), then the ordered `call`s, then the
master's log lines (one statement for all of them). A call may
therefore rely on the rows the batch inserts; the master uses calls for writes whose
order matters among themselves (agent rows, superseding metrics).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Table, bindparam, delete, func, insert, select, update
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import Session

from assay.master.errors import InvalidArgumentError
from assay.master.store import _rollups, _usage
from assay.master.store._archive_file import ArchiveFile, ModelDefinition
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
TRIAL_FIELDS = frozenset(
    {
        "state",
        "run_id",
        "restarts",
        "total_batches",
        "best_validation",
        "latest_checkpoint",
        "start_time",
        "end_time",
        "last_error",
    }
)
EXPERIMENT_FIELDS = frozenset(
    {
        "state",
        "progress",
        "searcher_state",
        "archived",
        "priority",
        "config",  # resources patched by `experiment set`, lengths by `experiment continue`
        "config_text",  # `experiment continue`: the config it goes on with
        "description",
        "start_time",
        "end_time",
    }
)


class WriteBatch:
    """Rows to insert, fields to update and ordered calls, applied by `Store.apply`."""

    def __init__(self) -> None:
        self._inserts: dict[str, dict[Any, dict[str, Any]]] = {}
        self._updates: dict[str, dict[Any, dict[str, Any]]] = {}
        self._calls: list[Callable[[Session], object]] = []
        self._logs: list[dict[str, Any]] = []
        # Usage records opened, and closed (every part of an allocation, or one agent's).
        self._usage_opened: list[dict[str, Any]] = []
        self._usage_closed: list[dict[str, Any]] = []
        self._usage_closed_parts: list[dict[str, Any]] = []

    def __bool__(self) -> bool:
        return bool(
            self._inserts
            or self._updates
            or self._calls
            or self._logs
            or self._usage_opened
            or self._usage_closed
            or self._usage_closed_parts
        )

    def __len__(self) -> int:
        return (
            sum(len(rows) for rows in self._inserts.values())
            + sum(len(rows) for rows in self._updates.values())
            + len(self._calls)
            + len(self._logs)
            + len(self._usage_opened)
            + len(self._usage_closed)
            + len(self._usage_closed_parts)
        )

    def insert(self, table: Table, row: Mapping[str, Any]) -> None:
        """Insert `row` (it names its primary key, which must be a single column)."""
        key = row[_primary_key(table)]
        self._inserts.setdefault(table.name, {})[key] = dict(row)

    def update(self, table: Table, key: Any, **fields: Any) -> None:
        """Set `fields` of the row with primary key `key` (merged with earlier changes)."""
        pending = self._inserts.get(table.name, {}).get(key)
        if pending is not None:
            pending.update(fields)
            return
        self._updates.setdefault(table.name, {}).setdefault(key, {}).update(fields)

    def call(self, fn: Callable[[Session], object]) -> None:
        """Run `fn(session)` in the transaction, after the inserts and updates, in order."""
        self._calls.append(fn)

    # --- the master's rows ----------------------------------------------------------------

    def add_experiment(
        self,
        experiment_id: int,
        *,
        name: str,
        owner_id: int,
        config: Mapping[str, Any],
        model_definition: ModelDefinition,
        state: str,
        description: str,
        labels: Sequence[str],
        priority: int,
        now: dt.datetime,
        config_text: str | None = None,
        project_id: int | None = None,
    ) -> None:
        # A file is read when the row is written (a call, below), not held until then.
        inline = model_definition if isinstance(model_definition, bytes) else b""
        self.insert(
            _EXPERIMENTS,
            {
                "id": experiment_id,
                "name": name,
                "description": description,
                "owner_id": owner_id,
                "state": state,
                "config": dict(config),
                "model_definition": inline,
                "priority": priority,
                "progress": 0.0,
                "searcher_state": None,
                "archived": False,
                "created_at": now,
                "start_time": now,
                "end_time": None,
                "updated_at": now,
                # Only when given: a store written by tests at an older schema has no column.
                **({"config_text": config_text} if config_text is not None else {}),
                # Only when given: the column's default is the Default workspace's project.
                **({"project_id": project_id} if project_id is not None else {}),
            },
        )
        if isinstance(model_definition, ArchiveFile):
            archive = model_definition
            self.call(lambda s: _write_archive(s, experiment_id, archive))
        rows = [{"experiment_id": experiment_id, "label": label} for label in sorted(set(labels))]
        if rows:
            self.call(lambda s: s.execute(insert(ExperimentLabel), rows))

    def add_trial(
        self,
        trial_id: int,
        *,
        experiment_id: int,
        request_id: str,
        hparams: Mapping[str, Any],
        seed: int,
        state: str,
        now: dt.datetime,
        parent_trial_id: int | None = None,
        search_round: int | None = None,
    ) -> None:
        lineage = (
            {"parent_trial_id": parent_trial_id, "search_round": search_round}
            if parent_trial_id is not None or search_round is not None
            else {}  # only when given: a store written by tests at an older schema lacks them
        )
        self.insert(
            _TRIALS,
            {
                "id": trial_id,
                "experiment_id": experiment_id,
                "request_id": request_id,
                "hparams": dict(hparams),
                "seed": seed,
                "state": state,
                "run_id": 0,
                "restarts": 0,
                "total_batches": 0,
                "best_validation": None,
                "latest_checkpoint": None,
                "created_at": now,
                "start_time": None,
                "end_time": None,
                "last_error": None,
                **lineage,
            },
        )

    def add_allocation(
        self,
        allocation_id: str,
        *,
        trial_id: int,
        run_id: int,
        placement: list[Any],
        now: dt.datetime,
    ) -> None:
        self.insert(
            _ALLOCATIONS,
            {
                "id": allocation_id,
                "trial_id": trial_id,
                "run_id": run_id,
                "state": "ASSIGNED",
                "placement": placement,
                "created_at": now,
                "ended_at": None,
                "stopping": None,
            },
        )

    def usage_started(
        self,
        allocation_id: str,
        *,
        experiment_id: int,
        trial_id: int,
        run_id: int,
        parts: Sequence[_usage.UsagePart],
        now: dt.datetime,
    ) -> None:
        """Start the allocation's usage records, one per part."""
        started = _usage.utc(now)
        self._usage_opened += [
            {
                "allocation_id": allocation_id,
                "agent_id": part.agent_id,
                "slots": part.slots,
                "slot_type": part.slot_type,
                "pool": part.pool,
                "experiment_id": experiment_id,
                "trial_id": trial_id,
                "run_id": run_id,
                "started_at": started,
            }
            for part in parts
        ]

    def usage_ended(
        self, allocation_id: str, now: dt.datetime, *, agent_id: str | None = None
    ) -> None:
        """Close the allocation's open usage records (one agent's part, or all of them),
        after the records this batch opens. Idempotent: a record already closed keeps the
        end it has."""
        row = {"allocation_id": allocation_id, "ended_at": _usage.utc(now)}
        if agent_id is None:
            self._usage_closed.append(row)
        else:
            self._usage_closed_parts.append({**row, "agent_id": agent_id})

    def usage_orphans_closed(self, now: dt.datetime) -> None:
        """Close the usage records of allocations that are not open (a master's start)."""
        self.call(lambda s: _usage.close_orphans(s, now))

    def set_experiment(self, experiment_id: int, **fields: Any) -> None:
        _check_fields("experiment", fields, EXPERIMENT_FIELDS)
        self.update(_EXPERIMENTS, experiment_id, **fields)

    def set_trial(self, trial_id: int, **fields: Any) -> None:
        _check_fields("trial", fields, TRIAL_FIELDS)
        self.update(_TRIALS, trial_id, **fields)

    def rename_trial_request(self, trial_id: int, request_id: str) -> None:
        """Give a stored trial the request id its searcher knows it by (adoption)."""
        self.update(_TRIALS, trial_id, request_id=request_id)

    def set_allocation(self, allocation_id: str, **fields: Any) -> None:
        _check_fields("allocation", fields, frozenset({"state", "ended_at", "stopping"}))
        self.update(_ALLOCATIONS, allocation_id, **fields)

    def supersede_metrics(
        self,
        trial_id: int,
        after_batches: int,
        metric: str | None = None,
        smaller_is_better: bool = True,
    ) -> None:
        """Hide the trial's metrics past `after_batches` (a run restored from a checkpoint);
        its best_validation of `metric` becomes the best of what is left."""
        self.call(
            lambda s: _rollups.supersede(s, trial_id, after_batches, metric, smaller_is_better)
        )

    def log(
        self, trial_id: int, run_id: int, message: str, *, level: str, now: dt.datetime
    ) -> None:
        """Add a line of the master's own to the trial's logs (what happened to a run)."""
        self._logs.append(
            {
                "trial_id": trial_id,
                "run_id": run_id,
                "rank": 0,
                "stream": "stderr",
                "level": level,
                "timestamp": now,
                "message": message,
            }
        )

    def agent_registered(
        self,
        agent_id: str,
        *,
        slot_type: str,
        slots: int,
        devices: list[Any],
        address: str,
        now: dt.datetime,
        credential_sha256: str | None = None,
    ) -> None:
        """`credential_sha256`: the hash of the credential issued at this registration
        (None: the row keeps the one it has)."""
        values: dict[str, Any] = {
            "slot_type": slot_type,
            "slots": slots,
            "devices": list(devices),
            "address": address,
            "state": "ACTIVE",
            "last_heartbeat": now,
        }
        if credential_sha256 is not None:
            values["credential_sha256"] = credential_sha256

        def write(s: Session) -> None:
            # Insert or refresh: a reconnecting agent keeps its row and registration time.
            found = s.execute(update(_AGENTS).where(_AGENTS.c.id == agent_id).values(values))
            if not found.rowcount:  # type: ignore[attr-defined]
                s.execute(insert(_AGENTS).values(id=agent_id, registered_at=now, **values))

        self.call(write)

    def agent_state(self, agent_id: str, state: str) -> None:
        self.call(
            lambda s: s.execute(update(_AGENTS).where(_AGENTS.c.id == agent_id).values(state=state))
        )

    def agent_credential_withdrawn(self, agent_id: str, digest: str) -> None:
        """Forget a credential the agent was never told (it hung up first), unless the
        row holds another by now."""
        self.call(
            lambda s: s.execute(
                update(_AGENTS)
                .where(_AGENTS.c.id == agent_id, _AGENTS.c.credential_sha256 == digest)
                .values(credential_sha256=None)
            )
        )

    def agent_removed(self, agent_id: str) -> None:
        """Forget the agent and its credential (`assay agent remove`): its name is free."""
        self.call(lambda s: s.execute(delete(_AGENTS).where(_AGENTS.c.id == agent_id)))

    # --- writing ----------------------------------------------------------------------------

    def apply(self, session: Session) -> None:
        """Write everything in `session`'s transaction (the caller commits)."""
        connection = session.connection()
        tables = Base.metadata.tables
        for name in sorted(self._inserts, key=_TABLE_ORDER.__getitem__):
            table = tables[name]
            by_shape: dict[tuple[str, ...], list[dict[str, Any]]] = {}
            for row in self._inserts[name].values():
                by_shape.setdefault(tuple(sorted(row)), []).append(row)
            for shape, rows in by_shape.items():
                _executemany(connection, _statement(connection, "insert", table, shape), rows)
        for name in sorted(self._updates, key=_TABLE_ORDER.__getitem__):
            table = tables[name]
            by_fields: dict[tuple[str, ...], list[dict[str, Any]]] = {}
            for key, fields in self._updates[name].items():
                params = dict(fields)
                params[_KEY] = key
                by_fields.setdefault(tuple(sorted(fields)), []).append(params)
            for shape, params_list in by_fields.items():
                statement = _statement(connection, "update", table, shape)
                _executemany(connection, statement, params_list)
        for kind, rows in (
            ("usage-open", self._usage_opened),
            ("usage-close", self._usage_closed),
            ("usage-close-part", self._usage_closed_parts),
        ):
            if rows:
                _executemany(connection, _usage_statement(connection, kind), rows)
        for fn in self._calls:
            fn(session)
        if self._logs:
            _write_logs(session, self._logs)


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


def _check_fields(kind: str, fields: Mapping[str, Any], allowed: frozenset[str]) -> None:
    if not allowed.issuperset(fields):
        unknown = set(fields) - allowed
        raise InvalidArgumentError(f"cannot update {kind} fields {sorted(unknown)}")


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
