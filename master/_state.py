"""The master's in-memory view of its live experiments and trials.

The master decides from memory and writes every change through a `WriteBatch` (see
_commit.py), so its hot paths never read the database. Memory holds the experiments
that are not finished yet; a finished one is dropped and read from the store when asked
about. `load_live` rebuilds memory from the store when the master starts.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from assay.config import ExperimentConfig, parse_config, searcher_in_batches
from assay.master.errors import NotFoundError
from assay.master.lifecycle import (
    LIVE_EXPERIMENT,
    ExperimentState,
    ExperimentStatus,
    Restore,
    TrialState,
    TrialStatus,
)
from assay.master.searcher import Searcher, make_searcher, restore_searcher
from assay.master.store import Store


def new_searcher(config: ExperimentConfig) -> Searcher:
    """The experiment's searcher; `ValueError` names an option that cannot work.

    Its lengths are batches: one in epochs is converted with `records_per_epoch` (the
    config is stored as written, and converted the same way again on restore).
    """
    return make_searcher(
        searcher_in_batches(config), config.hyperparameters, config.experiment_seed
    )


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
            config = parse_config(record.config)
            saved: Mapping[str, Any] = record.searcher_state or {}
            searcher = (
                restore_searcher(
                    searcher_in_batches(config),
                    config.hyperparameters,
                    config.experiment_seed,
                    saved["searcher"],
                )
                if "searcher" in saved
                else new_searcher(config)  # nothing was recorded: the search starts over
            )
            experiment = ExperimentState(
                id=record.id,
                config=config,
                state=ExperimentStatus(record.state),
                priority=record.priority,
                searcher=searcher,
                progress=record.progress,
                shutdown=bool(saved.get("shutdown", False)),
                needs_start="searcher" not in saved,
            )
            marks: Mapping[str, Any] = saved.get("trials", {})
            for t in store.list_trials(record.id):
                mark = marks.get(t.request_id, {})
                trial = TrialState(
                    id=t.id,
                    experiment_id=t.experiment_id,
                    request_id=t.request_id,
                    hparams=t.hparams,
                    seed=t.seed,
                    state=TrialStatus(t.state),
                    run_id=t.run_id,
                    restarts=t.restarts,
                    total_batches=t.total_batches,
                    best_validation=t.best_validation,
                    checkpoint=_restore(store, t.latest_checkpoint),
                    checkpointed=t.latest_checkpoint is not None,
                    start_time=t.start_time,
                    last_error=t.last_error,
                    target=mark.get("target"),
                    closed=bool(mark.get("closed", False)),
                )
                experiment.add_trial(trial)
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
