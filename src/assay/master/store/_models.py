"""SQLAlchemy models of the experiment store: the one schema both engines share.

The tables are shaped for the queries the CLI and web UI make: the experiment list
filters on indexed columns (state, owner, name, labels through `experiment_labels`);
curves read `metric_rollups` (a min/max/first/last summary per bucket of batches, kept on
every write) instead of scanning raw rows; logs are read by (trial, id) ranges.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Double,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Named constraints, so migrations and autogenerate agree on both engines.
NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# SQLite only auto-increments an INTEGER PRIMARY KEY (the rowid alias).
Id64 = BigInteger().with_variant(Integer(), "sqlite")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map: ClassVar[dict[Any, Any]] = {dict[str, Any]: JSON, list[Any]: JSON}


class SchemaInfo(Base):
    """Which Assay release last migrated this database (named in "too new" errors)."""

    __tablename__ = "schema_info"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(String(255))


class User(Base):
    __tablename__ = "users"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    username: Mapped[str] = mapped_column(String(128), unique=True)
    password_hash: Mapped[str | None] = mapped_column(String(255))
    admin: Mapped[bool] = mapped_column(Boolean, default=False)
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_now)


class LoginSession(Base):
    """A login: the SHA-256 of its bearer token (never the token itself) and its expiry.

    Logging out, changing the password and deactivating the user delete the rows.
    """

    __tablename__ = "sessions"
    id: Mapped[int] = mapped_column(Id64, primary_key=True, autoincrement=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    # The address the login came from, for the user's list of sessions.
    peer: Mapped[str] = mapped_column(String(255), default="")
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_now)
    expires_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), index=True)
    last_used_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))


class Workspace(Base):
    """A team's space: its projects hold experiments; its members have roles in it."""

    __tablename__ = "workspaces"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    archived: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_now)


class Project(Base):
    """A group of experiments in one workspace (its name is unique there)."""

    __tablename__ = "projects"
    __table_args__ = (UniqueConstraint("workspace_id", "name"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    workspace_id: Mapped[int] = mapped_column(ForeignKey("workspaces.id"), index=True)
    name: Mapped[str] = mapped_column(String(128))
    description: Mapped[str] = mapped_column(Text, default="")
    archived: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_now)


class WorkspaceMember(Base):
    """A user's role in a workspace: viewer, editor or admin."""

    __tablename__ = "workspace_members"
    workspace_id: Mapped[int] = mapped_column(
        ForeignKey("workspaces.id", ondelete="CASCADE"), primary_key=True
    )
    user_id: Mapped[int] = mapped_column(
        ForeignKey("users.id", ondelete="CASCADE"), primary_key=True, index=True
    )
    role: Mapped[str] = mapped_column(String(16))


class PoolBinding(Base):
    """A resource pool bound to a workspace by an administrator (`assay resource-pool
    bind`): a pool with bindings takes experiments of its bound workspaces only. The
    bindings of the master's settings (`resource_pools[].workspaces`) are not stored."""

    __tablename__ = "pool_bindings"
    pool: Mapped[str] = mapped_column(Text, primary_key=True)
    workspace_id: Mapped[int] = mapped_column(
        ForeignKey("workspaces.id", ondelete="CASCADE"), primary_key=True, index=True
    )
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_now)


# The "Default" workspace and its "Uncategorized" project, made by migration 0009 (the
# first rows of their tables): where an experiment goes when its config names neither.
DEFAULT_WORKSPACE_ID = 1
DEFAULT_PROJECT_ID = 1


class Experiment(Base):
    __tablename__ = "experiments"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255), index=True)
    description: Mapped[str] = mapped_column(Text, default="")
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    project_id: Mapped[int] = mapped_column(
        ForeignKey("projects.id"), index=True, server_default=text(str(DEFAULT_PROJECT_ID))
    )
    state: Mapped[str] = mapped_column(String(32), index=True)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    # The YAML as submitted (order and comments kept), for people; None before 0005.
    config_text: Mapped[str | None] = mapped_column(Text, deferred=True)
    # Deferred: up to 96 MiB, read only when a trial starts (not with every listing).
    model_definition: Mapped[bytes] = mapped_column(LargeBinary, deferred=True)
    priority: Mapped[int] = mapped_column(SmallInteger, default=42)
    progress: Mapped[float] = mapped_column(Double, default=0.0)
    searcher_state: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    archived: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), default=_now, index=True
    )
    start_time: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    end_time: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), default=_now, onupdate=_now
    )


