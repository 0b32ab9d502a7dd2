"""How the interpreter applies each change a lifecycle decision returns (`fx.Change`).

One function per kind of change, found by the change's type in `CHANGES`: each updates
the master's memory, records what it changed in the open `WriteBatch`, or queues a
message for an agent, and returns nothing. A decision that needs the state after these
changes is a follow-up (`_followups.py`), not a change.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Sequence
from concurrent import futures
from typing import Any, Protocol, TypeVar

from assay.master._config import MasterConfig
from assay.master._state import Ledger, ModelCache
from assay.master.auth import mask_secrets
from assay.master.checkpoints import collect_later
from assay.master.fleet import Fleet
from assay.master.lifecycle import ExperimentState, KillRun, Run, TrialState, TrialStatus
from assay.master.lifecycle import effects as fx
from assay.master.scheduler import Pools, Request
from assay.master.searcher import Operation
from assay.master.store import Store, UsagePart, WriteBatch
from assay.master.telemetry import Telemetry, pool_of

log = logging.getLogger("assay.master")


class _After(Protocol):
    def after(self, action: Callable[[], None]) -> None: ...


class Host(Protocol):
    """What the changes and follow-ups use of the interpreter (`_interpreter.Interpreter`):
    its memory, the open batch, and the steps that are its own."""

    @property
    def config(self) -> MasterConfig: ...
    @property
    def store(self) -> Store: ...
    @property
    def commit(self) -> _After: ...
    @property
    def batch(self) -> WriteBatch: ...
    @property
    def scheduler(self) -> Pools: ...
    @property
    def fleet(self) -> Fleet: ...
    @property
    def ledger(self) -> Ledger: ...
    @property
    def models(self) -> ModelCache: ...
    @property
    def telemetry(self) -> Telemetry: ...
    @property
    def gc(self) -> futures.ThreadPoolExecutor: ...
    @property
    def storages(self) -> dict[str, Any]: ...
    @property
    def awaiting(self) -> dict[int, list[int]]: ...
    @property
    def experiments(self) -> dict[int, ExperimentState]: ...
    @property
    def runs(self) -> dict[str, Run]: ...
    @property
    def run_of_trial(self) -> dict[int, str]: ...
    @property
    def queued(self) -> dict[int, Request]: ...

    def copy_checkpoint(self, trial: TrialState, parent: TrialState) -> None: ...

    def search(self, experiment: ExperimentState, ops: Sequence[Operation]) -> None: ...

    def run_finished(self, run: Run) -> Sequence[fx.Effect]: ...

    def drop_agent(self, agent_id: str, why: str) -> None: ...


_C = TypeVar("_C")
Apply = Callable[[Host, Any], None]

CHANGES: dict[type[Any], Apply] = {}
"""The function that applies each kind of change, by the change's type."""


def _applies(kind: type[_C]) -> Callable[[Callable[[Host, _C], None]], Apply]:
    """Register the decorated function as the one that applies `kind`."""

    def register(apply: Callable[[Host, _C], None]) -> Apply:
        CHANGES[kind] = apply
        return apply

    return register


@_applies(fx.SetTrial)
def _set_trial(it: Host, change: fx.SetTrial) -> None:
    it.ledger.set_trial(change.trial_id, change.fields)


@_applies(fx.SetExperiment)
def _set_experiment(it: Host, change: fx.SetExperiment) -> None:
    it.ledger.set_experiment(change.experiment_id, change.fields)


@_applies(fx.RecordSearch)
def _record_search(it: Host, change: fx.RecordSearch) -> None:
    experiment = it.experiments.get(change.experiment_id)
    if experiment is not None:
        it.ledger.set_experiment(experiment.id, {"searcher_state": experiment.search_state()})


@_applies(fx.Enqueue)
def _enqueue(it: Host, change: fx.Enqueue) -> None:
    it.ledger.enqueue(change.trial_id, to_back=change.to_back)


@_applies(fx.Dequeue)
def _dequeue(it: Host, change: fx.Dequeue) -> None:
    it.queued.pop(change.trial_id, None)


@_applies(fx.Kill)
def _kill(it: Host, change: fx.Kill) -> None:
    run = it.runs.get(change.allocation_id)
    if run is None:
        return
    if change.stopping is not None and change.stopping != run.stopping:
        run.stopping = change.stopping
        # In the commit that records its trial STOPPING: a restarted master finishes
        # this stop, not one it would guess from the experiment.
        it.batch.set_allocation(run.allocation_id, stopping=change.stopping)
    it.fleet.kill(run, graceful=change.graceful)


@_applies(fx.Log)
def _log(it: Host, change: fx.Log) -> None:
    # The trial's log has the line; the master's own log repeats what went wrong.
    level = logging.getLevelName(change.level)
    shown = level if level >= logging.WARNING else logging.DEBUG
    log.log(shown, "trial %d: %s", change.trial_id, change.message)
    it.batch.log(change.trial_id, change.run_id, change.message, level=change.level, now=now())


