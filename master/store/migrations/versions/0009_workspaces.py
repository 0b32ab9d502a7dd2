"""workspaces and projects, and each user's role in a workspace

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02 20:00:00
"""

from __future__ import annotations

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
