"""allocations.stopping: the kind of stop under way for a run, kept across a restart

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03 18:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NULL: no stop under way, or a row written before this revision (the restarted
    # master then infers the stop from its experiment's state, as before).
    op.add_column("allocations", sa.Column("stopping", sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("allocations") as batch:
        batch.drop_column("stopping")
