"""`WriteBatch`: many state changes written in one transaction (group commit).

The master changes its in-memory state first and records each change here; one
transaction then writes a whole batch, and only after it commits does the master act
(send a start or kill to an agent, answer a call). A batch is plain data: each store
applies it its own way (the SQL store in _batch_sql.py, the in-memory store in
_memory_batch.py), so the same recorded changes reach either. It keeps its rows in a
form that writes cheaply: inserts are grouped per table, and updates of the same row
merge, so a trial created, started and finished between two commits costs one insert.

Order within a batch: inserts (parents before children), then updates, then the usage
records opened and then closed, then the ordered `steps`, then the master's log lines. A
step may therefore rely on the rows the batch inserts; the master uses steps for writes
whose order matters among themselves (agent rows, superseding metrics).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from assay.master.errors import InvalidArgumentError
from assay.master.store import _usage
from assay.master.store._archive_file import ArchiveFile, ModelDefinition

# The tables a batch inserts and updates rows of, parents first, and their primary keys.
TABLES = ("experiments", "trials", "allocations")
PRIMARY_KEY = "id"
TRIAL_FIELDS = frozenset(
    {
        "state",
        "run_id",
        "restarts",
        "total_batches",
        "best_validation",
        "latest_checkpoint",
        "start_time",
        "end_time",
        "last_error",
    }
)
EXPERIMENT_FIELDS = frozenset(
    {
        "state",
        "progress",
        "searcher_state",
        "archived",
        "priority",
        "config",  # resources patched by `experiment set`, lengths by `experiment continue`
        "config_text",  # `experiment continue`: the config it goes on with
        "description",
        "start_time",
        "end_time",
    }
)
ALLOCATION_FIELDS = frozenset({"state", "ended_at", "stopping"})


# --- the ordered steps: writes that are not a row insert or a field update -----------------


@dataclass(frozen=True)
class ArchiveWritten:
    """The experiment's model definition, read from its file as the row is written."""

    experiment_id: int
    archive: ArchiveFile


@dataclass(frozen=True)
class LabelsAdded:
    experiment_id: int
    labels: tuple[str, ...]  # sorted, without repeats


@dataclass(frozen=True)
class UsageOrphansClosed:
    """Close the usage records of allocations that are not open (a master's start)."""

    now: dt.datetime


@dataclass(frozen=True)
class MetricsSuperseded:
    """Hide the trial's metrics past `after_batches`; with `metric`, its best_validation
    becomes the best of what is left."""

    trial_id: int
    after_batches: int
    metric: str | None
    smaller_is_better: bool


@dataclass(frozen=True)
class AgentRegistered:
    """Insert or refresh the agent's row: a reconnecting agent keeps its registration time.
    `values`: slot_type, slots, devices, address, state, last_heartbeat, and
    credential_sha256 when a credential was issued (else the row keeps its own)."""

    agent_id: str
    values: Mapping[str, Any]
    now: dt.datetime


@dataclass(frozen=True)
class AgentStateSet:
    agent_id: str
    state: str


@dataclass(frozen=True)
class AgentCredentialWithdrawn:
    """Forget the credential `digest`, unless the row holds another by now."""

    agent_id: str
    digest: str


@dataclass(frozen=True)
class AgentRemoved:
    agent_id: str


Step = (
    ArchiveWritten
    | LabelsAdded
    | UsageOrphansClosed
    | MetricsSuperseded
    | AgentRegistered
    | AgentStateSet
    | AgentCredentialWithdrawn
    | AgentRemoved
)


