"""Preemption: which runs the master stops, at a checkpoint, so that a waiting trial fits.

After a scheduling round that left trials waiting, a fair-share pool stops runs of
experiments above their share for the first waiting trial of one below it, and a
priority pool stops lower-priority runs for the first trial that waits for room. The
victims are the pure scheduler's choice (`choose_victims`, `fair_share_victims`); these
functions read the master's memory (its `Ledger`) for it and return the effects that
stop them, which the `Interpreter` applies. One wave at a time: while a run stops for
preemption, nothing else is stopped, as the slots it frees go to the queue first.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Protocol

from assay.master.lifecycle import ExperimentState, Run
from assay.master.lifecycle import effects as fx
from assay.master.lifecycle.run import preemption
from assay.master.scheduler import Decision, Pools, Request, Running, choose_victims
from assay.master.sharing._sharing import fair_share_victims


class Ledger(Protocol):
    """What preemption reads of the master's memory (the shell's `Ledger`)."""

    @property
    def experiments(self) -> Mapping[int, ExperimentState]: ...

    @property
    def runs(self) -> Mapping[str, Run]: ...

    @property
    def run_of_trial(self) -> Mapping[int, str]: ...


def for_share(
    decision: Decision, pending: Sequence[Request], ledger: Ledger, pools: Pools, default: bool
) -> list[fx.Effect]:
    """Fair-share pools: stop runs of experiments above their share (at a checkpoint)
    for the first waiting trial of one below its share. `default`: the master's
    preemption, for pools that do not set their own."""
    if any(run.stopping == "preempt" for run in ledger.runs.values()):
        return []  # one wave at a time: the slots it frees go to the queue first
    for name in pools.names:
        spec = pools.specs[name]
        if spec.scheduler != "fair_share" or not spec.preempts(default):
            continue
        mine = {r.id: r for r in pending if pools.resolve(r.pool) == name}
        scheduler = pools.scheduler(name)
        runs = [
            run
            for run in ledger.runs.values()
            if scheduler.allocation_of(str(run.trial_id)) is not None
        ]
        found = fair_share_victims(decision, mine, runs, scheduler)
        if found is not None:
            request, victims = found
            stopped = [ledger.runs[ledger.run_of_trial[int(v)]] for v in victims]
            return preemption(request.id, request.priority, stopped, fair_share=True)
    return []


def for_priority(
    decision: Decision,
    pending: Sequence[Request],
    placed: Collection[str],
    ledger: Ledger,
    pools: Pools,
    default: bool,
) -> list[fx.Effect]:
    """Stop lower-priority runs (gracefully) so that the first trial the round left
    waiting for room, in a pool that preempts, fits when they are gone."""
    preempts = {name: spec.preempts(default) for name, spec in pools.specs.items()}
    # Only a trial that waits for room: stopping others cannot lift a cap.
    short = [
        r
        for r in pending
        if r.id not in placed
        and preempts.get(pools.resolve(r.pool), False)
        and _waits_for_room(decision, r.id)
    ]
    if not short:
        return []
    return _preempt_for(min(short, key=lambda r: r.rank), ledger, pools)


def _preempt_for(request: Request, ledger: Ledger, pools: Pools) -> list[fx.Effect]:
    """Stop lower-priority runs (gracefully) so that `request` fits when they are gone."""
    if any(run.stopping == "preempt" for run in ledger.runs.values()):
        return []  # one wave at a time: the slots it frees go to the queue first
    running = [
        Running(str(run.trial_id), experiment.priority, run.trial_id, run.placement)
        for run in ledger.runs.values()
        if run.stopping is None
        and not run.awaiting
        and (experiment := ledger.experiments.get(run.experiment_id)) is not None
    ]
    # Within the request's pool, on the agents its label allows; fair-share pools
    # preempt for shares (`for_share`), not for priority.
    if pools.unknown(request.pool) or pools.kind(request.pool) != "priority":
        return []
    free = {
        a.id: len(pools.free_slots(a.id))
        for a in pools.scheduler(request.pool).agents
        if a.enabled
        and a.slot_type == request.slot_type
        and (not request.label or a.label == request.label)
    }
    victims = choose_victims(request, running, free) or []
    runs = [ledger.runs[ledger.run_of_trial[int(v)]] for v in victims]
    return preemption(request.id, request.priority, runs)


def _waits_for_room(decision: Decision, request_id: str) -> bool:
    wait = decision.waiting.get(request_id)
    return wait is None or wait.kind in ("no_free_slots", "priority")


__all__ = ["for_priority", "for_share"]
