"""Alembic environment: runs on the connection the store hands over (see _migrate.py)."""

from __future__ import annotations

from alembic import context

from assay.master.store._models import Base

config = context.config
connection = config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
context.run_migrations()
