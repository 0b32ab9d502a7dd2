"""experiment templates: named partial configs merged under an experiment's own

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02 20:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "experiment_templates",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("owner_id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["owner_id"], ["users.id"], name=op.f("fk_experiment_templates_owner_id_users")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_experiment_templates")),
        sa.UniqueConstraint("name", name=op.f("uq_experiment_templates_name")),
    )
    with op.batch_alter_table("experiment_templates", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_experiment_templates_owner_id"), ["owner_id"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("experiment_templates", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_experiment_templates_owner_id"))
    op.drop_table("experiment_templates")
