"""Metric reports (idempotent, fenced by run id, superseded on restore) and curve reads.

Every write also merges its values into `metric_rollups`: per metric and per level, a
bucket of 2**LEVELS[level] batches keeps its count and its first, last, min and max
points. A curve with many rows is then drawn from a few thousand rollup rows (M4
points, thinned by LTTB) instead of a scan of every raw row.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any, cast

from sqlalchemy import Table, and_, case, delete, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from assay.master.store._downsample import (
    Bucket,
    downsample_buckets,
    downsample_indices,
    merge,
)
from assay.master.store._models import Metric, MetricRollup, Trial
from assay.master.store._records import MetricReport
from assay.master.store.errors import (
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
    StaleRunError,
)

METRICS = cast(Table, Metric.__table__)
ROLLUPS = cast(Table, MetricRollup.__table__)

# log2 of the bucket width, in batches, of each rollup level (1-based).
LEVELS = (8, 12, 16, 20, 24)
RAW_READ_LIMIT = 20_000  # a curve with at most this many rows is read raw
MAX_GROUP_LEN = 64
MAX_BATCHES = 2**63 - 1
MAX_NAME_LEN = 255

Row = tuple[int, str, float | None]  # (total_batches, name, value)


def flatten_reports(reports: Sequence[MetricReport]) -> list[Row]:
    """Check a batch of reports and flatten it to rows; NaN becomes None."""
    rows: dict[tuple[int, str], float | None] = {}
    checked: set[str] = set()
    for report in reports:
        batches = report.total_batches
        if (
            isinstance(batches, bool)
            or not isinstance(batches, int)
            or not 0 <= batches <= MAX_BATCHES
        ):
            raise InvalidArgumentError(
                f"total_batches must be an integer from 0 to {MAX_BATCHES}: {batches!r}"
            )
        for name, raw in report.values.items():
            if name not in checked:
                if not isinstance(name, str) or not name or len(name) > MAX_NAME_LEN:
                    raise InvalidArgumentError(
                        f"metric names must be 1-{MAX_NAME_LEN} characters: {name!r}"
                    )
                checked.add(name)
            if type(raw) is float:
                value: float | None = None if raw != raw else raw  # NaN != NaN
            else:
                value = _value(name, raw)
            key = (batches, name)
            if key in rows and not _same(rows[key], value):
                raise ConflictError(
                    f"metric {name!r} at batch {batches} is reported twice with different "
                    "values in one request"
                )
            rows[key] = value
    return [(b, n, v) for (b, n), v in rows.items()]


def _value(name: str, raw: Any) -> float | None:
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise InvalidArgumentError(f"metric {name!r} must be a number, got {raw!r}")
    try:
        value = float(raw)
    except OverflowError:
        raise InvalidArgumentError(f"metric {name!r} is too large for a float: {raw!r}") from None
    return None if math.isnan(value) else value


def _same(a: float | None, b: float | None) -> bool:
    return a == b or (a is None and b is None)


def check_run(session: Session, trial_id: int, run_id: int) -> None:
    """Fence: only the trial's current run may write."""
    # FOR SHARE (PostgreSQL): a restart that moves the trial to a new run waits for this
    # transaction, so a report that passed the fence is superseded, never left live.
    current = session.execute(
        select(Trial.run_id).where(Trial.id == trial_id).with_for_update(read=True)
    ).scalar()
    if current is None:
        raise NotFoundError(f"trial {trial_id} does not exist")
    if run_id < current:
        raise StaleRunError(
            f"trial {trial_id} is on run {current}; a report from run {run_id} comes from a "
            "process that was replaced and is refused"
        )
    if run_id > current:
        raise ConflictError(f"trial {trial_id} has no run {run_id} (current run: {current})")


def insert_metrics(
    session: Session, trial_id: int, run_id: int, group: str, rows: Sequence[Row]
) -> int:
    """Insert the rows not already stored; identical re-sends are no-ops. Returns the count."""
    if not group or len(group) > MAX_GROUP_LEN:
        raise InvalidArgumentError(f"metric group must be 1-{MAX_GROUP_LEN} characters: {group!r}")
    if not rows:
        return 0
    check_run(session, trial_id, run_id)
    # Most reports are new: insert them all under a savepoint, and compare with what is
    # stored only when the unique key says part of the report is already there.
    try:
        with session.begin_nested():
            _insert(session, trial_id, run_id, group, rows)
    except IntegrityError:
        pass
    else:
        merge_rollups(session, trial_id, group, rows)
        return len(rows)
    stored = _stored(session, trial_id, run_id, group, rows)
    new: list[Row] = []
    for batches, name, value in rows:
        key = (batches, name)
        if key not in stored:
            new.append((batches, name, value))
        elif not _same(stored[key], value):
            raise ConflictError(
                f"trial {trial_id} run {run_id} already reported {group} metric {name!r} at "
                f"batch {batches} as {stored[key]!r}; a different value ({value!r}) is refused"
            )
    if not new:
        return 0
    _insert(session, trial_id, run_id, group, new)
    merge_rollups(session, trial_id, group, new)
    return len(new)


