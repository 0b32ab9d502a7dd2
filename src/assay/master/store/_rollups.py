"""Metric rollups: per metric, level and bucket of batches, a summary of its live values.

Every report merges its values into `metric_rollups`: at each level, a bucket of
2**LEVELS[level] batches keeps its count and its first, last, min and max points. A long
curve is then drawn from at most a few thousand rollup rows (M4 over groups of buckets)
instead of a scan of every raw row (_curves.py). A restore that supersedes metrics past a
checkpoint rebuilds the buckets it cut. The rollups of a metric are a function of its
live (not superseded, not NaN) rows, so they can always be rebuilt from them.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any, cast

from sqlalchemy import Table, and_, case, delete, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import Session

from assay.master.store._downsample import Bucket, merge
from assay.master.store._models import Metric, MetricRollup, Trial

ROLLUPS = cast(Table, MetricRollup.__table__)

# Rollup level -> log2 of its bucket width in batches, finest first. Level 0 came after
# the others; migration 0004 built it for the rows stored before. A read still checks
# that a level counts every row of the curve before drawing from it.
LEVELS = {0: 4, 1: 8, 2: 12, 3: 16, 4: 20, 5: 24}
TOP = 5

Row = tuple[int, str, float | None]  # (total_batches, name, value)


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


def supersede(
    session: Session,
    trial_id: int,
    after_batches: int,
    metric: str | None = None,
    smaller_is_better: bool = True,
) -> int:
    """Mark live rows past `after_batches` superseded and rebuild the rollups they touched;
    with the searcher's `metric`, the trial's best_validation becomes the best of what is
    still live (a rolled-back run's better value is no longer its best)."""
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
    if metric is not None:
        _recompute_best(session, trial_id, metric, smaller_is_better)
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


def _recompute_best(session: Session, trial_id: int, metric: str, smaller_is_better: bool) -> None:
    best = live_best(session, trial_id, metric, smaller_is_better)
    session.execute(update(Trial).where(Trial.id == trial_id).values(best_validation=best))


def live_best(
    session: Session,
    trial_id: int,
    metric: str,
    smaller_is_better: bool,
    through_batches: int | None = None,
) -> float | None:
    """The best finite live validation value of `metric` the trial reported (at or before
    `through_batches` where given), or None."""
    pick = func.min if smaller_is_better else func.max
    query = select(pick(Metric.value)).where(
        Metric.trial_id == trial_id,
        Metric.group == "validation",
        Metric.name == metric,
        Metric.superseded.is_(False),
        Metric.value > -math.inf,  # NaN is NULL; infinities are never a best
        Metric.value < math.inf,
    )
    if through_batches is not None:
        query = query.where(Metric.total_batches <= through_batches)
    return session.execute(query).scalar_one_or_none()
