"""A restarted master: the live experiments reloaded, the runs it left kept for their
agents to confirm, and each trial put back where it belongs (`lifecycle/trial.py`'s
`after_restart` and `awaited_run` decide)."""

from __future__ import annotations

import datetime as dt
import logging
import time
from typing import TYPE_CHECKING

from assay.master._state import load_live
from assay.master.lifecycle import ExperimentState
from assay.master.lifecycle import trial as trial_life
from assay.master.searcher import Create
from assay.master.store import AllocationRecord

if TYPE_CHECKING:
    from assay.master._core import Master

log = logging.getLogger("assay.master")


def recover(master: Master) -> None:
    """Reload the live experiments and requeue their unfinished trials (a restart)."""
    with master.lock:
        active = master.store.active_allocations()
        for experiment in load_live(master.store):
            master.ledger.add_experiment(experiment)
            if experiment.needs_start:
                _adopt_trials(master, experiment)
        for allocation in active:
            if not _await_run(master, allocation):
                master.batch.set_allocation(allocation.id, state="TERMINATED", ended_at=_now())
        for experiment in list(master.experiments.values()):
            master.do(trial_life.after_restart(experiment, master.run_of_trial, _now()))
        master.schedule()
    master.commit.flush()


def _await_run(master: Master, allocation: AllocationRecord) -> bool:
    """Keep a run found in the store for its agents to confirm; False if it is over."""
    trial = master.trials.get(allocation.trial_id)
    wait = master.config.agent_reconnect_wait_s
    if trial is None or wait <= 0:
        return False
    placement = tuple(
        (str(part["agent_id"]), tuple(int(s) for s in part["slots"]))
        for part in allocation.placement
    )
    run = trial_life.awaited_run(
        allocation.id,
        allocation.run_id,
        placement,
        trial,
        master.experiments[trial.experiment_id],
        token=master.token(allocation.id),
        deadline=time.monotonic() + wait,
    )
    if run is None:
        return False
    master.ledger.add_run(run)
    log.info("trial %d run %d: waiting for its agents to confirm it", trial.id, run.run_id)
    return True


def _adopt_trials(master: Master, experiment: ExperimentState) -> None:
    """Start the search of an experiment stored without one, on the trials it has.

    Its trials take the request ids of the searcher's first Creates, in id order (the
    rename is recorded), and the operations are then carried out as for a new
    experiment: Creates beyond the stored trials make new ones.
    """
    experiment.needs_start = False
    existing = sorted(experiment.trials.values(), key=lambda t: t.id)
    ops = experiment.searcher.initial_operations()
    for op in ops:
        if isinstance(op, Create) and existing:
            trial = existing.pop(0)
            del experiment.by_request[trial.request_id]
            trial.request_id = op.request_id
            experiment.by_request[op.request_id] = trial
            master.batch.rename_trial_request(trial.id, op.request_id)
    master.search(experiment, ops)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


__all__ = ["recover"]
