"""Metric reports (idempotent, fenced by run id, superseded on restore) and curve reads.

Every write also merges its values into `metric_rollups`: per metric and per level, a
bucket of 2**LEVELS[level] batches keeps its count and its first, last, min and max
points. A curve with many rows is then drawn from at most a few thousand rollup rows (M4
over groups of buckets) instead of a scan of every raw row: a web page showing a hundred
trials' curves of 10,000 rows each reads about 60,000 rows rather than 1,000,000. Short
curves are read raw and thinned by LTTB. Either way the global min and max survive.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any, cast

import numpy as np
from sqlalchemy import Table, and_, case, delete, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from assay.master.errors import (
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
    StaleRunError,
)
from assay.master.store._downsample import (
    Bucket,
    FloatArray,
    IntArray,
    m4_arrays,
    m4_groups,
    merge,
    series_indices,
)
from assay.master.store._models import Metric, MetricRollup, Trial
from assay.master.store._records import MetricReport

METRICS = cast(Table, Metric.__table__)
ROLLUPS = cast(Table, MetricRollup.__table__)

# Rollup level -> log2 of its bucket width in batches, finest first. Level 0 came after
# the others: a store written before it lacks level-0 rows for the metrics it held then,
# so a read first checks that a level counts every row of the curve.
LEVELS = {0: 4, 1: 8, 2: 12, 3: 16, 4: 20, 5: 24}
TOP = 5
# Up to this many rows, a curve is read raw: that is cheap, and LTTB then draws exactly
# max_points of its points. Up to RAW_READ_LIMIT, when no rollup level draws it finely.
RAW_ALWAYS = 2_000
RAW_READ_LIMIT = 20_000
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

    The finest level is summarised in one pass over the sorted points; each coarser level
    merges the summaries of the level below, since every bucket width is a multiple of the
    finer ones.
    """
    out: dict[tuple[str, int, int], Bucket] = {}
    by_name: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for batches, name, value in rows:
        if value is not None:
            by_name[name].append((batches, value))
    (finest, first_shift), *coarser = LEVELS.items()
    for name, points in by_name.items():
        points.sort()
        below: dict[int, Bucket] = {}
        start = 0
        current = points[0][0] >> first_shift
        for i in range(1, len(points) + 1):
            bucket = points[i][0] >> first_shift if i < len(points) else None
            if bucket != current:
                below[current] = _summary(points, start, i)
                if bucket is not None:
                    current, start = bucket, i
        for b, summary in below.items():
            out[(name, finest, b)] = summary
        shift = first_shift
        for level, level_shift in coarser:
            step, shift = level_shift - shift, level_shift
            above: dict[int, Bucket] = {}
            for b, summary in below.items():
                previous = above.get(b >> step)
                above[b >> step] = summary if previous is None else merge(previous, summary)
            for b, summary in above.items():
                out[(name, level, b)] = summary
            below = above
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
    # In the order of _ROLLUP_COLUMNS. Sorted keys: concurrent writers lock rollup rows
    # in one order (no deadlock).
    values = [
        (
            trial_id,
            group,
            name,
            level,
            bucket,
            s.count,
            int(s.first[0]),
            s.first[1],
            int(s.last[0]),
            s.last[1],
            int(s.min[0]),
            s.min[1],
            int(s.max[0]),
            s.max[1],
        )
        for (name, level, bucket), s in sorted(summaries.items())
    ]
    connection = session.connection()
    sql, positional = _merge_sql(connection.dialect)
    if positional:
        connection.exec_driver_sql(sql, values)
    else:
        connection.exec_driver_sql(
            sql, [dict(zip(_ROLLUP_COLUMNS, v, strict=True)) for v in values]
        )


_ROLLUP_COLUMNS = tuple(column.name for column in ROLLUPS.columns)
_MERGE_SQL: dict[str, tuple[str, bool]] = {}


def _merge_sql(dialect: Dialect) -> tuple[str, bool]:
    """The rollup upsert as SQL text for `dialect`, and whether its parameters are positional
    (in the order of _ROLLUP_COLUMNS) rather than named.

    Built once (it is costly to build) and run straight on the driver's executemany, as
    `_insert` is: SQLAlchemy's per-row parameter processing would cost more than the upsert.
    """
    cached = _MERGE_SQL.get(dialect.name)
    if cached is None:
        compiled = _build_merge_statement(dialect.name).compile(dialect=dialect)
        if compiled.positional and tuple(compiled.positiontup or ()) != _ROLLUP_COLUMNS:
            raise AssertionError(f"unexpected parameter order: {compiled.positiontup}")
        cached = _MERGE_SQL[dialect.name] = (compiled.string, compiled.positional)
    return cached


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
    for level, shift in LEVELS.items():
        session.execute(
            delete(MetricRollup).where(
                MetricRollup.trial_id == trial_id,
                MetricRollup.level == level,
                MetricRollup.bucket >= (after_batches >> shift),
            )
        )
    widest = LEVELS[TOP]
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
        cut = {lvl: after_batches >> shift for lvl, shift in LEVELS.items()}
        partial = [(n, lvl, b) for (n, lvl, b) in summaries if b == cut[lvl]]
        write_summaries(session, trial_id, group, {k: summaries[k] for k in partial})
    return changed


