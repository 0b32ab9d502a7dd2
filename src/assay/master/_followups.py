"""How the interpreter runs each follow-up decision (`fx.FollowUp`) a decision returns.

A follow-up is a decision that needs the state the changes before it left: what the
searcher answers, whether an experiment is over, what a lost part or a run's end does.
Each function here decides it (or carries out the search it leads to) and returns the
steps to apply in its place; `FOLLOW_UPS` finds the function by the follow-up's type.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from assay.master._changes import Host, now
from assay.master.lifecycle import ExperimentStatus
from assay.master.lifecycle import agent as agent_life
from assay.master.lifecycle import effects as fx
from assay.master.lifecycle import experiment as experiment_life

log = logging.getLogger("assay.master")

_F = TypeVar("_F")
Steps = Sequence[fx.Effect]
Decide = Callable[[Host, Any], Steps]

FOLLOW_UPS: dict[type[Any], Decide] = {}
"""The function that runs each kind of follow-up decision, by its type."""


def _decides(
    kind: type[_F],
) -> Callable[[Callable[[Host, _F], Sequence[fx.Effect]]], Decide]:
    """Register the decorated function as the one that runs `kind`."""

    def register(decide: Callable[[Host, _F], Steps]) -> Decide:
        FOLLOW_UPS[kind] = decide
        return decide

    return register


@_decides(fx.Tell)
def _tell(it: Host, tell: fx.Tell) -> Steps:
    """Tell the searcher what became of a trial, and carry out its answer."""
    experiment = it.experiments.get(tell.experiment_id)
    if experiment is None or experiment.state not in (
        ExperimentStatus.ACTIVE,
        ExperimentStatus.PAUSED,
    ):
        return ()  # the experiment is being canceled or killed: the search is over
    handler = getattr(experiment.searcher, tell.event)
    it.search(experiment, handler(tell.request_id, *tell.args))
    return ()


@_decides(fx.Settle)
def _settle(it: Host, settle: fx.Settle) -> Steps:
    experiment = it.experiments.get(settle.experiment_id)
    if experiment is None:
        return ()
    effects, problem = experiment_life.settle(experiment, it.queued, now())
    if problem:
        log.error("%s", problem)
    return effects


@_decides(fx.PartLost)
def _part_lost(it: Host, lost: fx.PartLost) -> Steps:
    return part_lost(it, lost.allocation_id, lost.agent_id, lost.why)


def part_lost(it: Host, allocation_id: str, agent_id: str, why: str = "") -> Steps:
    """What becomes of a run whose part on `agent_id` is gone without an exit code."""
    run = it.runs.get(allocation_id)
    if run is None:
        return ()
    if why:
        log.warning("trial %d run %d: agent %s %s", run.trial_id, run.run_id, agent_id, why)
    return agent_life.part_lost(run, agent_id)


@_decides(fx.FinishRun)
def _finish_run(it: Host, finish: fx.FinishRun) -> Steps:
    run = it.runs.get(finish.allocation_id)
    return () if run is None else it.run_finished(run)


@_decides(fx.DropAgent)
def _drop_agent(it: Host, drop: fx.DropAgent) -> Steps:
    it.drop_agent(drop.agent_id, drop.why)
    return ()


__all__ = ["FOLLOW_UPS", "Decide", "part_lost"]
