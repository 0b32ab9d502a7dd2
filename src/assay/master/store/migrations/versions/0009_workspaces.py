"""workspaces and projects, and each user's role in a workspace

Every experiment stored before this goes to the "Uncategorized" project of the
"Default" workspace (the first row of each table, id 1), and every user becomes an
editor of the Default workspace, so nothing a user could see or do before is lost.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02 20:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "workspaces",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("archived", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workspaces")),
        sa.UniqueConstraint("name", name=op.f("uq_workspaces_name")),
    )
    op.create_table(
        "projects",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("workspace_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("archived", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name=op.f("fk_projects_workspace_id_workspaces"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_projects")),
        sa.UniqueConstraint("workspace_id", "name", name=op.f("uq_projects_workspace_id_name")),
    )
    op.create_index(op.f("ix_projects_workspace_id"), "projects", ["workspace_id"], unique=False)
    op.create_table(
        "workspace_members",
        sa.Column("workspace_id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.ForeignKeyConstraint(
            ["user_id"],
            ["users.id"],
            name=op.f("fk_workspace_members_user_id_users"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name=op.f("fk_workspace_members_workspace_id_workspaces"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("workspace_id", "user_id", name=op.f("pk_workspace_members")),
    )
    op.create_index(
        op.f("ix_workspace_members_user_id"), "workspace_members", ["user_id"], unique=False
    )
    # The defaults take id 1 in their empty tables (on PostgreSQL from the sequence, so
    # later rows never collide with them).
    op.execute(
        sa.text(
            "INSERT INTO workspaces (name, archived, created_at) "
            "VALUES ('Default', :false, CURRENT_TIMESTAMP)"
        ).bindparams(false=False)
    )
    op.execute(
        sa.text(
            "INSERT INTO projects (workspace_id, name, description, archived, created_at) "
            "SELECT id, 'Uncategorized', 'Experiments that name no project', :false, "
            "CURRENT_TIMESTAMP FROM workspaces WHERE name = 'Default'"
        ).bindparams(false=False)
    )
    op.execute(
        sa.text(
            "INSERT INTO workspace_members (workspace_id, user_id, role) "
            "SELECT w.id, u.id, 'editor' FROM workspaces w, users u WHERE w.name = 'Default'"
        )
    )
    with op.batch_alter_table("experiments", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("project_id", sa.Integer(), server_default=sa.text("1"), nullable=False)
        )
        batch_op.create_index(batch_op.f("ix_experiments_project_id"), ["project_id"], unique=False)
        batch_op.create_foreign_key(
            batch_op.f("fk_experiments_project_id_projects"), "projects", ["project_id"], ["id"]
        )


def downgrade() -> None:
    with op.batch_alter_table("experiments", schema=None) as batch_op:
        batch_op.drop_constraint(
            batch_op.f("fk_experiments_project_id_projects"), type_="foreignkey"
        )
        batch_op.drop_index(batch_op.f("ix_experiments_project_id"))
        batch_op.drop_column("project_id")
    op.drop_index(op.f("ix_workspace_members_user_id"), table_name="workspace_members")
    op.drop_table("workspace_members")
    op.drop_index(op.f("ix_projects_workspace_id"), table_name="projects")
    op.drop_table("projects")
    op.drop_table("workspaces")
