"""agents.credential_sha256: the hash of the credential each agent was given at its first join

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03 07:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Agents recorded before this have none: each gets one when it next joins with the
    # cluster's join token.
    op.add_column("agents", sa.Column("credential_sha256", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("agents") as batch:
        batch.drop_column("credential_sha256")
