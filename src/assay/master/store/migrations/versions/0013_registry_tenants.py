"""model registry tenants: a model's workspace, and versions whose checkpoint is gone

A model now belongs to a workspace, whose editors may change it beside its owner and
the administrators; every model stored before this goes to the "Default" workspace
(id 1). A version whose checkpoint its owner deleted is kept and marked
(`checkpoint_deleted_at`), so the foreign key from a version to its checkpoint goes: a
version in another workspace's model no longer stops a checkpoint's deletion (the store
still refuses it for versions of the checkpoint's own workspace).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.add_column(
            sa.Column("workspace_id", sa.Integer(), nullable=False, server_default=sa.text("1"))
        )
        batch.create_foreign_key(
            batch.f("fk_models_workspace_id_workspaces"), "workspaces", ["workspace_id"], ["id"]
        )
        batch.create_index(batch.f("ix_models_workspace_id"), ["workspace_id"], unique=False)
    with op.batch_alter_table("model_versions") as batch:
        batch.add_column(
            sa.Column("checkpoint_deleted_at", sa.DateTime(timezone=True), nullable=True)
        )
        batch.drop_constraint(
            batch.f("fk_model_versions_checkpoint_uuid_checkpoints"), type_="foreignkey"
        )


def downgrade() -> None:
    # Versions whose checkpoint is gone cannot name it again under a foreign key.
    op.execute(sa.text("DELETE FROM model_versions WHERE checkpoint_deleted_at IS NOT NULL"))
    with op.batch_alter_table("model_versions") as batch:
        batch.create_foreign_key(
            batch.f("fk_model_versions_checkpoint_uuid_checkpoints"),
            "checkpoints",
            ["checkpoint_uuid"],
            ["uuid"],
        )
        batch.drop_column("checkpoint_deleted_at")
    with op.batch_alter_table("models") as batch:
        batch.drop_index(batch.f("ix_models_workspace_id"))
        batch.drop_constraint(batch.f("fk_models_workspace_id_workspaces"), type_="foreignkey")
        batch.drop_column("workspace_id")
