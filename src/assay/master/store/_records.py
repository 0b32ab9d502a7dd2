"""Plain, frozen records the store returns (no ORM objects escape a transaction)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class UserRecord:
    id: int
    username: str
    admin: bool
    active: bool
    # False for a user made as an experiment owner only: such a user cannot log in.
    has_password: bool = False


@dataclass(frozen=True)
class Credentials:
    """A user with the stored password hash, for checking a login (never sent out)."""

    user: UserRecord
    password_hash: str | None = field(repr=False)


@dataclass(frozen=True)
class SessionRecord:
    """A login session with the state of its user at the time it was read."""

    id: int
    user_id: int
    username: str
    admin: bool
    active: bool
    peer: str
    created_at: dt.datetime
    expires_at: dt.datetime
    last_used_at: dt.datetime | None


@dataclass(frozen=True)
class ExperimentRecord:
    id: int
    name: str
    description: str
    owner: str
    state: str
    labels: tuple[str, ...]
    priority: int
    progress: float
    archived: bool
    config: Mapping[str, Any]
    searcher_state: Mapping[str, Any] | None
    created_at: dt.datetime
    start_time: dt.datetime | None
    end_time: dt.datetime | None
    # Where it is filed: its project, and the project's workspace.
    project_id: int = 1
    project: str = ""
    workspace: str = ""


@dataclass(frozen=True)
class TrialRecord:
    id: int
    experiment_id: int
    request_id: str
    hparams: Mapping[str, Any]
    seed: int
    state: str
    run_id: int
    restarts: int
    total_batches: int
    best_validation: float | None
    latest_checkpoint: str | None
    start_time: dt.datetime | None
    end_time: dt.datetime | None
    last_error: str | None = None
    parent_trial_id: int | None = None  # the trial whose checkpoint it started from
    search_round: int | None = None  # the search round that created it (pbt)


@dataclass(frozen=True)
class MetricReport:
    """One report: the values of several metrics at one batch count."""

    total_batches: int
    values: Mapping[str, float | None]


@dataclass(frozen=True)
class MetricsReported:
    """What a metric report did, read in its own transaction: how many values were new to
    the store, and the trial's progress after it (neither field ever goes back)."""

    stored: int
    total_batches: int
    best_validation: float | None


@dataclass(frozen=True)
class CheckpointRecord:
    uuid: str
    trial_id: int
    run_id: int
    total_batches: int
    state: str
    location: str
    files: Mapping[str, int]
    # The master's record of it: "sha256" (per file), "validation_metrics", and
    # "metadata", the dict the trial stored it with (see `metadata`).
    user_metadata: Mapping[str, Any] = field(default_factory=dict)

    @property
    def size_bytes(self) -> int:
        return sum(self.files.values())

    @property
    def metadata(self) -> Mapping[str, Any]:
        """The metadata the trial stored the checkpoint with (the Core API's
        `store_path(metadata)`, also in its metadata.json); empty when it gave none."""
        value = self.user_metadata.get("metadata")
        return value if isinstance(value, Mapping) else {}


@dataclass(frozen=True)
class AgentRecord:
    id: str
    address: str
    slot_type: str
    slots: int
    devices: list[Any]
    state: str
    last_heartbeat: dt.datetime


@dataclass(frozen=True)
class AllocationRecord:
    id: str
    trial_id: int
    run_id: int
    state: str
    placement: list[Any]
    stopping: str | None = None  # the stop under way (None: none, or an old row)


@dataclass(frozen=True)
class LogLine:
    message: str
    rank: int = 0
    stream: str = "stdout"
    level: str | None = None
    timestamp: dt.datetime | None = None
    id: int = 0
    run_id: int = 0


# A trial log's levels, lowest first; a line without one (or with another) counts as INFO.
LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def level_rank(level: str | None) -> int:
    """A stored level's place in LOG_LEVELS (INFO's for none or an unknown one)."""
    return LOG_LEVELS.index(level) if level in LOG_LEVELS else LOG_LEVELS.index("INFO")


@dataclass(frozen=True)
class LogFilter:
    """Which of a trial's lines a read returns (every line when nothing is set): those of
    `ranks`, of `min_level` or higher (one of LOG_LEVELS), stamped at or after `since`
    (aware), whose message contains `text` (case-sensitive)."""

    ranks: frozenset[int] | None = None
    min_level: str | None = None
    since: dt.datetime | None = None
    text: str | None = None

    @property
    def everything(self) -> bool:
        return self.ranks is None and not self.min_level and self.since is None and not self.text

    def levels_below(self) -> list[str]:
        """The levels `min_level` leaves out."""
        return list(LOG_LEVELS[: level_rank(self.min_level)]) if self.min_level else []

    def matches(self, line: LogLine) -> bool:
        if self.ranks is not None and line.rank not in self.ranks:
            return False
        if self.min_level and level_rank(line.level) < level_rank(self.min_level):
            return False
        if self.since is not None and line.timestamp is not None:
            stamp = line.timestamp
            if stamp.tzinfo is None:  # read back from SQLite: UTC, as the store writes it
                stamp = stamp.replace(tzinfo=dt.UTC)
            if stamp < self.since:
                return False
        return not self.text or self.text in line.message


@dataclass(frozen=True)
class Page(Generic[T]):
    items: list[T]
    total: int
    offset: int
    limit: int


@dataclass(frozen=True)
class WorkspaceRecord:
    id: int
    name: str
    archived: bool
    num_projects: int = 0
    num_experiments: int = 0


@dataclass(frozen=True)
class ProjectRecord:
    id: int
    workspace_id: int
    workspace: str
    name: str
    description: str
    archived: bool
    num_experiments: int = 0