@_applies(fx.CollectGarbage)
def _collect_garbage(it: Host, change: fx.CollectGarbage) -> None:
    """Once the end is committed, delete the checkpoints the policy does not keep."""
    collect = collect_later(
        it.gc,
        it.store,
        change.experiment_id,
        it.experiments[change.experiment_id].config,
        ended_trial_ids=change.ended_trial_ids,
        experiment_ended=change.experiment_ended,
        default_root=it.config.checkpoint_root,
        storage_cache=it.storages,
        policy=it.config.storage_policy,
    )
    it.commit.after(collect)


@_applies(fx.Drop)
def _drop(it: Host, change: fx.Drop) -> None:
    it.ledger.drop_experiment(change.experiment_id)
    it.models.drop(change.experiment_id)


@_applies(fx.NewTrial)
def _new_trial(it: Host, new: fx.NewTrial) -> None:
    trial_id = it.store.reserve_id("trials")
    trial = TrialState(
        trial_id, new.experiment_id, new.request_id, new.hparams, new.seed, new.state
    )
    parent = None
    if new.checkpoint_from is not None:
        parent = it.experiments[new.experiment_id].by_request.get(new.checkpoint_from)
        if parent is None:
            raise ValueError(f"Create({new.request_id}): no trial {new.checkpoint_from!r}")
        trial.parent_id, trial.search_round = parent.id, new.search_round
        if parent.id in it.run_of_trial:
            # Its parent has not stopped at a checkpoint yet: it starts once it has.
            trial.state, trial.awaiting_parent = TrialStatus.PAUSED, True
            it.awaiting.setdefault(parent.id, []).append(trial.id)
    it.ledger.add_trial(trial, now())
    if parent is not None and not trial.awaiting_parent:
        it.copy_checkpoint(trial, parent)
    if trial.state == TrialStatus.QUEUED:
        it.ledger.enqueue(trial.id)


@_applies(fx.StartRun)
def _start_run(it: Host, start: fx.StartRun) -> None:
    run = start.run
    if start.supersede_after is not None:
        searcher = it.experiments[run.experiment_id].config.searcher
        it.batch.supersede_metrics(
            run.trial_id, start.supersede_after, searcher.metric, searcher.smaller_is_better
        )
        if searcher.metric is not None:
            # The trial's best becomes the best of what is left, in memory as in the
            # store: what `describe`, the Core API and a restarted master all see.
            it.ledger.trials[run.trial_id].best_validation = it.store.best_validation_through(
                run.trial_id, start.supersede_after, searcher.metric, searcher.smaller_is_better
            )
    at = now()
    it.batch.add_allocation(
        run.allocation_id,
        trial_id=run.trial_id,
        run_id=run.run_id,
        placement=[{"agent_id": a, "slots": list(s)} for a, s in run.placement],
        now=at,
    )
    it.batch.usage_started(
        run.allocation_id,
        experiment_id=run.experiment_id,
        trial_id=run.trial_id,
        run_id=run.run_id,
        parts=[_usage_part(it, a, len(s)) for a, s in run.placement],
        now=at,
    )
    it.ledger.add_run(run)
    for agent_id, message in start.messages:
        it.fleet.send(agent_id, message)
    it.telemetry.allocation_started()


def _usage_part(it: Host, agent_id: str, slots: int) -> UsagePart:
    handle = it.fleet.agents.get(agent_id)
    slot_type = handle.slot_type if handle is not None else it.fleet.slot_type()
    return UsagePart(agent_id, slots, slot_type, pool_of(it.fleet, agent_id))


@_applies(fx.Adopt)
def _adopt(it: Host, adopt: fx.Adopt) -> None:
    run = it.runs[adopt.allocation_id]
    run.awaiting.discard(adopt.agent_id)
    slots = dict(run.placement)[adopt.agent_id]
    it.scheduler.adopt(str(run.trial_id), adopt.agent_id, slots, str(run.experiment_id))
    log.info("trial %d run %d re-adopted on %s", run.trial_id, run.run_id, adopt.agent_id)


@_applies(fx.PartEnded)
def _part_ended(it: Host, ended: fx.PartEnded) -> None:
    run = it.runs.get(ended.allocation_id)
    if run is None:
        return
    run.exit_codes[ended.agent_id] = list(ended.exit_codes)
    if ended.message:
        run.messages.append(mask_secrets(f"{ended.agent_id}: {ended.message}"))
    if ended.failure and run.failure is None:
        run.failure = mask_secrets(ended.failure)
    if ended.lost:
        run.awaiting.discard(ended.agent_id)
        run.lost = True
        # The agent's slots are gone (or it lost the processes): its part ends here.
        it.batch.usage_ended(ended.allocation_id, now(), agent_id=ended.agent_id)


@_applies(fx.KillUnknown)
def _kill_unknown(it: Host, change: fx.KillUnknown) -> None:
    it.fleet.send(change.agent_id, KillRun(change.allocation_id, graceful=False))


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


__all__ = ["CHANGES", "Apply", "Host", "now"]