class WriteBatch:
    """Rows to insert, fields to update and ordered steps, applied by a store's `apply`
    (`Store.apply`, `MemoryStore.apply`)."""

    def __init__(self) -> None:
        # What the stores read to apply it (see the module docstring for the order).
        # table -> primary key -> the row (an insert); table -> key -> fields (an update)
        self.inserts: dict[str, dict[Any, dict[str, Any]]] = {}
        self.updates: dict[str, dict[Any, dict[str, Any]]] = {}
        self.steps: list[Step] = []
        self.logs: list[dict[str, Any]] = []
        # Usage records opened, and closed (every part of an allocation, or one agent's).
        self.usage_opened: list[dict[str, Any]] = []
        self.usage_closed: list[dict[str, Any]] = []
        self.usage_closed_parts: list[dict[str, Any]] = []

    def __bool__(self) -> bool:
        return bool(
            self.inserts
            or self.updates
            or self.steps
            or self.logs
            or self.usage_opened
            or self.usage_closed
            or self.usage_closed_parts
        )

    def __len__(self) -> int:
        return (
            sum(len(rows) for rows in self.inserts.values())
            + sum(len(rows) for rows in self.updates.values())
            + len(self.steps)
            + len(self.logs)
            + len(self.usage_opened)
            + len(self.usage_closed)
            + len(self.usage_closed_parts)
        )

    def _insert(self, table: str, row: Mapping[str, Any]) -> None:
        """Insert `row` into `table` (one of `TABLES`; the row names its `id`)."""
        self.inserts.setdefault(table, {})[row[PRIMARY_KEY]] = dict(row)

    def _update(self, table: str, key: Any, **fields: Any) -> None:
        """Set `fields` of the row with primary key `key` (merged with earlier changes)."""
        pending = self.inserts.get(table, {}).get(key)
        if pending is not None:
            pending.update(fields)
            return
        self.updates.setdefault(table, {}).setdefault(key, {}).update(fields)

    # --- the master's rows ----------------------------------------------------------------

    def add_experiment(
        self,
        experiment_id: int,
        *,
        name: str,
        owner_id: int,
        config: Mapping[str, Any],
        model_definition: ModelDefinition,
        state: str,
        description: str,
        labels: Sequence[str],
        priority: int,
        now: dt.datetime,
        config_text: str | None = None,
        project_id: int | None = None,
    ) -> None:
        # A file is read when the row is written (a step, below), not held until then.
        inline = model_definition if isinstance(model_definition, bytes) else b""
        self._insert(
            "experiments",
            {
                "id": experiment_id,
                "name": name,
                "description": description,
                "owner_id": owner_id,
                "state": state,
                "config": dict(config),
                "model_definition": inline,
                "priority": priority,
                "progress": 0.0,
                "searcher_state": None,
                "archived": False,
                "created_at": now,
                "start_time": now,
                "end_time": None,
                "updated_at": now,
                # Only when given: a store written by tests at an older schema has no column.
                **({"config_text": config_text} if config_text is not None else {}),
                # Only when given: the column's default is the Default workspace's project.
                **({"project_id": project_id} if project_id is not None else {}),
            },
        )
        if isinstance(model_definition, ArchiveFile):
            self.steps.append(ArchiveWritten(experiment_id, model_definition))
        if labels:
            self.steps.append(LabelsAdded(experiment_id, tuple(sorted(set(labels)))))

    def add_trial(
        self,
        trial_id: int,
        *,
        experiment_id: int,
        request_id: str,
        hparams: Mapping[str, Any],
        seed: int,
        state: str,
        now: dt.datetime,
        parent_trial_id: int | None = None,
        search_round: int | None = None,
    ) -> None:
        lineage = (
            {"parent_trial_id": parent_trial_id, "search_round": search_round}
            if parent_trial_id is not None or search_round is not None
            else {}  # only when given: a store written by tests at an older schema lacks them
        )
        self._insert(
            "trials",
            {
                "id": trial_id,
                "experiment_id": experiment_id,
                "request_id": request_id,
                "hparams": dict(hparams),
                "seed": seed,
                "state": state,
                "run_id": 0,
                "restarts": 0,
                "total_batches": 0,
                "best_validation": None,
                "latest_checkpoint": None,
                "created_at": now,
                "start_time": None,
                "end_time": None,
                "last_error": None,
                **lineage,
            },
        )

    def add_allocation(
        self,
        allocation_id: str,
        *,
        trial_id: int,
        run_id: int,
        placement: list[Any],
        now: dt.datetime,
    ) -> None:
        self._insert(
            "allocations",
            {
                "id": allocation_id,
                "trial_id": trial_id,
                "run_id": run_id,
                "state": "ASSIGNED",
                "placement": placement,
                "created_at": now,
                "ended_at": None,
                "stopping": None,
            },
        )

    def usage_started(
        self,
        allocation_id: str,
        *,
        experiment_id: int,
        trial_id: int,
        run_id: int,
        parts: Sequence[_usage.UsagePart],
        now: dt.datetime,
    ) -> None:
        """Start the allocation's usage records, one per part."""
        started = _usage.utc(now)
        self.usage_opened += [
            {
                "allocation_id": allocation_id,
                "agent_id": part.agent_id,
                "slots": part.slots,
                "slot_type": part.slot_type,
                "pool": part.pool,
                "experiment_id": experiment_id,
                "trial_id": trial_id,
                "run_id": run_id,
                "started_at": started,
            }
            for part in parts
        ]

    def usage_ended(
        self, allocation_id: str, now: dt.datetime, *, agent_id: str | None = None
    ) -> None:
        """Close the allocation's open usage records (one agent's part, or all of them),
        after the records this batch opens. Idempotent: a record already closed keeps the
        end it has."""
        row = {"allocation_id": allocation_id, "ended_at": _usage.utc(now)}
        if agent_id is None:
            self.usage_closed.append(row)
        else:
            self.usage_closed_parts.append({**row, "agent_id": agent_id})

    def usage_orphans_closed(self, now: dt.datetime) -> None:
        """Close the usage records of allocations that are not open (a master's start)."""
        self.steps.append(UsageOrphansClosed(now))

    def set_experiment(self, experiment_id: int, **fields: Any) -> None:
        _check_fields("experiment", fields, EXPERIMENT_FIELDS)
        self._update("experiments", experiment_id, **fields)

    def set_trial(self, trial_id: int, **fields: Any) -> None:
        _check_fields("trial", fields, TRIAL_FIELDS)
        self._update("trials", trial_id, **fields)

    def rename_trial_request(self, trial_id: int, request_id: str) -> None:
        """Give a stored trial the request id its searcher knows it by (adoption)."""
        self._update("trials", trial_id, request_id=request_id)

    def set_allocation(self, allocation_id: str, **fields: Any) -> None:
        _check_fields("allocation", fields, ALLOCATION_FIELDS)
        self._update("allocations", allocation_id, **fields)

    def supersede_metrics(
        self,
        trial_id: int,
        after_batches: int,
        metric: str | None = None,
        smaller_is_better: bool = True,
    ) -> None:
        """Hide the trial's metrics past `after_batches` (a run restored from a checkpoint);
        its best_validation of `metric` becomes the best of what is left."""
        self.steps.append(MetricsSuperseded(trial_id, after_batches, metric, smaller_is_better))

    def log(
        self, trial_id: int, run_id: int, message: str, *, level: str, now: dt.datetime
    ) -> None:
        """Add a line of the master's own to the trial's logs (what happened to a run)."""
        self.logs.append(
            {
                "trial_id": trial_id,
                "run_id": run_id,
                "rank": 0,
                "stream": "stderr",
                "level": level,
                "timestamp": now,
                "message": message,
            }
        )

    def agent_registered(
        self,
        agent_id: str,
        *,
        slot_type: str,
        slots: int,
        devices: list[Any],
        address: str,
        now: dt.datetime,
        credential_sha256: str | None = None,
    ) -> None:
        """`credential_sha256`: the hash of the credential issued at this registration
        (None: the row keeps the one it has)."""
        values: dict[str, Any] = {
            "slot_type": slot_type,
            "slots": slots,
            "devices": list(devices),
            "address": address,
            "state": "ACTIVE",
            "last_heartbeat": now,
        }
        if credential_sha256 is not None:
            values["credential_sha256"] = credential_sha256
        self.steps.append(AgentRegistered(agent_id, values, now))

    def agent_state(self, agent_id: str, state: str) -> None:
        self.steps.append(AgentStateSet(agent_id, state))

    def agent_credential_withdrawn(self, agent_id: str, digest: str) -> None:
        """Forget a credential the agent was never told (it hung up first), unless the
        row holds another by now."""
        self.steps.append(AgentCredentialWithdrawn(agent_id, digest))

    def agent_removed(self, agent_id: str) -> None:
        """Forget the agent and its credential (`assay agent remove`): its name is free."""
        self.steps.append(AgentRemoved(agent_id))


def _check_fields(kind: str, fields: Mapping[str, Any], allowed: frozenset[str]) -> None:
    if not allowed.issuperset(fields):
        unknown = set(fields) - allowed
        raise InvalidArgumentError(f"cannot update {kind} fields {sorted(unknown)}")
