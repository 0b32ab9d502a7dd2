"""experiments.config_text: the config as its submitter wrote it (order and comments)

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02 07:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Experiments stored before this have none: they are shown from the parsed config.
    op.add_column("experiments", sa.Column("config_text", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("experiments") as batch:
        batch.drop_column("config_text")
