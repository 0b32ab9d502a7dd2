"""trials.parent_trial_id and trials.search_round: a trial's lineage (pbt's exploit)

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02 21:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A plain id, not a foreign key: SQLite cannot add one to an existing table without
    # rebuilding it, and a trial's parent is always of the same experiment (deleted with it).
    op.add_column("trials", sa.Column("parent_trial_id", sa.Integer(), nullable=True))
    op.add_column("trials", sa.Column("search_round", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        batch.drop_column("search_round")
        batch.drop_column("parent_trial_id")
