"""`Store`: the master's state in one database, read and written one transaction per call.

The master changes its state in memory and writes it through `WriteBatch`es, applied by
its group commit (`Store.apply`); the writes that must answer at once (a metric report,
a checkpoint, a log line, a login) and every read are methods of `Store`, one class of
queries per aggregate:

- `UserQueries` (_users.py): users and login sessions;
- `ExperimentQueries` (_experiments.py): experiments, trials and the ids of new rows;
- `MetricQueries` (_metrics.py): metric reports and curves;
- `CheckpointQueries` (_checkpoints.py): checkpoints;
- `AgentQueries` (_agents.py): agents and allocations;
- `LogQueries` (_logs.py): trial logs;
- `UsageQueries` (_usage.py): slot usage by user, experiment, pool, agent or day;
- `RegistryQueries` (_registry.py): registered models and their versions;
- `WorkspaceQueries` (_workspaces.py): workspaces, projects and members' roles;
- `TemplateQueries` (_templates.py): experiment templates.

Each write method says how it behaves when retried: the master retries through
outages, so writes are idempotent where a retry is possible.
"""

from __future__ import annotations

import secrets

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from assay.master.errors import ConflictError
from assay.master.store._agents import AgentQueries
from assay.master.store._batch import WriteBatch
from assay.master.store._batch_sql import write_batch
from assay.master.store._checkpoints import CheckpointQueries
from assay.master.store._engine import make_engine
from assay.master.store._experiments import ExperimentQueries
from assay.master.store._logs import LogQueries
from assay.master.store._metrics import MetricQueries
from assay.master.store._migrate import migrate
from assay.master.store._models import SchemaInfo
from assay.master.store._registry import RegistryQueries
from assay.master.store._templates import TemplateQueries
from assay.master.store._usage import UsageQueries
from assay.master.store._users import UserQueries
from assay.master.store._workspaces import WorkspaceQueries


class Store(
    UserQueries,
    ExperimentQueries,
    MetricQueries,
    CheckpointQueries,
    AgentQueries,
    LogQueries,
    UsageQueries,
    RegistryQueries,
    WorkspaceQueries,
    TemplateQueries,
):
    """The experiment store on one database (SQLite or PostgreSQL)."""

    @classmethod
    def open(cls, url: str, *, migrate_schema: bool = True) -> Store:
        """Connect to `url`, creating or upgrading the schema unless told not to.

        A schema newer than this release knows is refused (`SchemaError`), naming the
        release that wrote it.
        """
        engine = make_engine(url)
        if migrate_schema:
            try:
                migrate(engine)
            except BaseException:
                engine.dispose()
                raise
        return cls(engine)

    def close(self) -> None:
        self.engine.dispose()

    def apply(self, batch: WriteBatch) -> None:
        """Write a batch of changes in one transaction (all or nothing).

        The group commit's one way in (master/_commit.py). A batch is not idempotent
        as a whole (it inserts rows); a failed one rolled back and may be applied again.
        """
        if batch:
            with self.write() as s:
                write_batch(s, batch)

    def secret(self, name: str) -> bytes:
        """A random secret kept in the database, made on first use (the same for every
        master on this database, and across restarts)."""
        key = f"secret:{name}"
        for _ in range(2):
            with self.read() as s:
                found = s.execute(select(SchemaInfo.value).where(SchemaInfo.key == key)).scalar()
            if found is not None:
                return bytes.fromhex(found)
            try:
                with self.write() as s:
                    s.add(SchemaInfo(key=key, value=secrets.token_hex(32)))
            except IntegrityError:
                pass  # another master made it first: read theirs
        raise ConflictError(f"cannot read or create the secret {name!r}")


__all__ = ["Store"]
