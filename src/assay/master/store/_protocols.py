"""What the master's write and read path needs of a store, one `Protocol` per aggregate.

The SQL store (`Store`, on SQLite or PostgreSQL) and the in-memory one (`MemoryStore`,
for the lifecycle simulation) both satisfy `MasterStore`, the union of the aggregates
below; mypy checks both (see the end of _memory.py), and tests/store/test_aggregates.py
runs the same assertions on each. A method here means what the SQL store's docstring
says: the ids it hands out, the order of what it lists, the errors it raises.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Sequence
from typing import Any, Protocol

from assay.config import METRIC_NAMES_PER_TRIAL
from assay.master.store._batch import WriteBatch
from assay.master.store._directory import Directory
from assay.master.store._records import (
    AgentRecord,
    AllocationRecord,
    CheckpointRecord,
    ExperimentRecord,
    LogFilter,
    LogLine,
    MetricReport,
    MetricsReported,
    Page,
    TrialRecord,
    WorkspaceRecord,
)


class BatchStore(Protocol):
    """The group commit's way in: a `WriteBatch` written all or nothing."""

    def apply(self, batch: WriteBatch) -> None: ...

    def close(self) -> None: ...


class SecretStore(Protocol):
    def secret(self, name: str) -> bytes:
        """A random secret made on first use, the same ever after."""
        ...


class UserStore(Protocol):
    def user_id(self, username: str) -> int:
        """The id of `username`, created if missing."""
        ...


class ExperimentStore(Protocol):
    """Experiments, and the ids of the rows a batch will insert."""

    def reserve_id(self, table: str) -> int:
        """A new id of `experiments` or `trials` (`InvalidArgumentError` for another)."""
        ...

    def get_experiment(self, experiment_id: int) -> ExperimentRecord: ...

    def list_experiments(
        self,
        *,
        states: Sequence[str] = (),
        sort: str = "id",
        descending: bool = True,
        limit: int = 50,
        offset: int = 0,
    ) -> Page[ExperimentRecord]: ...

    def get_model_definition(self, experiment_id: int) -> bytes: ...

    def model_definition_bytes(self, owner_id: int) -> int: ...

    def update_experiment(self, experiment_id: int, **fields: Any) -> None: ...

    def delete_experiment(self, experiment_id: int) -> None:
        """Delete an ended experiment's rows (`ConflictError` if it has not ended)."""
        ...


class TrialStore(Protocol):
    def get_trial(self, trial_id: int) -> TrialRecord: ...

    def list_trials(self, experiment_id: int) -> list[TrialRecord]:
        """The experiment's trials by id."""
        ...


class MetricStore(Protocol):
    """Metric reports, fenced by run, and the trial's progress they carry."""

    def report_metrics(
        self,
        trial_id: int,
        run_id: int,
        group: str,
        reports: Sequence[MetricReport],
        *,
        max_names: int = METRIC_NAMES_PER_TRIAL,
    ) -> int: ...

    def report_metrics_and_progress(
        self,
        trial_id: int,
        run_id: int,
        group: str,
        reports: Sequence[MetricReport],
        *,
        searcher_metric: str | None = None,
        smaller_is_better: bool = True,
        max_names: int = METRIC_NAMES_PER_TRIAL,
    ) -> MetricsReported: ...

    def best_validation_through(
        self, trial_id: int, through_batches: int, metric: str, smaller_is_better: bool
    ) -> float | None: ...


class CheckpointStore(Protocol):
    """Checkpoints, fenced by run; the newest by batches is the trial's latest."""

    def add_checkpoint(self, record: CheckpointRecord) -> None: ...

    def get_checkpoint(self, uuid: str) -> CheckpointRecord: ...

    def list_checkpoints(self, trial_id: int) -> list[CheckpointRecord]: ...

    def set_checkpoint_state(self, uuid: str, state: str) -> None: ...


class RegistryStore(Protocol):
    """Which checkpoints the model registry's versions name (garbage collection keeps
    those; a user's deletion is refused for the pinned ones)."""

    def checkpoint_references(self, uuids: Collection[str]) -> dict[str, list[tuple[str, int]]]:
        """For each of `uuids` a model version registers: [(model name, version), ...]."""
        ...

    def checkpoint_pins(self, uuids: Collection[str]) -> dict[str, list[tuple[str, int]]]: ...


class LogStore(Protocol):
    """Trial logs: lines with ids that count up, within each trial's quota."""

    def append_logs(
        self,
        trial_id: int,
        run_id: int,
        lines: Sequence[LogLine],
        *,
        quota_bytes: int | None = None,
    ) -> int: ...

    def tail_logs(
        self,
        trial_id: int,
        *,
        after_id: int = 0,
        limit: int = 1000,
        level: str | None = None,
        where: LogFilter | None = None,
    ) -> list[LogLine]: ...

    def last_logs(
        self,
        trial_id: int,
        count: int,
        *,
        level: str | None = None,
        where: LogFilter | None = None,
    ) -> list[LogLine]: ...

    def expired_log_trials(self, ended_before: dt.datetime, limit: int = 1000) -> list[int]: ...

    def delete_logs(self, trial_id: int, batch: int = 5000) -> int: ...


class AgentStore(Protocol):
    """Agents and allocations as the master last recorded them."""

    def list_agents(self) -> list[AgentRecord]: ...

    def agent_credentials(self) -> dict[str, str]: ...

    def active_allocations(self) -> list[AllocationRecord]: ...


class UsageStore(Protocol):
    def open_usage(self) -> list[tuple[str, str]]:
        """(allocation id, agent id) of the usage records not closed yet, in order."""
        ...


class WorkspaceStore(Protocol):
    """Where experiments are filed, and the directory of workspaces read from memory."""

    @property
    def directory(self) -> Directory: ...

    def experiment_workspaces(self, experiment_ids: Collection[int]) -> dict[int, int]: ...

    def experiment_place(self, experiment_id: int) -> tuple[int, int]: ...

    def settings_workspace(self, name: str) -> WorkspaceRecord:
        """The workspace named `name`, made with no members if there is none."""
        ...

    def bind_pool(self, pool: str, workspace_id: int) -> bool: ...

    def unbind_pool(self, pool: str, workspace_id: int) -> bool: ...


class MasterStore(
    BatchStore,
    SecretStore,
    UserStore,
    ExperimentStore,
    TrialStore,
    MetricStore,
    CheckpointStore,
    RegistryStore,
    LogStore,
    AgentStore,
    UsageStore,
    WorkspaceStore,
    Protocol,
):
    """Everything the master's shell and what it runs (interpreter, group commit,
    recovery, garbage collection, trial logs, pool access) ask of its store; the
    servicers' own reads and writes (users, workspaces, the registry, reports) are the
    SQL store's alone."""


__all__ = [
    "AgentStore",
    "BatchStore",
    "CheckpointStore",
    "ExperimentStore",
    "LogStore",
    "MasterStore",
    "MetricStore",
    "RegistryStore",
    "SecretStore",
    "TrialStore",
    "UsageStore",
    "UserStore",
    "WorkspaceStore",
]
