"""Alembic environment: runs on the connection the store hands over (see _migrate.py).

Alembic's own INFO lines (its plugins, its dialect, each step) are not for the master's
log; each migration that runs is logged here in one sentence instead.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from typing import Any

from alembic import context
from alembic.runtime.migration import MigrationContext, MigrationInfo

from assay.master.store._models import Base

log = logging.getLogger("assay.master")
logging.getLogger("alembic").setLevel(logging.WARNING)


def _applied(
    ctx: MigrationContext,
    step: MigrationInfo,
    heads: Collection[Any],
    run_args: Mapping[str, Any],
) -> None:
    revision = step.up_revision_id if step.is_upgrade else step.down_revision_ids
    doc = str(getattr(step.up_revision, "doc", "") or "").strip() if step.is_upgrade else ""
    verb = "upgraded" if step.is_upgrade else "downgraded"
    log.info("store schema %s to revision %s%s", verb, revision, f" ({doc})" if doc else "")


config = context.config
connection = config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
    on_version_apply=_applied,
)
context.run_migrations()
