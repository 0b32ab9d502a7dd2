"""The harness's calls (the TrialService's side of the master): targets, validations,
progress, metrics and checkpoints of a running trial.

What each call decides is in `lifecycle/trial.py`; here are the lock, the commit and the
store. A call answers only what is durable.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from assay.master._checkpoints import reported_location
from assay.master.errors import InvalidArgumentError
from assay.master.lifecycle import Restore, Run
from assay.master.lifecycle import trial as trial_life
from assay.master.store import CheckpointRecord, MetricReport

if TYPE_CHECKING:
    from assay.master._core import Master


class HarnessCalls:
    """What a trial's processes ask of the master, by their run (found by its token)."""

    def __init__(self, master: Master) -> None:
        self._m = master

    def run_for_token(self, token: str, trial_id: int, run_id: int) -> Run:
        with self._m.lock:
            return self._m.ledger.run_for_token(token, trial_id)

    def next_operation(self, run: Run, total_batches: int) -> int | None:
        """The batch count to train to next, or None: checkpointed, the process may exit.

        Asked at start and after each completed target. A trial whose target is reached
        but not yet reported (a restore right after its validation) gets the same target
        back, validates and reports it.
        """
        with self._m.lock:
            answer = trial_life.next_target(run, self._m.trials.get(run.trial_id))
            run.released = answer is None
            ticket = self._m.commit.ticket()
        self._m.commit.wait(ticket)  # answer only what is durable
        return answer

    def complete_operation(
        self, run: Run, total_batches: int, metric: float, *, stop_requested: bool = False
    ) -> None:
        """The trial validated at its target: tell the searcher (a retry is a no-op).

        `stop_requested`: the trial's code asked to end here (Determined's
        `set_stop_requested`), at or before its target: it ends as completed once its
        process exits, and the searcher counts it as a trial that ended early.
        """
        with self._m.lock:
            trial = self._m.trials.get(run.trial_id)
            experiment = self._m.experiments.get(run.experiment_id)
            if trial is not None and experiment is not None:
                effects = trial_life.validated(
                    trial, experiment, total_batches, metric, stop_requested=stop_requested
                )
                self._m.do(effects)
                if effects:
                    self._m.schedule()
            # Once what the first report changed is durable, a retry has nothing to do.
            self._m.commit_and_wait()

    def best_validation(self, run: Run) -> float | None:
        """The best searcher-metric value any trial of `run`'s experiment has reported."""
        with self._m.lock:
            experiment = self._m.experiments.get(run.experiment_id)
            return trial_life.experiment_best(experiment) if experiment else None

    def report_progress(self, run: Run, progress: float) -> None:
        """A script's own estimate of how far it is (0..1): see `progress_reported`."""
        if not 0.0 <= progress <= 1.0:
            raise InvalidArgumentError(f"progress must be between 0 and 1, got {progress!r}")
        with self._m.lock:
            experiment = self._m.experiments.get(run.experiment_id)
            if experiment is None or experiment.config.searcher.name != "single":
                return
            self._m.do(trial_life.progress_reported(experiment, progress))
            self._m.commit_and_wait()

    def report_metrics(self, run: Run, group: str, reports: Sequence[MetricReport]) -> int:
        """Store a run's metrics and the trial's progress in one transaction (the store
        fences stale runs and makes retries no-ops), then update memory with it."""
        experiment = self._m.experiments.get(run.experiment_id)  # one read: no lock needed
        searcher = experiment.config.searcher if experiment is not None else None
        done = self._m.store.report_metrics_and_progress(
            run.trial_id,
            run.run_id,
            group,
            reports,
            searcher_metric=searcher.metric if searcher is not None else None,
            smaller_is_better=searcher.smaller_is_better if searcher is not None else True,
        )
        with self._m.lock:
            trial = self._m.trials.get(run.trial_id)
            if trial is not None:
                trial.total_batches = max(trial.total_batches, done.total_batches)
                trial.best_validation = done.best_validation
        return done.stored

    def report_checkpoint(self, run: Run, checkpoint: CheckpointRecord) -> None:
        """Record a checkpoint the run wrote; refused unless it is where it must be.

        The trial runs its user's code, so a report may say anything: only a uuid is
        accepted, and only at the location the experiment's storage gives that uuid, the
        one garbage collection and `DeleteCheckpoints` will delete.
        """
        with self._m.lock:
            experiment = self._m.experiments.get(run.experiment_id)
            config = experiment.config if experiment is not None else None
        location = reported_location(
            self._m.store, run.experiment_id, config, checkpoint, self._m.config.checkpoint_root
        )
        self._m.store.add_checkpoint(
            replace(checkpoint, trial_id=run.trial_id, run_id=run.run_id, location=location)
        )
        with self._m.lock:
            trial = self._m.trials.get(run.trial_id)
            if trial is not None:
                trial.checkpointed = True
            # As the store does: the newest checkpoint by batches is the one to restore.
            if trial is not None and checkpoint.total_batches >= trial.total_batches:
                trial.checkpoint = Restore(checkpoint.uuid, checkpoint.total_batches, location)
                trial.total_batches = checkpoint.total_batches


__all__ = ["HarnessCalls"]
