"""`Store`: every read and write of the master's state, one transaction per call.

Each write method says how it behaves when retried: the master retries through
outages, so writes are idempotent where a retry is possible.
"""

from __future__ import annotations

import datetime as dt
import secrets
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, delete, exists, func, insert, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from assay.master.errors import (
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
    StaleRunError,
)
from assay.master.store import _metrics
from assay.master.store._batch import EXPERIMENT_FIELDS, WriteBatch
from assay.master.store._engine import make_engine, writer
from assay.master.store._migrate import migrate
from assay.master.store._models import (
    Agent,
    Allocation,
    Checkpoint,
    Experiment,
    ExperimentLabel,
    LoginSession,
    SchemaInfo,
    TaskLog,
    Trial,
    User,
)
from assay.master.store._records import (
    AgentRecord,
    AllocationRecord,
    CheckpointRecord,
    Credentials,
    ExperimentRecord,
    LogLine,
    MetricReport,
    Page,
    SessionRecord,
    TrialRecord,
    UserRecord,
)

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
_ID_BLOCK = 32


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Store:
    """The experiment store on one database (SQLite or PostgreSQL)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._writer = writer(engine)
        self._user_ids: dict[str, int] = {}  # users are never deleted: ids are stable
        self._ids: dict[str, list[int]] = {}  # reserved, unused ids per table
        self._id_lock = threading.Lock()
        self._sqlite_top: dict[str, int] = {}  # the largest id handed out per table

    @classmethod
    def open(cls, url: str, *, migrate_schema: bool = True) -> Store:
        """Connect to `url`, creating or upgrading the schema unless told not to."""
        engine = make_engine(url)
        if migrate_schema:
            try:
                migrate(engine)
            except BaseException:
                engine.dispose()
                raise
        return cls(engine)

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def write(self) -> Iterator[Session]:
        """One write transaction: committed on success, rolled back on any error."""
        with Session(self._writer, expire_on_commit=False) as session, session.begin():
            yield session

    @contextmanager
    def read(self) -> Iterator[Session]:
        with Session(self.engine, expire_on_commit=False) as session, session.begin():
            yield session

    def apply(self, batch: WriteBatch) -> None:
        """Write a batch of changes in one transaction (all or nothing)."""
        if batch:
            with self.write() as s:
                batch.apply(s)

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

    def secret(self, name: str) -> bytes:
        """A random secret kept in the database, made on first use (the same for every
        master on this database, and across restarts)."""
        key = f"secret:{name}"
        for _ in range(2):
            with self.read() as s:
                found = s.execute(select(SchemaInfo.value).where(SchemaInfo.key == key)).scalar()
            if found is not None:
                return bytes.fromhex(found)
            try:
                with self.write() as s:
                    s.add(SchemaInfo(key=key, value=secrets.token_hex(32)))
            except IntegrityError:
                pass  # another master made it first: read theirs
        raise ConflictError(f"cannot read or create the secret {name!r}")

    # --- users ----------------------------------------------------------------------------

    def create_user(
        self, username: str, *, password_hash: str | None = None, admin: bool = False
    ) -> UserRecord:
        """Create a user; creating an existing one is refused."""
        try:
            with self.write() as s:
                user = User(username=username, password_hash=password_hash, admin=admin)
                s.add(user)
                s.flush()
                return _user(user)
        except IntegrityError:
            raise ConflictError(f"user {username!r} already exists") from None

    def get_user(self, username: str) -> UserRecord:
        with self.read() as s:
            user = s.execute(select(User).where(User.username == username)).scalar()
            if user is None:
                raise NotFoundError(f"user {username!r} does not exist")
            return _user(user)

    def ensure_user(self, username: str) -> UserRecord:
        """The user named `username`, created if missing (idempotent)."""
        try:
            return self.get_user(username)
        except NotFoundError:
            try:
                return self.create_user(username)
            except ConflictError:
                return self.get_user(username)

    def user_id(self, username: str) -> int:
        """The id of `username`, created if missing (cached: users are never deleted)."""
        found = self._user_ids.get(username)
        if found is None:
            found = self._user_ids[username] = self.ensure_user(username).id
        return found

    def get_credentials(self, username: str) -> Credentials:
        """The user with its password hash, to check a login."""
        with self.read() as s:
            user = s.execute(select(User).where(User.username == username)).scalar()
            if user is None:
                raise NotFoundError(f"user {username!r} does not exist")
            return Credentials(_user(user), user.password_hash)

    def list_users(self) -> list[UserRecord]:
        with self.read() as s:
            return [_user(u) for u in s.execute(select(User).order_by(User.username)).scalars()]

    def set_password_hash(
        self, username: str, password_hash: str | None, *, keep_session: str | None = None
    ) -> UserRecord:
        """Replace the user's password hash and end its sessions, in one transaction.

        The session whose token hash is `keep_session` survives (the one that changed
        the password). Idempotent.
        """
        with self.write() as s:
            user = _locked_user(s, username)
            user.password_hash = password_hash
            _end_sessions(s, user.id, keep_session)
            return _user(user)

    def set_user_active(self, username: str, active: bool) -> UserRecord:
        """(De)activate a user; deactivating ends its sessions in the same transaction.

        Idempotent.
        """
        with self.write() as s:
            user = _locked_user(s, username)
            user.active = active
            if not active:
                _end_sessions(s, user.id, None)
            return _user(user)

    def set_user_admin(self, username: str, admin: bool) -> UserRecord:
        """Grant or withdraw admin rights (idempotent)."""
        with self.write() as s:
            user = _locked_user(s, username)
            user.admin = admin
            return _user(user)

    def claim_admin(self, username: str, password_hash: str) -> bool:
        """Make `username` an active admin with this password, unless an active admin
        with a password exists already; return whether it did.

        Masters starting together on one database claim once: the check and the
        write share a transaction that holds the user's row.
        """
        self.ensure_user(username)
        with self.write() as s:
            user = _locked_user(s, username)
            usable = exists().where(
                User.admin.is_(True), User.active.is_(True), User.password_hash.is_not(None)
            )
            if s.execute(select(usable)).scalar():
                return False
            user.password_hash, user.admin, user.active = password_hash, True, True
            _end_sessions(s, user.id, None)
            return True

    # --- sessions -------------------------------------------------------------------------

    def create_session(
        self,
        user_id: int,
        token_hash: str,
        expires_at: dt.datetime,
        *,
        peer: str = "",
        created_at: dt.datetime | None = None,
    ) -> SessionRecord:
        """Record a login of an active user (not idempotent: each call is a session)."""
        with self.write() as s:
            user = s.get(User, user_id, with_for_update=True)
            if user is None:
                raise NotFoundError(f"user {user_id} does not exist")
            if not user.active:
                raise ConflictError(f"user {user.username!r} is deactivated")
            row = LoginSession(
                user_id=user_id,
                token_hash=token_hash,
                peer=peer[:255],
                created_at=_utc(created_at or _now()),
                expires_at=_utc(expires_at),
            )
            s.add(row)
            s.flush()
            return _session(row, user)

    def get_session(self, token_hash: str) -> SessionRecord:
        """The session with this token hash, and its user's current state."""
        with self.read() as s:
            found = s.execute(
                select(LoginSession, User)
                .join(User, User.id == LoginSession.user_id)
                .where(LoginSession.token_hash == token_hash)
            ).first()
            if found is None:
                raise NotFoundError("no such session")
            return _session(found[0], found[1])

    def list_sessions(self, user_id: int) -> list[SessionRecord]:
        """The user's sessions, oldest first (expired ones too, until purged)."""
        with self.read() as s:
            rows = s.execute(
                select(LoginSession, User)
                .join(User, User.id == LoginSession.user_id)
                .where(LoginSession.user_id == user_id)
                .order_by(LoginSession.id)
            ).all()
            return [_session(row, user) for row, user in rows]

    def touch_session(self, token_hash: str, used_at: dt.datetime) -> None:
        """Note when the session was last used (idempotent; a gone session is ignored)."""
        with self.write() as s:
            row = s.execute(
                select(LoginSession).where(LoginSession.token_hash == token_hash)
            ).scalar()
            if row is not None:
                row.last_used_at = _utc(used_at)

    def delete_session(self, token_hash: str) -> bool:
        """End one session; return whether it existed (idempotent)."""
        with self.write() as s:
            query = delete(LoginSession).where(LoginSession.token_hash == token_hash)
            return bool(s.execute(query).rowcount)  # type: ignore[attr-defined]

    def purge_expired_sessions(self, now: dt.datetime) -> int:
        """Delete sessions that expired before `now`; return how many (idempotent)."""
        with self.write() as s:
            query = delete(LoginSession).where(LoginSession.expires_at <= _utc(now))
            return int(s.execute(query).rowcount)  # type: ignore[attr-defined]

    # --- experiments ----------------------------------------------------------------------

    def get_experiment(self, experiment_id: int) -> ExperimentRecord:
        with self.read() as s:
            row = s.execute(_experiment_query().where(Experiment.id == experiment_id)).first()
            if row is None:
                raise NotFoundError(f"experiment {experiment_id} does not exist")
            return _experiment(s, row[0], row[1])

    def get_model_definition(self, experiment_id: int) -> bytes:
        with self.read() as s:
            data = s.execute(
                select(Experiment.model_definition).where(Experiment.id == experiment_id)
            ).scalar()
            if data is None:
                raise NotFoundError(f"experiment {experiment_id} does not exist")
            return bytes(data)

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

    def list_experiments(
        self,
        *,
        states: Sequence[str] = (),
        name: str | None = None,
        label: str | None = None,
        owner: str | None = None,
        archived: bool | None = None,
        sort: str = "id",
        descending: bool = True,
        limit: int = 50,
        offset: int = 0,
    ) -> Page[ExperimentRecord]:
        """Filter, sort (a whitelisted column) and paginate; values are bound, never spliced."""
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
        column = SORT_COLUMNS[sort]
        # Explicit NULL placement: SQLite and PostgreSQL disagree by default.
        if descending:
            order = [column.desc().nulls_last(), Experiment.id.desc()]
        else:
            order = [column.asc().nulls_last(), Experiment.id]
        with self.read() as s:
            total = s.execute(select(func.count()).select_from(query.subquery())).scalar_one()
            rows = s.execute(query.order_by(*order).limit(limit).offset(offset)).all()
            items = [_experiment(s, row[0], row[1]) for row in rows]
        return Page(items=items, total=total, offset=offset, limit=limit)

    # --- trials ---------------------------------------------------------------------------

    def get_trial(self, trial_id: int) -> TrialRecord:
        with self.read() as s:
            trial = s.get(Trial, trial_id)
            if trial is None:
                raise NotFoundError(f"trial {trial_id} does not exist")
            return _trial(trial)

    def list_trials(self, experiment_id: int) -> list[TrialRecord]:
        with self.read() as s:
            trials = s.execute(
                select(Trial).where(Trial.experiment_id == experiment_id).order_by(Trial.id)
            ).scalars()
            return [_trial(t) for t in trials]

    # --- metrics --------------------------------------------------------------------------

    def report_metrics(
        self, trial_id: int, run_id: int, group: str, reports: Sequence[MetricReport]
    ) -> int:
        """Store a batch of reports in one transaction; return how many values were new.

        Idempotent: values already stored identically are skipped; a different value for
        a stored (trial, run, group, batch, metric) is refused with `ConflictError`. A
        report from an older run than the trial's current one raises `StaleRunError`.
        """
        rows = _metrics.flatten_reports(reports)
        for attempt in range(3):
            try:
                with self.write() as s:
                    return _metrics.insert_metrics(s, trial_id, run_id, group, rows)
            except IntegrityError:
                # A concurrent identical report won the race; the retry sees its rows.
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def trial_curve(
        self, trial_id: int, name: str, *, group: str = "validation", max_points: int = 1000
    ) -> list[tuple[int, float]]:
        """One metric's live curve, downsampled to at most `max_points` (extremes kept)."""
        if not 2 <= max_points <= 100_000:
            raise InvalidArgumentError(f"max_points must be 2-100000, got {max_points}")
        with self.read() as s:
            if s.get(Trial, trial_id) is None:
                raise NotFoundError(f"trial {trial_id} does not exist")
            return _metrics.read_curve(s, trial_id, group, name, max_points)

    def experiment_curves(
        self, experiment_id: int, name: str, *, group: str = "validation", max_points: int = 1000
    ) -> dict[int, list[tuple[int, float]]]:
        """Every trial's curve of one metric, each downsampled to at most `max_points`."""
        if not 2 <= max_points <= 100_000:
            raise InvalidArgumentError(f"max_points must be 2-100000, got {max_points}")
        with self.read() as s:
            if s.get(Experiment, experiment_id) is None:
                raise NotFoundError(f"experiment {experiment_id} does not exist")
            ids = s.execute(
                select(Trial.id).where(Trial.experiment_id == experiment_id).order_by(Trial.id)
            ).scalars()
            return {t: _metrics.read_curve(s, t, group, name, max_points) for t in ids}

    def metric_names(self, trial_id: int) -> dict[str, list[str]]:
        """Group -> metric names that the trial has reported."""
        from assay.master.store._models import MetricRollup

        with self.read() as s:
            rows = s.execute(
                select(MetricRollup.group, MetricRollup.name)
                .where(MetricRollup.trial_id == trial_id, MetricRollup.level == 1)
                .distinct()
                .order_by(MetricRollup.group, MetricRollup.name)
            )
            out: dict[str, list[str]] = {}
            for group, name in rows:
                out.setdefault(group, []).append(name)
            return out

    def experiment_metric_names(self, experiment_id: int) -> list[tuple[str, str]]:
        """(group, name) of every metric some trial of the experiment has reported."""
        from assay.master.store._models import MetricRollup

        with self.read() as s:
            rows = s.execute(
                select(MetricRollup.group, MetricRollup.name)
                .join(Trial, Trial.id == MetricRollup.trial_id)
                .where(Trial.experiment_id == experiment_id, MetricRollup.level == 1)
                .distinct()
                .order_by(MetricRollup.group, MetricRollup.name)
            )
            return [(str(group), str(name)) for group, name in rows]

    # --- checkpoints ----------------------------------------------------------------------

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

    # --- agents and allocations -----------------------------------------------------------

    def list_agents(self) -> list[AgentRecord]:
        with self.read() as s:
            return [
                AgentRecord(
                    a.id,
                    a.address,
                    a.slot_type,
                    a.slots,
                    list(a.devices),
                    a.state,
                    a.last_heartbeat,
                )
                for a in s.execute(select(Agent).order_by(Agent.id)).scalars()
            ]

    def active_allocations(self) -> list[AllocationRecord]:
        with self.read() as s:
            rows = s.execute(
                select(Allocation).where(Allocation.ended_at.is_(None)).order_by(Allocation.id)
            ).scalars()
            return [
                AllocationRecord(a.id, a.trial_id, a.run_id, a.state, list(a.placement))
                for a in rows
            ]

    # --- logs -----------------------------------------------------------------------------

    def append_logs(self, trial_id: int, run_id: int, lines: Sequence[LogLine]) -> int:
        """Append lines in one transaction; return the id of the last one (0 if none)."""
        if not lines:
            return 0
        with self.write() as s:
            # Appends of one trial are serialised, so ids become visible in order and a
            # follower reading "after id N" never skips a line committed late.
            if s.get(Trial, trial_id, with_for_update=True) is None:
                raise NotFoundError(f"trial {trial_id} does not exist")
            s.execute(
                insert(TaskLog),
                [
                    {
                        "trial_id": trial_id,
                        "run_id": run_id,
                        "rank": line.rank,
                        "stream": line.stream,
                        "level": line.level,
                        "timestamp": line.timestamp or _now(),
                        "message": line.message,
                    }
                    for line in lines
                ],
            )
            last = s.execute(select(func.max(TaskLog.id)).where(TaskLog.trial_id == trial_id))
            return int(last.scalar() or 0)

    def tail_logs(
        self, trial_id: int, *, after_id: int = 0, limit: int = 1000, level: str | None = None
    ) -> list[LogLine]:
        """Lines with id > `after_id`, oldest first (follow by passing the last id seen)."""
        if not 1 <= limit <= 100_000:
            raise InvalidArgumentError(f"limit must be 1-100000, got {limit}")
        query = select(TaskLog).where(TaskLog.trial_id == trial_id, TaskLog.id > after_id)
        if level is not None:
            query = query.where(TaskLog.level == level)
        with self.read() as s:
            rows = s.execute(query.order_by(TaskLog.id).limit(limit)).scalars()
            return [
                LogLine(
                    message=r.message,
                    rank=r.rank,
                    stream=r.stream,
                    level=r.level,
                    timestamp=r.timestamp,
                    id=r.id,
                    run_id=r.run_id,
                )
                for r in rows
            ]


