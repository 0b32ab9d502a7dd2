"""slot_usage: the slots each allocation held on each agent, from start to end

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03 16:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Allocations recorded before this have no usage rows: usage starts with this release.
    op.create_table(
        "slot_usage",
        sa.Column("allocation_id", sa.String(length=64), nullable=False),
        sa.Column("agent_id", sa.String(length=255), nullable=False),
        sa.Column("slots", sa.Integer(), nullable=False),
        sa.Column("slot_type", sa.String(length=16), nullable=False),
        sa.Column("pool", sa.String(length=255), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("allocation_id", "agent_id", name=op.f("pk_slot_usage")),
    )
    with op.batch_alter_table("slot_usage", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_slot_usage_ended_at"), ["ended_at"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_slot_usage_experiment_id"), ["experiment_id"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_slot_usage_pool"), ["pool"], unique=False)
        batch_op.create_index(batch_op.f("ix_slot_usage_started_at"), ["started_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_slot_usage_user_id"), ["user_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("slot_usage", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_slot_usage_user_id"))
        batch_op.drop_index(batch_op.f("ix_slot_usage_started_at"))
        batch_op.drop_index(batch_op.f("ix_slot_usage_pool"))
        batch_op.drop_index(batch_op.f("ix_slot_usage_experiment_id"))
        batch_op.drop_index(batch_op.f("ix_slot_usage_ended_at"))
    op.drop_table("slot_usage")
