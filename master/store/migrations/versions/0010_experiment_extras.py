"""experiment templates and the experiments' own name, description and labels

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02 20:00:00
"""

from __future__ import annotations

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
