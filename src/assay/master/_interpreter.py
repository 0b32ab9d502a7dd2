"""The master's effect interpreter: it applies the lifecycles' effects, and schedules.

`Interpreter` owns the master's memory (the `Ledger`, the agents' `Fleet`, the pure
`Scheduler`) and carries out what the decisions in `lifecycle/` return, step by step: a
change (`_changes.py`) updates memory, records itself in the open `WriteBatch`, or
queues a message to an agent that is sent once the batch is committed; a follow-up
decision (`_followups.py`) is decided on the memory as it is then, and its own steps are
applied in its place. It holds no lock and never commits: its caller (`Master`, in
_core.py) takes the lock around every call and commits afterwards.
It knows nothing of `Master`; of the group commit it uses only the open batch and the
actions that run after a commit (`Recorder`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import random
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent import futures
from dataclasses import replace
from typing import Any, Protocol, get_args

from assay.common.storage import experiment_directory
from assay.master._changes import CHANGES, now
from assay.master._config import MasterConfig
from assay.master._followups import FOLLOW_UPS, part_lost
from assay.master._state import Ledger, ModelCache, load_live
from assay.master.fleet import Fleet
from assay.master.lifecycle import (
    TERMINAL_TRIAL,
    ExperimentState,
    ExperimentStatus,
    Run,
    TrialState,
    TrialStatus,
    finish_run,
    run_end,
)
from assay.master.lifecycle import effects as fx
from assay.master.lifecycle import experiment as experiment_life
from assay.master.lifecycle import trial as trial_life
from assay.master.lifecycle.run import end_trial, requeue, stop_to_requeue
from assay.master.scheduler import Wait
from assay.master.searcher import Create, Operation
from assay.master.sharing import limits
from assay.master.sharing import preemption as preempt
from assay.master.store import AllocationRecord, Store, WriteBatch
from assay.master.telemetry import NO_TELEMETRY, Telemetry

# The chief's rendezvous port for a trial that spans agents (every rank must know it before
# any starts). Below Linux's ephemeral ports (32768-60999 by default), where every socket
# bound to port 0 on the agent's machine gets its port: a port drawn there had been taken
# by one now and then, and the trial's run failed (EADDRINUSE).
RENDEZVOUS_PORTS = range(20000, 32768)

log = logging.getLogger("assay.master")
E, T = ExperimentStatus, TrialStatus


class Recorder(Protocol):
    """What the interpreter uses of the group commit (`GroupCommit`)."""

    @property
    def batch(self) -> WriteBatch:
        """The open batch: every change is recorded in it."""

    def after(self, action: Callable[[], None]) -> None:
        """Run `action` once the changes recorded so far are committed."""


class Interpreter:
    """The master's memory, and the one place that changes it (called under a lock)."""

    def __init__(self, config: MasterConfig, store: Store, commit: Recorder) -> None:
        self.config = config
        self.store = store
        self.commit = commit
        self.scheduler = config.new_pools()  # one pure Scheduler per resource pool
        self.fleet = Fleet(self.scheduler, lambda: commit.batch, commit.after, config.kill_grace_s)
        # Memory of the live experiments: the ledger's own dicts, read here, changed there.
        self.ledger = ledger = Ledger(lambda: commit.batch)
        self.experiments, self.trials = ledger.experiments, ledger.trials
        self.runs, self.run_of_trial, self.queued = ledger.runs, ledger.run_of_trial, ledger.queued
        self.models = ModelCache(store, config.state_dir / "models")  # files, not memory
        # Queued trials that cannot be placed even on an idle cluster, and why.
        self.unplaceable: dict[int, str] = {}
        # Why each queued trial waits, in the order the last round considered them.
        self.waiting: dict[int, Wait] = {}
        # Live experiments whose workspace may not use their resource pool, and why, by
        # experiment id as the requests' group (`PoolAccess`): their trials wait.
        self.barred: dict[str, str] = {}
        self.telemetry: Telemetry = NO_TELEMETRY  # the master's counters (metrics on)
        self.trial_api = config.advertised_address or f"127.0.0.1:{config.grpc_port}"
        # Allocation tokens derive from a secret in the store, so a restarted master
        # recognises the trial processes that kept running. The HMAC's keyed state is
        # built once and copied per token (building it costs more than the digest).
        self._token_mac = hmac.new(store.secret("allocation-tokens"), digestmod=hashlib.sha256)
        self._checkpoint_root = str(config.checkpoint_root)
        # Checkpoint deletions, one at a time, off the master's lock (storage I/O).
        self.gc = futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="gc")
        self.storages: dict[str, Any] = {}
        # Trials created from a running trial's checkpoint (pbt), by that trial's id: they
        # start when its run ends, from the checkpoint it leaves.
        self.awaiting: dict[int, list[int]] = {}

    @property
    def batch(self) -> WriteBatch:
        return self.commit.batch

    def token(self, allocation_id: str) -> str:
        mac = self._token_mac.copy()
        mac.update(allocation_id.encode())
        digest = mac.digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    # --- start-up -------------------------------------------------------------------------

    def recover(self) -> None:
        """Reload the live experiments and requeue their unfinished trials (a restart)."""
        active = self.store.active_allocations()
        for experiment in load_live(self.store):
            self.ledger.add_experiment(experiment)
            if experiment.needs_start:
                self._adopt_trials(experiment)
        for allocation in active:
            if not self._await_run(allocation):
                self._allocation_ended(allocation.id)
        for experiment in self.experiments.values():
            self._resume_copies(experiment)
        # Usage records whose allocation is over (or gone with its trial) close now.
        self.batch.usage_orphans_closed(now())
        for experiment in list(self.experiments.values()):
            self.do(trial_life.after_restart(experiment, self.run_of_trial, now()))
        self.schedule()

    def _await_run(self, allocation: AllocationRecord) -> bool:
        """Keep a run found in the store for its agents to confirm; False if it is over."""
        trial = self.trials.get(allocation.trial_id)
        wait = self.config.agent_reconnect_wait_s
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
            self.experiments[trial.experiment_id],
            token=self.token(allocation.id),
            deadline=time.monotonic() + wait,
            stopping=allocation.stopping,
        )
        if run is None:
            return False
        self.ledger.add_run(run)
        log.debug("trial %d run %d: waiting for its agents to confirm it", trial.id, run.run_id)
        return True

    def adopt_trials(self, experiment: ExperimentState) -> None:
        """Start the search of an experiment whose trials exist already (a continued one)."""
        self._adopt_trials(experiment)

    def _adopt_trials(self, experiment: ExperimentState) -> None:
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
                self.batch.rename_trial_request(trial.id, op.request_id)
        self.search(experiment, ops)

    def _resume_copies(self, experiment: ExperimentState) -> None:
        """Copies (pbt) that had not started from their parent's checkpoint when the master
        stopped: each waits for its parent's run, or takes its parent's checkpoint now."""
        for trial in experiment.trials.values():
            parent = self.trials.get(trial.parent_id) if trial.parent_id is not None else None
            if (
                parent is None
                or trial.run_id
                or trial.checkpoint is not None
                or trial.state not in (T.QUEUED, T.PAUSED)
            ):
                continue
            if parent.id in self.run_of_trial:
                trial.awaiting_parent = True
                self.awaiting.setdefault(parent.id, []).append(trial.id)
            else:
                self.copy_checkpoint(trial, parent)

    # --- effects --------------------------------------------------------------------------

    def do(self, effects: Iterable[fx.Effect]) -> None:
        """Apply a lifecycle decision's effects, in order."""
        for effect in effects:
            self._apply(effect)

    def _apply(self, effect: fx.Effect) -> None:
        """A change is applied; a follow-up decision is decided now, on the memory the
        steps before it left, and its own steps are applied in its place."""
        change = CHANGES.get(type(effect))
        if change is not None:
            change(self, effect)
        else:
            self.do(FOLLOW_UPS[type(effect)](self, effect))

    def search(self, experiment: ExperimentState, ops: Sequence[Operation]) -> None:
        """Carry out the searcher's operations (and those they lead to), then record it."""
        pending = deque(ops)
        copied: set[str] = set()
        while pending:
            op = pending.popleft()
            if isinstance(op, Create) and op.checkpoint_from is not None:
                copied.add(op.checkpoint_from)
            for effect in experiment_life.apply_operation(experiment, op, self.run_of_trial, now()):
                if isinstance(effect, fx.Tell) and effect.event in (
                    "on_trial_created",
                    "on_trial_closed",
                ):
                    # The searcher's answers join the queue of operations.
                    handler = getattr(experiment.searcher, effect.event)
                    pending.extend(handler(effect.request_id, *effect.args))
                else:
                    self._apply(effect)
        for request_id in sorted(copied):
            self._checkpoint_for_copies(experiment.by_request[request_id])
        progress = experiment.progress
        if experiment.config.searcher.name != "single":
            # A search's progress is its budget spent; a `single` one's, its trial's
            # batches (`trial.progress_trained`): the searcher counts a failed trial's
            # remaining batches as spent, which read 99% for a trial that failed at once.
            progress = max(progress, experiment.searcher.progress())
        search = {"searcher_state": experiment.search_state(), "progress": progress}
        self.ledger.set_experiment(experiment.id, search)

    def copy_checkpoint(self, trial: TrialState, parent: TrialState) -> None:
        """`trial` starts from `parent`'s latest checkpoint, at its batch count. The store
        names that checkpoint as the trial's latest until it has one of its own, which keeps
        it from garbage collection and tells a restarted master where the trial starts."""
        restore = parent.checkpoint
        if restore is None:
            message = f"assay: trial {parent.id} left no checkpoint to copy; starting from scratch"
            self.do([fx.Log(trial.id, trial.run_id, message, "WARNING")])
            return
        self.ledger.set_trial(
            trial.id, {"checkpoint": restore, "total_batches": restore.total_batches}
        )
        self.batch.set_trial(trial.id, latest_checkpoint=restore.uuid)
        message = (
            f"assay: starts from checkpoint {restore.uuid} of trial {parent.id} at batch "
            f"{restore.total_batches} (round {trial.search_round})"
        )
        self.do([fx.Log(trial.id, trial.run_id, message)])

    def _checkpoint_for_copies(self, parent: TrialState) -> None:
        """A running trial that others copy, and that goes on training, stops at a
        checkpoint first (and resumes from it): a trial that pauses or closes checkpoints
        as it stops anyway."""
        allocation_id = self.run_of_trial.get(parent.id)
        run = self.runs.get(allocation_id) if allocation_id is not None else None
        if run is None or run.stopping is not None or parent.closed or parent.target is None:
            return
        why = f"stops at a checkpoint for trials {self.awaiting.get(parent.id, [])} to copy"
        self.do(stop_to_requeue(run, why))

    def _release_copies(self, parent: TrialState) -> None:
        """The parent's run ended: the trials waiting for it start from its checkpoint."""
        for trial_id in self.awaiting.pop(parent.id, []):
            trial = self.trials.get(trial_id)
            if trial is None or not trial.awaiting_parent:
                continue
            trial.awaiting_parent = False
            if trial.state in TERMINAL_TRIAL:
                continue
            self.copy_checkpoint(trial, parent)
            experiment = self.experiments[trial.experiment_id]
            if experiment.state == E.ACTIVE and trial.target is not None and not trial.closed:
                self.do(requeue(trial))

    # --- scheduling -----------------------------------------------------------------------

    def schedule(self) -> None:
        if not self.queued:
            if self.unplaceable or self.waiting:
                self.unplaceable, self.waiting = {}, {}
            return
        # Agents may have joined or left since a request was queued: one pass sets its
        # type, which each pool decides for itself.
        slot_types = {name: self.fleet.slot_type(name) for name in self.scheduler.names}
        pending = [
            r
            if r.slot_type == slot_types.get(r.pool or self.scheduler.default, r.slot_type)
            else replace(r, slot_type=slot_types[r.pool or self.scheduler.default])
            for r in self.queued.values()
        ]
        held: list[tuple[str, str]] = []
        if self.barred:
            held = [(r.id, why) for r in pending if (why := self.barred.get(r.group))]
            pending = [r for r in pending if r.group not in self.barred]
        bounds = limits(self.experiments, self.config.user_slot_quota)
        decision = self.telemetry.round(self.scheduler.schedule, pending, bounds)
        self._note_unplaceable([*decision.unschedulable, *held])
        self.waiting = {int(r): wait for r, wait in decision.waiting.items()}
        placed = {a.request_id for a in decision.assignments}
        preemption = self.config.preemption  # of the pools that do not set their own
        if decision.shares:
            self.do(preempt.for_share(decision, pending, self.ledger, self.scheduler, preemption))
        if len(placed) < len(pending):
            self.do(
                preempt.for_priority(
                    decision, pending, placed, self.ledger, self.scheduler, preemption
                )
            )
        for assignment in decision.assignments:
            trial = self.trials[int(assignment.request_id)]
            self.queued.pop(trial.id, None)
            try:
                self._start(trial, assignment.placement)
            except Exception:
                log.exception("could not start trial %d", trial.id)
                self.scheduler.release(assignment.request_id)
                run = self.ledger.runs_by_trial().get(trial.id)
                if run is not None and self.ledger.end_run(run):
                    self.fleet.kill(run, graceful=False)
                    self._allocation_ended(run.allocation_id)
                self.do([*end_trial(trial, T.ERROR, now()), fx.Settle(trial.experiment_id)])

    def _note_unplaceable(self, unschedulable: Sequence[tuple[str, str]]) -> None:
        """Remember why queued trials cannot be placed on the cluster as it is; a trial's
        log says so once (and again when the reason changes) when the cluster has agents."""
        now = {int(request_id): why for request_id, why in unschedulable}
        # With no agent at all (a master starting, its agents not back yet) the reason
        # is in the queue and describe, not written into every queued trial's log.
        for trial_id, why in now.items() if self.scheduler.has_agents else ():
            if self.unplaceable.get(trial_id) != why:
                trial = self.trials[trial_id]
                self.do([fx.Log(trial_id, trial.run_id, f"waiting: {why}", "WARNING")])
        self.unplaceable = now  # one assignment: readers without the lock see old or new

    def _start(self, trial: TrialState, placement: tuple[tuple[str, tuple[int, ...]], ...]) -> None:
        experiment = self.experiments[trial.experiment_id]
        # The suffix only tells runs of restarted masters apart; the token is the secret.
        allocation_id = f"{trial.id}.{trial.run_id + 1}.{random.getrandbits(32):08x}"
        # The experiment's own directory: its trials write there, and an isolating agent
        # gives it to the experiment's group alone.
        host = experiment.config.checkpoint_storage.host_directory
        root = str(experiment_directory(host or self._checkpoint_root, trial.experiment_id))
        effects = trial_life.start(
            trial,
            experiment,
            placement,
            allocation_id=allocation_id,
            token=self.token(allocation_id),
            addresses=self.fleet.addresses(a for a, _ in placement),
            port=random.choice(RENDEZVOUS_PORTS),
            model=self.models.get(trial.experiment_id),
            trial_api=self.trial_api,
            checkpoint_root=root,
            now=now(),
        )
        self.do(effects)
        log.debug("trial %d run %d started on %s", trial.id, trial.run_id, _where(placement))

    def drop_agent(self, agent_id: str, why: str) -> None:
        """Give up on an agent: its runs' parts are lost, its slots leave the scheduler."""
        log.warning("agent %s %s", agent_id, why)
        self.parts_lost(agent_id, self.fleet.drop(agent_id))
        self.schedule()

    def parts_lost(self, agent_id: str, request_ids: Iterable[str]) -> None:
        for request_id in request_ids:
            allocation_id = self.run_of_trial.get(int(request_id))
            if allocation_id is not None:
                self.do(part_lost(self, allocation_id, agent_id))

    # --- the end of a run -----------------------------------------------------------------

    def run_finished(self, run: Run) -> Sequence[fx.Effect]:
        """Release the ended run's slots and close its records; the steps that decide
        its trial's fate."""
        if not self.ledger.end_run(run):
            return ()
        self.scheduler.release(str(run.trial_id))
        self._allocation_ended(run.allocation_id)
        trial = self.trials[run.trial_id]
        experiment = self.experiments[run.experiment_id]
        config = experiment.config
        end = run_end(
            run,
            trial,
            experiment.state,
            is_script=config.is_script,
            max_restarts=config.max_restarts,
            metric=config.searcher.metric,
            policies=config.log_policies,
        )
        outcome, effects = finish_run(run, trial, end, now())
        self.telemetry.allocation_ended(outcome.name.lower())
        log.debug("trial %d run %d ended: %s", trial.id, run.run_id, outcome.value)
        if trial.id in self.awaiting:
            self._release_copies(trial)  # before its own effects: it may requeue and resume
        return effects

    def _allocation_ended(self, allocation_id: str) -> None:
        """Record that the allocation is over, and close its usage records, as of now."""
        at = now()
        self.batch.set_allocation(allocation_id, state="TERMINATED", ended_at=at)
        self.batch.usage_ended(allocation_id, at)


def _where(placement: tuple[tuple[str, tuple[int, ...]], ...]) -> str:
    """`agent-1 (slots 0, 1), agent-2 (slot 0)`: a placement as a person reads it."""
    return ", ".join(
        f"{agent} (slot{'s' if len(slots) != 1 else ''} {', '.join(map(str, slots))})"
        for agent, slots in placement
    )


def _check_tables() -> None:
    """Every step a decision can return has exactly one way to be applied."""
    changes, follow_ups = set(get_args(fx.Change)), set(get_args(fx.FollowUp))
    if set(CHANGES) != changes or set(FOLLOW_UPS) != follow_ups:
        raise RuntimeError("the interpreter's tables do not match lifecycle's steps")


_check_tables()

__all__ = ["Interpreter", "Recorder"]