def read_curve(
    session: Session, trial_id: int, group: str, name: str, max_points: int
) -> list[tuple[int, float]]:
    """The live curve of one metric, at most `max_points` points, extremes kept.

    Drawn from the rollup level `_plan` picks (M4 over max_points / 4 groups of its
    buckets) or from the raw rows (LTTB); either way the global min and max points come
    back exactly.
    """
    key = (trial_id, group, name)
    [(count, first, last)] = _fetch(session, _EXTENT_SQL, (*key, TOP))
    if not count:
        return []
    levels = list(LEVELS.items())
    while (level := _plan(int(count), int(last) - int(first), max_points, levels)) is not None:
        curve = _read_rollups(session, key, level, int(count), max_points)
        if curve is not None:
            return curve
        levels = [(lv, shift) for lv, shift in levels if lv > level]
    rows = _fetch(session, _RAW_SQL, key)
    if not rows:
        return []
    batches, values = zip(*rows, strict=True)
    return _thin(np.array(batches, dtype=np.int64), np.array(values, dtype=np.float64), max_points)


def _plan(count: int, span: int, max_points: int, levels: list[tuple[int, int]]) -> int | None:
    """The rollup level to draw a curve of `count` rows over `span` batches from, or None to
    read its raw rows (always for up to max(max_points, RAW_ALWAYS) rows).

    A level is of use when its buckets hold 4 rows or more on average (else the raw rows
    cost no more to read) and number at most 2 * max_points. The finest such level is
    taken when it has max_points / 4 buckets or more (M4 gives 2 to 4 points a bucket),
    or max_points / 8 when the raw rows number over 4 * max_points: levels are 16 times
    apart, so the finest level with at most 2 * max_points buckets has over max_points / 8
    unless the curve is too sparse for it. Otherwise the raw rows, up to RAW_READ_LIMIT of
    them; past that, a coarse curve rather than a slow one. A level's bucket count is
    estimated from above: min(count, buckets spanned).
    """
    if count <= max(max_points, RAW_ALWAYS) or not levels:
        return None
    sizes = [(level, min(count, (span >> shift) + 1)) for level, shift in levels]
    useful = [(lv, n) for lv, n in sizes if 4 * n <= count and n <= 2 * max_points]
    if useful:
        level, buckets = useful[0]
        if 4 * buckets >= max_points or (8 * buckets >= max_points and count > 4 * max_points):
            return level
    if count <= RAW_READ_LIMIT:
        return None
    return useful[0][0] if useful else sizes[-1][0]


# Curve reads go to the driver's own cursor: for thousands of rows of plain numbers,
# building SQLAlchemy rows costs more than the query. `?` marks a parameter.
_KEY = 'trial_id = ? AND "group" = ? AND name = ?'
_EXTENT_SQL = (
    "SELECT sum(count), min(first_batches), max(last_batches) FROM metric_rollups "
    f"WHERE {_KEY} AND level = ?"
)
_ROLLUP_SQL = (
    "SELECT count, first_batches, min_batches, max_batches, last_batches, "
    "first_value, min_value, max_value, last_value FROM metric_rollups "
    f"WHERE {_KEY} AND level = ? ORDER BY bucket"
)
_RAW_SQL = (
    "SELECT total_batches, value FROM metrics "
    f"WHERE {_KEY} AND NOT superseded AND value IS NOT NULL ORDER BY total_batches"
)


def _fetch(session: Session, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    """The rows of `sql` as plain tuples, read in the session's transaction."""
    connection = session.connection()
    if connection.dialect.paramstyle != "qmark":
        sql = sql.replace("?", "%s")
    driver = connection.connection
    # psycopg's binary results parse in half the time of text for columns of numbers.
    cursor = (
        driver.cursor(binary=True) if connection.dialect.driver == "psycopg" else driver.cursor()
    )
    try:
        cursor.execute(sql, params)
        return list(cursor.fetchall())
    finally:
        cursor.close()


def _read_rollups(
    session: Session, key: tuple[int, str, str], level: int, count: int, max_points: int
) -> list[tuple[int, float]] | None:
    """The curve from one rollup level, or None when the level lacks some of its rows."""
    rows = _fetch(session, _ROLLUP_SQL, (*key, level))
    if not rows:
        return None
    counts, *columns = zip(*rows, strict=True)
    if sum(counts) != count:
        return None
    batches = np.array(columns[:4], dtype=np.int64).T
    values = np.array(columns[4:], dtype=np.float64).T
    # M4 over max_points / 4 groups: at most max_points points, every group's extremes.
    groups = max(1, max_points // 4)
    return _thin(*m4_arrays(*m4_groups(batches, values, groups)), max_points)


def _thin(x: IntArray, y: FloatArray, max_points: int) -> list[tuple[int, float]]:
    """At most `max_points` of the points (x sorted): all if that many, else LTTB with the
    global extremes put back.

    Batch counts stay exact integers: only LTTB's geometry sees them as floats, which
    round above 2**53.
    """
    if len(x) > max_points:
        keep = series_indices(x.astype(np.float64), y, max_points)
        x, y = x[keep], y[keep]
    return list(zip(x.tolist(), y.tolist(), strict=True))
