"""pool_bindings: the resource pools an administrator bound to workspaces

A pool with bindings takes experiments of its bound workspaces only; a pool without
any stays open to every workspace, as every pool was before this revision, so nothing
changes for a store that is upgraded. A binding goes with its workspace.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-04 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "pool_bindings",
        sa.Column("pool", sa.Text(), nullable=False),
        sa.Column("workspace_id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name=op.f("fk_pool_bindings_workspace_id_workspaces"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("pool", "workspace_id", name=op.f("pk_pool_bindings")),
    )
    op.create_index(
        op.f("ix_pool_bindings_workspace_id"), "pool_bindings", ["workspace_id"], unique=False
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_pool_bindings_workspace_id"), table_name="pool_bindings")
    op.drop_table("pool_bindings")