_INSERT_COLUMNS = '(trial_id, run_id, "group", name, total_batches, value, superseded)'


def _insert(session: Session, trial_id: int, run_id: int, group: str, rows: Sequence[Row]) -> None:
    # Straight to the driver's executemany: per-row parameter processing in SQLAlchemy
    # costs more than the insert itself for thousands of rows of plain numbers.
    connection = session.connection()
    mark = "?" if connection.dialect.paramstyle == "qmark" else "%s"
    marks = ", ".join([mark] * 7)
    connection.exec_driver_sql(
        f"INSERT INTO metrics {_INSERT_COLUMNS} VALUES ({marks})",
        [(trial_id, run_id, group, name, batches, value, False) for batches, name, value in rows],
    )


def _stored(
    session: Session, trial_id: int, run_id: int, group: str, rows: Sequence[Row]
) -> dict[tuple[int, str], float | None]:
    names = sorted({name for _, name, _ in rows})
    lo = min(b for b, _, _ in rows)
    hi = max(b for b, _, _ in rows)
    found = session.execute(
        select(Metric.total_batches, Metric.name, Metric.value).where(
            Metric.trial_id == trial_id,
            Metric.group == group,
            Metric.name.in_(names),
            Metric.total_batches.between(lo, hi),
            Metric.run_id == run_id,
        )
    )
    return {(b, n): v for b, n, v in found}


def _summaries(rows: Iterable[Row]) -> dict[tuple[str, int, int], Bucket]:
    """(name, level, bucket) -> summary of the rows' non-null values.

    Level 1 is summarised in one pass over the sorted points; the coarser levels merge
    level-1 summaries, since every bucket width is a multiple of the finer ones.
    """
    out: dict[tuple[str, int, int], Bucket] = {}
    by_name: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for batches, name, value in rows:
        if value is not None:
            by_name[name].append((batches, value))
    first_shift = LEVELS[0]
    for name, points in by_name.items():
        points.sort()
        finest: list[tuple[int, Bucket]] = []
        start = 0
        current = points[0][0] >> first_shift
        for i in range(1, len(points) + 1):
            bucket = points[i][0] >> first_shift if i < len(points) else None
            if bucket != current:
                finest.append((current, _summary(points, start, i)))
                if bucket is not None:
                    current, start = bucket, i
        for b, summary in finest:
            out[(name, 1, b)] = summary
        for level, shift in enumerate(LEVELS[1:], start=2):
            step = shift - first_shift
            for b, summary in finest:
                key = (name, level, b >> step)
                previous = out.get(key)
                out[key] = summary if previous is None else merge(previous, summary)
    return out


def _summary(points: Sequence[tuple[int, float]], start: int, end: int) -> Bucket:
    """Summary of points[start:end] (sorted by batches): min/max ties go to the earliest."""
    lo = hi = points[start]
    for k in range(start + 1, end):
        p = points[k]
        if p[1] < lo[1]:
            lo = p
        elif p[1] > hi[1]:
            hi = p
    return Bucket(end - start, points[start], points[end - 1], lo, hi)


def merge_rollups(session: Session, trial_id: int, group: str, rows: Iterable[Row]) -> None:
    write_summaries(session, trial_id, group, _summaries(rows))


def write_summaries(
    session: Session, trial_id: int, group: str, summaries: dict[tuple[str, int, int], Bucket]
) -> None:
    """Merge bucket summaries into the stored rollups (insert, or combine with a row)."""
    if not summaries:
        return
    values = [
        {
            "trial_id": trial_id,
            "group": group,
            "name": name,
            "level": level,
            "bucket": bucket,
            "count": s.count,
            "first_batches": int(s.first[0]),
            "first_value": s.first[1],
            "last_batches": int(s.last[0]),
            "last_value": s.last[1],
            "min_batches": int(s.min[0]),
            "min_value": s.min[1],
            "max_batches": int(s.max[0]),
            "max_value": s.max[1],
        }
        for (name, level, bucket), s in sorted(summaries.items())
    ]
    # Sorted keys: concurrent writers lock rollup rows in one order (no deadlock).
    session.connection().execute(_merge_statement(session), values)


_MERGE_STATEMENTS: dict[str, Any] = {}


def _merge_statement(session: Session) -> Any:
    """The rollup upsert for this session's dialect, built once (it is costly to build)."""
    dialect = session.get_bind().dialect.name
    statement = _MERGE_STATEMENTS.get(dialect)
    if statement is None:
        statement = _MERGE_STATEMENTS[dialect] = _build_merge_statement(dialect)
    return statement


