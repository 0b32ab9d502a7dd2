"""The master's in-memory view of its live experiments and trials.

The master decides from memory and writes every change through a `WriteBatch` (see
_commit.py), so its hot paths never read the database. Memory holds the experiments
that are not finished yet; a finished one is dropped and read from the store when asked
about. `load_live` rebuilds memory from the store when the master starts.
"""

from __future__ import annotations

import datetime as dt
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from assay.config import ExperimentConfig, parse_config
from assay.master.store import NotFoundError, Store

TERMINAL_EXPERIMENT = frozenset({"COMPLETED", "CANCELED", "ERROR"})
TERMINAL_TRIAL = frozenset({"COMPLETED", "CANCELED", "ERROR"})
LIVE_EXPERIMENT = ("ACTIVE", "PAUSED", "STOPPING_CANCELED", "STOPPING_KILLED")


@dataclass(frozen=True)
class Restore:
    """The checkpoint a trial's next run starts from."""

    uuid: str
    total_batches: int
    location: str


@dataclass
class TrialState:
    id: int
    experiment_id: int
    request_id: str
    hparams: Mapping[str, Any]
    seed: int
    state: str
    run_id: int = 0
    restarts: int = 0
    total_batches: int = 0
    best_validation: float | None = None
    checkpoint: Restore | None = None
    start_time: dt.datetime | None = None


@dataclass
class ExperimentState:
    id: int
    config: ExperimentConfig
    state: str
    priority: int
    progress: float = 0.0
    trials: dict[int, TrialState] = field(default_factory=dict)


class ModelCache:
    """Model definitions of live experiments, most recently used first, up to a size."""

    def __init__(self, store: Store, max_bytes: int = 256 * 2**20) -> None:
        self.store = store
        self.max_bytes = max_bytes
        self._data: OrderedDict[int, bytes] = OrderedDict()
        self._bytes = 0

    def put(self, experiment_id: int, data: bytes) -> None:
        self.drop(experiment_id)
        self._data[experiment_id] = data
        self._bytes += len(data)
        while self._bytes > self.max_bytes and len(self._data) > 1:
            _, old = self._data.popitem(last=False)
            self._bytes -= len(old)

    def get(self, experiment_id: int) -> bytes:
        data = self._data.get(experiment_id)
        if data is None:
            data = self.store.get_model_definition(experiment_id)
            self.put(experiment_id, data)
        else:
            self._data.move_to_end(experiment_id)
        return data

    def drop(self, experiment_id: int) -> None:
        old = self._data.pop(experiment_id, None)
        if old is not None:
            self._bytes -= len(old)


def load_live(store: Store) -> list[ExperimentState]:
    """Every experiment that is not finished, with its trials, as the store has them."""
    out: list[ExperimentState] = []
    offset = 0
    while True:
        page = store.list_experiments(
            states=LIVE_EXPERIMENT, sort="id", descending=False, limit=1000, offset=offset
        )
        for record in page.items:
            experiment = ExperimentState(
                id=record.id,
                config=parse_config(record.config),
                state=record.state,
                priority=record.priority,
                progress=record.progress,
            )
            for t in store.list_trials(record.id):
                experiment.trials[t.id] = TrialState(
                    id=t.id,
                    experiment_id=t.experiment_id,
                    request_id=t.request_id,
                    hparams=t.hparams,
                    seed=t.seed,
                    state=t.state,
                    run_id=t.run_id,
                    restarts=t.restarts,
                    total_batches=t.total_batches,
                    best_validation=t.best_validation,
                    checkpoint=_restore(store, t.latest_checkpoint),
                    start_time=t.start_time,
                )
            out.append(experiment)
        offset += len(page.items)
        if not page.items or offset >= page.total:
            return out


def _restore(store: Store, uuid: str | None) -> Restore | None:
    if not uuid:
        return None
    try:
        c = store.get_checkpoint(uuid)
    except NotFoundError:
        return None
    return Restore(c.uuid, c.total_batches, c.location)
