"""The master's in-memory view of its live experiments, trials, runs and queue.

The master decides from memory and writes every change through a `WriteBatch` (see
_commit.py), so its hot paths never read the database. `Ledger` holds the experiments
that are not finished yet, and writes each change to them through to the open batch; a
finished one is dropped and read from the store when asked about. `load_live` rebuilds
memory from the store when the master starts.
"""

from __future__ import annotations

import datetime as dt
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from assay.config import ExperimentConfig, parse_config, searcher_in_batches
from assay.master._checkpoints import recorded_sha256
from assay.master.errors import NotFoundError, PermissionDeniedError
from assay.master.lifecycle import (
    LIVE_EXPERIMENT,
    MEMORY_ONLY,
    ExperimentState,
    ExperimentStatus,
    Restore,
    Run,
    TrialState,
    TrialStatus,
)
from assay.master.scheduler import Request, SlotType
from assay.master.searcher import Searcher, make_searcher, restore_searcher
from assay.master.store import Store, TrialRecord, WriteBatch


class Ledger:
    """The live experiments, their trials, the runs and the queue (used under the
    master's lock); every change to a stored field is written to the open batch too."""

    def __init__(self, batch: Callable[[], WriteBatch]) -> None:
        self._batch = batch
        self.experiments: dict[int, ExperimentState] = {}
        self.trials: dict[int, TrialState] = {}  # of live experiments
        self.runs: dict[str, Run] = {}  # by allocation id
        self.run_of_trial: dict[int, str] = {}
        self.tokens: dict[str, str] = {}  # token -> allocation id
        self.queued: dict[int, Request] = {}  # trial id -> request
        self._order = 0

    def add_experiment(self, experiment: ExperimentState) -> None:
        self.experiments[experiment.id] = experiment
        self.trials.update(experiment.trials)

    def drop_experiment(self, experiment_id: int) -> None:
        """Forget an ended experiment."""
        experiment = self.experiments.pop(experiment_id)
        for trial_id in experiment.trials:
            self.trials.pop(trial_id, None)
            self.queued.pop(trial_id, None)

    def add_trial(self, trial: TrialState, now: dt.datetime) -> None:
        self._batch().add_trial(
            trial.id,
            experiment_id=trial.experiment_id,
            request_id=trial.request_id,
            hparams=trial.hparams,
            seed=trial.seed,
            state=trial.state,
            now=now,
            parent_trial_id=trial.parent_id,
            search_round=trial.search_round if trial.parent_id is not None else None,
        )
        self.experiments[trial.experiment_id].add_trial(trial)
        self.trials[trial.id] = trial

    def set_trial(self, trial_id: int, fields: Mapping[str, Any]) -> None:
        trial = self.trials.get(trial_id)
        if trial is None:
            return
        for key, value in fields.items():
            setattr(trial, key, value)
        stored = {k: v for k, v in fields.items() if k not in MEMORY_ONLY}
        if stored:
            self._batch().set_trial(trial_id, **stored)

    def set_experiment(self, experiment_id: int, fields: Mapping[str, Any]) -> None:
        experiment = self.experiments[experiment_id]
        for key in ("state", "progress", "shutdown"):
            if key in fields:
                setattr(experiment, key, fields[key])
        stored = {k: v for k, v in fields.items() if k != "shutdown"}
        if stored:
            self._batch().set_experiment(experiment_id, **stored)

    def enqueue(self, trial_id: int, slot_type: SlotType = "cpu", *, to_back: bool = False) -> None:
        """Queue the trial; a requeued trial keeps its place unless sent `to_back`. The
        scheduling pass sets the slot type its pool offers."""
        trial = self.trials[trial_id]
        experiment = self.experiments[trial.experiment_id]
        resources = experiment.config.resources
        if to_back or not trial.order:
            self._order += 1
            trial.order = self._order
        self.queued[trial.id] = Request(
            str(trial.id),
            resources.slots_per_trial,
            slot_type,
            experiment.priority,  # the column: `experiment set priority` changes it
            trial.order,
            group=str(trial.experiment_id),
            pool=resources.resource_pool or "",
            label=resources.agent_label or "",
        )

    def add_run(self, run: Run) -> None:
        self.runs[run.allocation_id] = run
        self.run_of_trial[run.trial_id] = run.allocation_id
        self.tokens[run.token] = run.allocation_id

    def end_run(self, run: Run) -> bool:
        """Forget a run; False if it had ended already."""
        if self.runs.pop(run.allocation_id, None) is None:
            return False
        self.tokens.pop(run.token, None)
        self.run_of_trial.pop(run.trial_id, None)
        return True

    def run_for_token(self, token: str, trial_id: int) -> Run:
        allocation_id = self.tokens.get(token)
        run = self.runs.get(allocation_id) if allocation_id else None
        if run is None or run.trial_id != trial_id:
            raise PermissionDeniedError(
                f"this call for trial {trial_id} does not carry the token of a running "
                "allocation of that trial"
            )
        return run

    def runs_by_trial(self) -> dict[int, Run]:
        return {t: self.runs[a] for t, a in self.run_of_trial.items()}


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
                owner=record.owner,
                progress=record.progress,
                shutdown=bool(saved.get("shutdown", False)),
                needs_start="searcher" not in saved,
            )
            marks: Mapping[str, Any] = saved.get("trials", {})
            for t in store.list_trials(record.id):
                experiment.add_trial(trial_state(store, t, marks.get(t.request_id, {})))
            out.append(experiment)
        offset += len(page.items)
        if not page.items or offset >= page.total:
            return out


def trial_state(store: Store, t: TrialRecord, mark: Mapping[str, Any]) -> TrialState:
    """A stored trial as memory holds it (`mark`: the search state's side of it)."""
    return TrialState(
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
        checkpoint=restore_point(store, t.latest_checkpoint),
        checkpointed=t.latest_checkpoint is not None,
        start_time=t.start_time,
        last_error=t.last_error,
        target=mark.get("target"),
        closed=bool(mark.get("closed", False)),
        parent_id=t.parent_trial_id,
        search_round=t.search_round or 0,
    )


def restore_point(store: Store, uuid: str | None) -> Restore | None:
    """The checkpoint `uuid` as a run restores from it; None if there is none to read."""
    if not uuid:
        return None
    try:
        c = store.get_checkpoint(uuid)
    except NotFoundError:
        return None
    if c.state == "DELETED":
        return None
    return Restore(c.uuid, c.total_batches, c.location, recorded_sha256(c))
