"""metric_rollups: the level of 16 batches rebuilt for every metric stored so far

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 12:00:00

Rollup level 0 (buckets of 16 batches) came after the others without a migration: the
metrics stored before it have no level-0 rows, and a bucket reported into on both sides
of that upgrade counts only its newer rows. Curve reads noticed (a level must count
every row of the curve) and read raw rows instead: right, but slow for long curves.

Level 0 is rebuilt here from the live rows (not superseded, not NaN), as the store
computes it on every report: per (trial, group, metric, bucket of 16 batches), the count
and the first, last, min and max points, ties going to the earliest point. The levels
above it were kept from the start and are left as they are. One INSERT ... SELECT with
window functions, the same SQL on SQLite (3.25 or newer) and PostgreSQL.
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# As the store's LEVELS[0] was when this migration was written (a migration is frozen).
LEVEL = 0
WIDTH = 16  # batches per bucket

_BUCKET = f"total_batches / {WIDTH}"  # integer division: total_batches is never negative
_PARTITION = f'PARTITION BY trial_id, "group", name, {_BUCKET}'


def _pick(rank: str, column: str) -> str:
    return f"max(CASE WHEN {rank} = 1 THEN {column} END)"


BACKFILL = f"""
INSERT INTO metric_rollups (
    trial_id, "group", name, level, bucket, count,
    first_batches, first_value, last_batches, last_value,
    min_batches, min_value, max_batches, max_value
)
SELECT
    trial_id, "group", name, {LEVEL}, bucket, count(*),
    {_pick("by_first", "total_batches")}, {_pick("by_first", "value")},
    {_pick("by_last", "total_batches")}, {_pick("by_last", "value")},
    {_pick("by_min", "total_batches")}, {_pick("by_min", "value")},
    {_pick("by_max", "total_batches")}, {_pick("by_max", "value")}
FROM (
    SELECT
        trial_id, "group", name, {_BUCKET} AS bucket, total_batches, value,
        row_number() OVER ({_PARTITION} ORDER BY total_batches, value) AS by_first,
        row_number() OVER ({_PARTITION} ORDER BY total_batches DESC, value DESC) AS by_last,
        row_number() OVER ({_PARTITION} ORDER BY value, total_batches) AS by_min,
        row_number() OVER ({_PARTITION} ORDER BY value DESC, total_batches) AS by_max
    FROM metrics
    WHERE NOT superseded AND value IS NOT NULL
) AS ranked
GROUP BY trial_id, "group", name, bucket
"""


def upgrade() -> None:
    # Whatever level-0 rows exist were written after the level came: partial buckets.
    op.execute(f"DELETE FROM metric_rollups WHERE level = {LEVEL}")
    op.execute(BACKFILL)


def downgrade() -> None:
    # Releases before 0004 may not keep level 0 (those before it existed never did):
    # without its rows, their reads take the levels above or the raw rows.
    op.execute(f"DELETE FROM metric_rollups WHERE level = {LEVEL}")