def _build_merge_statement(dialect: str) -> Any:
    upsert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    stmt = upsert(ROLLUPS)
    new, old = stmt.excluded, ROLLUPS.c
    earlier = new.first_batches < old.first_batches
    later = new.last_batches > old.last_batches
    lower = (new.min_value < old.min_value) | and_(
        new.min_value == old.min_value, new.min_batches < old.min_batches
    )
    higher = (new.max_value > old.max_value) | and_(
        new.max_value == old.max_value, new.max_batches < old.max_batches
    )
    return stmt.on_conflict_do_update(
        index_elements=["trial_id", "group", "name", "level", "bucket"],
        set_={
            "count": old.count + new.count,
            "first_batches": case((earlier, new.first_batches), else_=old.first_batches),
            "first_value": case((earlier, new.first_value), else_=old.first_value),
            "last_batches": case((later, new.last_batches), else_=old.last_batches),
            "last_value": case((later, new.last_value), else_=old.last_value),
            "min_batches": case((lower, new.min_batches), else_=old.min_batches),
            "min_value": case((lower, new.min_value), else_=old.min_value),
            "max_batches": case((higher, new.max_batches), else_=old.max_batches),
            "max_value": case((higher, new.max_value), else_=old.max_value),
        },
    )


def supersede(session: Session, trial_id: int, after_batches: int) -> int:
    """Mark live rows past `after_batches` superseded and rebuild the rollups they touched."""
    result = session.execute(
        update(Metric)
        .where(
            Metric.trial_id == trial_id,
            Metric.total_batches > after_batches,
            Metric.superseded.is_(False),
        )
        .values(superseded=True)
    )
    changed = int(result.rowcount or 0)  # type: ignore[attr-defined]
    if not changed:
        return 0
    # Buckets wholly past the cut go; the bucket holding the cut is rebuilt from live rows.
    for level, shift in enumerate(LEVELS, start=1):
        session.execute(
            delete(MetricRollup).where(
                MetricRollup.trial_id == trial_id,
                MetricRollup.level == level,
                MetricRollup.bucket >= (after_batches >> shift),
            )
        )
    widest = LEVELS[-1]
    live = session.execute(
        select(Metric.group, Metric.total_batches, Metric.name, Metric.value).where(
            Metric.trial_id == trial_id,
            Metric.superseded.is_(False),
            Metric.total_batches.between((after_batches >> widest) << widest, after_batches),
        )
    )
    by_group: dict[str, list[Row]] = defaultdict(list)
    for group, batches, name, value in live:
        by_group[group].append((batches, name, value))
    for group, rows in by_group.items():
        summaries = _summaries(rows)
        cut = {lvl: after_batches >> shift for lvl, shift in enumerate(LEVELS, start=1)}
        partial = [(n, lvl, b) for (n, lvl, b) in summaries if b == cut[lvl]]
        write_summaries(session, trial_id, group, {k: summaries[k] for k in partial})
    return changed


def read_curve(
    session: Session, trial_id: int, group: str, name: str, max_points: int
) -> list[tuple[int, float]]:
    """The live curve of one metric, at most `max_points` points, extremes kept."""
    top = len(LEVELS)
    count, first, last = session.execute(
        select(
            func.sum(MetricRollup.count),
            func.min(MetricRollup.first_batches),
            func.max(MetricRollup.last_batches),
        ).where(
            MetricRollup.trial_id == trial_id,
            MetricRollup.group == group,
            MetricRollup.name == name,
            MetricRollup.level == top,
        )
    ).one()
    if not count:
        return []
    if count <= max(RAW_READ_LIMIT, max_points):
        raw = session.execute(
            select(Metric.total_batches, Metric.value)
            .where(
                Metric.trial_id == trial_id,
                Metric.group == group,
                Metric.name == name,
                Metric.superseded.is_(False),
                Metric.value.is_not(None),
            )
            .order_by(Metric.total_batches)
        ).all()
        live = [(int(b), float(v)) for b, v in raw if v is not None]
        # Batch counts stay exact integers: floats would round those above 2**53.
        points = [(float(b), v) for b, v in live]
        return [live[i] for i in downsample_indices(points, max_points)]
    level = _level_for(int(count), int(last) - int(first), max_points)
    rows = session.execute(
        select(
            MetricRollup.count,
            MetricRollup.first_batches,
            MetricRollup.first_value,
            MetricRollup.last_batches,
            MetricRollup.last_value,
            MetricRollup.min_batches,
            MetricRollup.min_value,
            MetricRollup.max_batches,
            MetricRollup.max_value,
        )
        .where(
            MetricRollup.trial_id == trial_id,
            MetricRollup.group == group,
            MetricRollup.name == name,
            MetricRollup.level == level,
        )
        .order_by(MetricRollup.bucket)
    )
    buckets = [
        Bucket(n, (fb, fv), (lb, lv), (mnb, mnv), (mxb, mxv))
        for n, fb, fv, lb, lv, mnb, mnv, mxb, mxv in rows
    ]
    return [(int(x), y) for x, y in downsample_buckets(buckets, max_points)]


def _level_for(count: int, span: int, max_points: int) -> int:
    """The finest level whose bucket count stays within a few times `max_points`."""
    for level, shift in enumerate(LEVELS, start=1):
        if min(count, (span >> shift) + 1) <= 2 * max_points:
            return level
    return len(LEVELS)
