"""The experiment store: SQLAlchemy models, Alembic migrations, and the `Store` API.

SQLite (WAL) is the zero-setup default and PostgreSQL the production store; both pass
the same contract tests (tests/store/). What a running master needs of a store is
written down per aggregate as `Protocol`s (`MasterStore`, _protocols.py); `MemoryStore`
implements them in memory for the lifecycle simulation, and the contract suite
(tests/store/test_aggregates.py) holds it to the SQL store's answers.
"""

from assay.master.store._archive_file import ArchiveFile, ModelDefinition, size_of
from assay.master.store._base import StoreBase
from assay.master.store._batch import WriteBatch
from assay.master.store._checkpoints import DELETED
from assay.master.store._directory import Snapshot
from assay.master.store._experiments import ENDED_EXPERIMENT, MAX_PAGE, SORT_COLUMNS, pinned_message
from assay.master.store._memory import MemoryDatabase, MemoryStore
from assay.master.store._migrate import current_revision, head_revision, migrate
from assay.master.store._models import DEFAULT_WORKSPACE_ID, Metric, Trial
from assay.master.store._protocols import (
    AgentStore,
    BatchStore,
    CheckpointStore,
    ExperimentStore,
    LogStore,
    MasterStore,
    MetricStore,
    RegistryStore,
    SecretStore,
    TrialStore,
    UsageStore,
    UserStore,
    WorkspaceStore,
)
from assay.master.store._records import (
    LOG_LEVELS,
    AgentRecord,
    AllocationRecord,
    CheckpointRecord,
    ExperimentRecord,
    LogFilter,
    LogLine,
    MetricReport,
    MetricsReported,
    Page,
    ProjectRecord,
    TrialRecord,
    UserRecord,
    WorkspaceRecord,
)
from assay.master.store._registry import ModelRecord, ModelVersionRecord
from assay.master.store._store import Store
from assay.master.store._templates import TemplateRecord
from assay.master.store._usage import GROUP_BY, GroupBy, PoolUsage, UsagePart, UsageRow, pool_usage
from assay.master.store._workspaces import ROLES, MemberRecord

__all__ = [
    "ArchiveFile",
    "ModelDefinition",
    "size_of",
    "StoreBase",
    "DEFAULT_WORKSPACE_ID",
    "Metric",
    "Trial",
    "GroupBy",
    "Snapshot",
    "TemplateRecord",
    "DELETED",
    "ENDED_EXPERIMENT",
    "pinned_message",
    "GROUP_BY",
    "MAX_PAGE",
    "ROLES",
    "SORT_COLUMNS",
    "AgentRecord",
    "AgentStore",
    "AllocationRecord",
    "BatchStore",
    "CheckpointRecord",
    "CheckpointStore",
    "ExperimentRecord",
    "ExperimentStore",
    "LOG_LEVELS",
    "LogFilter",
    "LogLine",
    "LogStore",
    "MasterStore",
    "MemberRecord",
    "MemoryDatabase",
    "MemoryStore",
    "MetricReport",
    "MetricStore",
    "MetricsReported",
    "ModelRecord",
    "ModelVersionRecord",
    "Page",
    "PoolUsage",
    "ProjectRecord",
    "RegistryStore",
    "SecretStore",
    "Store",
    "TrialRecord",
    "TrialStore",
    "UsagePart",
    "UsageRow",
    "UsageStore",
    "UserRecord",
    "UserStore",
    "WorkspaceRecord",
    "WorkspaceStore",
    "WriteBatch",
    "current_revision",
    "head_revision",
    "migrate",
    "pool_usage",
]
