"""Curve reads: one metric's live curve in at most max_points points, extremes kept.

A curve is drawn from the rollup level `_plan` picks (M4 over groups of its buckets) or,
when short or when no level summarises it finely, from its raw rows (LTTB). Either way
the global min and max points come back exactly: a web page showing a hundred trials'
curves of 10,000 rows each reads about 60,000 rollup rows rather than 1,000,000 rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from assay.master.store._downsample import (
    FloatArray,
    IntArray,
    m4_arrays,
    m4_groups,
    series_indices,
)
from assay.master.store._rollups import LEVELS, TOP

# Up to this many rows, a curve is read raw: that is cheap, and LTTB then draws exactly
# max_points of its points. Up to RAW_READ_LIMIT, when no rollup level draws it finely.
RAW_ALWAYS = 2_000
RAW_READ_LIMIT = 20_000


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


# Short curves of one trial and group read in one query, up to this many rows in all (a
# trial that reports thousands of metric names would otherwise cost a query each).
BULK_READ_LIMIT = 500_000
_COUNTS_SQL = (
    'SELECT name, sum(count) FROM metric_rollups WHERE trial_id = ? AND "group" = ? '
    "AND level = ? GROUP BY name"
)
_BULK_SQL = (
    'SELECT name, total_batches, value FROM metrics WHERE trial_id = ? AND "group" = ? '
    "AND NOT superseded AND value IS NOT NULL ORDER BY name, total_batches"
)


def read_curves(
    session: Session, trial_id: int, group: str, max_points: int
) -> dict[str, list[tuple[int, float]]]:
    """Every metric's curve of one trial and group, each as `read_curve` draws it: the
    short ones (read raw there) from one query, the others one by one."""
    counts = {
        str(name): int(count)
        for name, count in _fetch(session, _COUNTS_SQL, (trial_id, group, TOP))
        if count
    }
    short = {n for n, c in counts.items() if c <= max(max_points, RAW_ALWAYS)}
    curves: dict[str, list[tuple[int, float]]] = {}
    if short and sum(counts[n] for n in short) <= BULK_READ_LIMIT:
        rows: dict[str, tuple[list[int], list[float]]] = {}
        for name, batches, value in _fetch(session, _BULK_SQL, (trial_id, group)):
            if name in short:
                xs, ys = rows.setdefault(name, ([], []))
                xs.append(batches)
                ys.append(value)
        for name, (xs, ys) in rows.items():
            x = np.array(xs, dtype=np.int64)
            curves[name] = _thin(x, np.array(ys, dtype=np.float64), max_points)
    for name in sorted(counts):
        if name not in curves:
            curves[name] = read_curve(session, trial_id, group, name, max_points)
    return {name: curve for name, curve in sorted(curves.items()) if curve}


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