def _experiment_query() -> Any:  # Select[Experiment, str]; its spelling differs in 2.0/2.1
    return select(Experiment, User.username).join(User, User.id == Experiment.owner_id)


def _experiment(s: Session, e: Experiment, owner: str) -> ExperimentRecord:
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
    )


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
    )


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


def _user(u: User) -> UserRecord:
    return UserRecord(
        id=u.id,
        username=u.username,
        admin=u.admin,
        active=u.active,
        has_password=u.password_hash is not None,
    )


def _locked_user(s: Session, username: str) -> User:
    user = s.execute(select(User).where(User.username == username).with_for_update()).scalar()
    if user is None:
        raise NotFoundError(f"user {username!r} does not exist")
    return user


def _end_sessions(s: Session, user_id: int, keep: str | None) -> int:
    query = delete(LoginSession).where(LoginSession.user_id == user_id)
    if keep is not None:
        query = query.where(LoginSession.token_hash != keep)
    return int(s.execute(query).rowcount)  # type: ignore[attr-defined]


def _utc(when: dt.datetime) -> dt.datetime:
    # SQLite keeps no offset: every time is stored in UTC and read back as UTC.
    return when.replace(tzinfo=dt.UTC) if when.tzinfo is None else when.astimezone(dt.UTC)


def _session(row: LoginSession, user: User) -> SessionRecord:
    return SessionRecord(
        id=row.id,
        user_id=user.id,
        username=user.username,
        admin=user.admin,
        active=user.active,
        peer=row.peer,
        created_at=_utc(row.created_at),
        expires_at=_utc(row.expires_at),
        last_used_at=None if row.last_used_at is None else _utc(row.last_used_at),
    )


__all__ = ["MAX_PAGE", "SORT_COLUMNS", "Store"]
