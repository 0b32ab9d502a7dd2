"""The master's in-memory view of its live experiments, trials, runs and queue.

The master decides from memory and writes every change through a `WriteBatch` (see
_commit.py), so its hot paths never read the database. `Ledger` holds the experiments
that are not finished yet, and writes each change to them through to the open batch; a
finished one is dropped and read from the store when asked about. `load_live` rebuilds
memory from the store when the master starts.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from assay.config import parse_config, searcher_in_batches
from assay.master.checkpoints import recorded_sha256
from assay.master.errors import NotFoundError, PermissionDeniedError
from assay.master.lifecycle import (
    LIVE_EXPERIMENT,
    MEMORY_ONLY,
    ExperimentState,
    ExperimentStatus,
    Failure,
    Restore,
    Run,
    TrialState,
    TrialStatus,
)
from assay.master.scheduler import Request, SlotType
from assay.master.searcher import restore_searcher
from assay.master.store import ArchiveFile, ModelDefinition, Store, TrialRecord, WriteBatch, size_of
from assay.master.submission import new_searcher


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
            avoid=frozenset(trial.excluded_agents),
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


class ModelCache:
    """Model definitions of live experiments, so that a trial's start does not read its
    archive from the store each time.

    With a `directory` (the master's `<state_dir>/models`) they are files there, read when
    a trial starts, so the master holds no archive in memory between starts; an upload
    spooled to disk becomes its file by a hard link. It is a cache (the store keeps every
    archive): emptied when the master starts, and kept to `max_bytes` (1 GiB), the least
    recently used dropped first. Without a directory they are kept in memory (256 MiB).
    Called under the master's lock.
    """

    def __init__(
        self, store: Store, directory: Path | None = None, max_bytes: int | None = None
    ) -> None:
        self.store = store
        self.directory = directory
        self.max_bytes = max_bytes or (2**30 if directory is not None else 256 * 2**20)
        self._sizes: OrderedDict[int, int] = OrderedDict()  # experiment -> archive bytes
        self._data: dict[int, bytes] = {}  # without a directory
        self._bytes = 0
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(mode=0o700, parents=True)

    def put(self, experiment_id: int, data: ModelDefinition) -> None:
        self.drop(experiment_id)
        if self.directory is None:
            self._data[experiment_id] = data if isinstance(data, bytes) else data.read()
        else:
            self._write(self.directory / f"{experiment_id}.tar.gz", data)
        self._sizes[experiment_id] = size = size_of(data)
        self._bytes += size
        while self._bytes > self.max_bytes and len(self._sizes) > 1:
            self.drop(next(iter(self._sizes)))

    def get(self, experiment_id: int) -> bytes:
        if experiment_id in self._sizes:
            self._sizes.move_to_end(experiment_id)
            if self.directory is None:
                return self._data[experiment_id]
            try:
                return (self.directory / f"{experiment_id}.tar.gz").read_bytes()
            except FileNotFoundError:  # removed behind our back: the store has it
                self.drop(experiment_id)
        data = self.store.get_model_definition(experiment_id)
        self.put(experiment_id, data)
        return data

    def drop(self, experiment_id: int) -> None:
        size = self._sizes.pop(experiment_id, None)
        if size is None:
            return
        self._bytes -= size
        self._data.pop(experiment_id, None)
        if self.directory is not None:
            (self.directory / f"{experiment_id}.tar.gz").unlink(missing_ok=True)

    @staticmethod
    def _write(path: Path, data: ModelDefinition) -> None:
        part = path.with_suffix(".part")
        part.unlink(missing_ok=True)
        if isinstance(data, ArchiveFile):
            try:
                os.link(data.path, part)
            except OSError:  # another filesystem, or none that links
                shutil.copyfile(data.path, part)
        else:
            part.write_bytes(data)
        os.replace(part, path)


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
        last_failure=Failure.from_json(mark.get("failure")),
        excluded_agents=tuple(str(a) for a in mark.get("excluded_agents") or ()),
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