class ExperimentLabel(Base):
    __tablename__ = "experiment_labels"
    experiment_id: Mapped[int] = mapped_column(
        ForeignKey("experiments.id", ondelete="CASCADE"), primary_key=True
    )
    label: Mapped[str] = mapped_column(String(255), primary_key=True, index=True)


class Trial(Base):
    __tablename__ = "trials"
    __table_args__ = (UniqueConstraint("experiment_id", "request_id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    experiment_id: Mapped[int] = mapped_column(
        ForeignKey("experiments.id", ondelete="CASCADE"), index=True
    )
    request_id: Mapped[str] = mapped_column(String(64))
    hparams: Mapped[dict[str, Any]] = mapped_column(JSON)
    seed: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[str] = mapped_column(String(32), index=True)
    run_id: Mapped[int] = mapped_column(Integer, default=0)
    restarts: Mapped[int] = mapped_column(Integer, default=0)
    total_batches: Mapped[int] = mapped_column(BigInteger, default=0)
    best_validation: Mapped[float | None] = mapped_column(Double)
    latest_checkpoint: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_now)
    start_time: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    end_time: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    # Why its last run failed ("agent0: rank 0 exited with code 7"), for describe.
    last_error: Mapped[str | None] = mapped_column(Text)
    # Lineage: the trial whose checkpoint it started from (pbt's exploit), and the round
    # of the search that created it; null for a trial that started from scratch. Loaded
    # only where a trial is read whole (`LINEAGE`), so that writers work on any schema.
    parent_trial_id: Mapped[int | None] = mapped_column(Integer, deferred=True)
    search_round: Mapped[int | None] = mapped_column(Integer, deferred=True)


class Metric(Base):
    """One value of one metric in one report: (trial, run, group, batches, name) is unique."""

    __tablename__ = "metrics"
    __table_args__ = (UniqueConstraint("trial_id", "group", "name", "total_batches", "run_id"),)
    id: Mapped[int] = mapped_column(Id64, primary_key=True, autoincrement=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"))
    run_id: Mapped[int] = mapped_column(Integer)
    group: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(255))
    total_batches: Mapped[int] = mapped_column(BigInteger)
    value: Mapped[float | None] = mapped_column(Double)  # NaN is stored as NULL
    superseded: Mapped[bool] = mapped_column(Boolean, default=False)


class MetricRollup(Base):
    """Summary of one bucket of `2**width_log2(level)` batches of one metric's live rows."""

    __tablename__ = "metric_rollups"
    trial_id: Mapped[int] = mapped_column(
        ForeignKey("trials.id", ondelete="CASCADE"), primary_key=True
    )
    group: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    level: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    bucket: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    count: Mapped[int] = mapped_column(BigInteger)
    first_batches: Mapped[int] = mapped_column(BigInteger)
    first_value: Mapped[float] = mapped_column(Double)
    last_batches: Mapped[int] = mapped_column(BigInteger)
    last_value: Mapped[float] = mapped_column(Double)
    min_batches: Mapped[int] = mapped_column(BigInteger)
    min_value: Mapped[float] = mapped_column(Double)
    max_batches: Mapped[int] = mapped_column(BigInteger)
    max_value: Mapped[float] = mapped_column(Double)


class Checkpoint(Base):
    __tablename__ = "checkpoints"
    uuid: Mapped[str] = mapped_column(String(64), primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"), index=True)
    run_id: Mapped[int] = mapped_column(Integer)
    total_batches: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[str] = mapped_column(String(32))
    location: Mapped[str] = mapped_column(Text)
    files: Mapped[dict[str, Any]] = mapped_column(JSON)
    size_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    user_metadata: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_now)


class Agent(Base):
    __tablename__ = "agents"
    id: Mapped[str] = mapped_column(String(255), primary_key=True)
    address: Mapped[str] = mapped_column(String(255), default="")
    slot_type: Mapped[str] = mapped_column(String(16))
    slots: Mapped[int] = mapped_column(Integer)
    devices: Mapped[list[Any]] = mapped_column(JSON, default=list)
    state: Mapped[str] = mapped_column(String(32))
    registered_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_now)
    last_heartbeat: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_now)
    # The sha256 (hex) of the credential the agent was given at its first join; the name
    # accepts no other. NULL: not issued yet (an agent of a release before 0006).
    credential_sha256: Mapped[str | None] = mapped_column(String(64))


