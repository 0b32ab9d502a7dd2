"""The experiment store: SQLAlchemy models, Alembic migrations, and the `Store` API.

SQLite (WAL) is the zero-setup default and PostgreSQL the production store; both pass
the same contract tests (tests/store/).
"""

from assay.master.store._batch import WriteBatch
from assay.master.store._experiments import MAX_PAGE, SORT_COLUMNS
from assay.master.store._migrate import current_revision, head_revision, migrate
from assay.master.store._records import (
    AgentRecord,
    AllocationRecord,
    CheckpointRecord,
    ExperimentRecord,
    LogLine,
    MetricReport,
    MetricsReported,
    Page,
    TrialRecord,
    UserRecord,
)
from assay.master.store._registry import ModelRecord, ModelVersionRecord
from assay.master.store._store import Store
from assay.master.store._usage import GROUP_BY, PoolUsage, UsagePart, UsageRow, pool_usage
from assay.master.store._workspaces import (
    ROLES,
    MemberRecord,
    ProjectRecord,
    WorkspaceRecord,
)

__all__ = [
    "GROUP_BY",
    "MAX_PAGE",
    "ROLES",
    "SORT_COLUMNS",
    "AgentRecord",
    "AllocationRecord",
    "CheckpointRecord",
    "ExperimentRecord",
    "LogLine",
    "MemberRecord",
    "MetricReport",
    "MetricsReported",
    "ModelRecord",
    "ModelVersionRecord",
    "Page",
    "PoolUsage",
    "ProjectRecord",
    "Store",
    "TrialRecord",
    "UsagePart",
    "UsageRow",
    "UserRecord",
    "WorkspaceRecord",
    "WriteBatch",
    "current_revision",
    "head_revision",
    "migrate",
    "pool_usage",
]