class Allocation(Base):
    __tablename__ = "allocations"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"), index=True)
    run_id: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(32), index=True)
    # [{"agent_id": str, "slots": [int, ...]}, ...]
    placement: Mapped[list[Any]] = mapped_column(JSON)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_now)
    ended_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    # The kind of stop under way for the run ("pause", "cancel", "kill", "preempt",
    # "kill_trial"), written with its trial's STOPPING state so that a restarted master
    # finishes that stop; or "released": the master told the run "no more" (its exit 0
    # ends a step). NULL: none, or a row written before revision 0012.
    stopping: Mapped[str | None] = mapped_column(String(16))


class SlotUsage(Base):
    """Slots one allocation held on one agent, from its start to its end: the usage record.

    One row per part of an allocation (per agent of a gang), written when the allocation
    is recorded and closed once (`ended_at`) when the master learns it ended. The ids are
    plain columns, not foreign keys: usage outlives the experiments and trials it counts.
    """

    __tablename__ = "slot_usage"
    allocation_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    agent_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    slots: Mapped[int] = mapped_column(Integer)
    slot_type: Mapped[str] = mapped_column(String(16))
    pool: Mapped[str] = mapped_column(String(255), index=True)
    user_id: Mapped[int] = mapped_column(Integer, index=True)
    experiment_id: Mapped[int] = mapped_column(Integer, index=True)
    trial_id: Mapped[int] = mapped_column(Integer)
    run_id: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), index=True)
    # NULL while the allocation holds the slots.
    ended_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), index=True)


class TaskLog(Base):
    __tablename__ = "task_logs"
    __table_args__ = (Index("ix_task_logs_trial_id_id", "trial_id", "id"),)
    id: Mapped[int] = mapped_column(Id64, primary_key=True, autoincrement=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"))
    run_id: Mapped[int] = mapped_column(Integer)
    rank: Mapped[int] = mapped_column(Integer, default=0)
    stream: Mapped[str] = mapped_column(String(8), default="stdout")
    level: Mapped[str | None] = mapped_column(String(16))
    timestamp: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_now)
    message: Mapped[str] = mapped_column(Text)


class RegisteredModel(Base):
    """A model of the registry: a name people share, and its numbered versions.

    `last_version` is the highest version number ever given, so numbers are never reused
    after a version is deleted.
    """

    __tablename__ = "models"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    description: Mapped[str] = mapped_column(Text, default="")
    labels: Mapped[list[Any]] = mapped_column(JSON, default=list)
    user_metadata: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    archived: Mapped[bool] = mapped_column(Boolean, default=False)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    # Its editors may change the model (beside its owner and the administrators).
    workspace_id: Mapped[int] = mapped_column(
        ForeignKey("workspaces.id"), index=True, server_default=text("1")
    )
    last_version: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_now)
    updated_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), default=_now, onupdate=_now
    )


class ModelVersion(Base):
    """One version of a registered model: a checkpoint, pinned against deletion by
    others than its owner.

    `checkpoint_uuid` has no foreign key: a version of a model in another workspace than
    the checkpoint's does not stop its owner from deleting it (the version is then kept,
    with `checkpoint_deleted_at` set); the store refuses the deletion while a version of
    the checkpoint's own workspace names it.
    """

    __tablename__ = "model_versions"
    __table_args__ = (UniqueConstraint("model_id", "version"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"))
    version: Mapped[int] = mapped_column(Integer)
    checkpoint_uuid: Mapped[str] = mapped_column(String(64), index=True)
    checkpoint_deleted_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    notes: Mapped[str] = mapped_column(Text, default="")
    labels: Mapped[list[Any]] = mapped_column(JSON, default=list)
    user_metadata: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_now)
    updated_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), default=_now, onupdate=_now
    )


class ExperimentTemplate(Base):
    """A named partial experiment config, merged under an experiment's own at creation."""

    __tablename__ = "experiment_templates"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_now)
    updated_at: Mapped[dt.datetime] = mapped_column(
        DateTime(timezone=True), default=_now, onupdate=_now
    )


__all__ = [
    "DEFAULT_PROJECT_ID",
    "DEFAULT_WORKSPACE_ID",
    "Agent",
    "Allocation",
    "Base",
    "Checkpoint",
    "Experiment",
    "ExperimentLabel",
    "ExperimentTemplate",
    "LoginSession",
    "Metric",
    "MetricRollup",
    "Project",
    "ModelVersion",
    "RegisteredModel",
    "SchemaInfo",
    "SlotUsage",
    "TaskLog",
    "Trial",
    "User",
    "Workspace",
    "WorkspaceMember",
]
