"""The master's shell: it holds the lock, applies the lifecycles' effects, and commits.

Every decision about experiments, trials, runs and agents is made in `lifecycle/` over
plain data and comes back as effects; placement comes from the pure `Scheduler`. This
module applies effects to memory, to the open `WriteBatch` and to the agents' outboxes,
and every change reaches the store in a group commit before the master acts on it
(DESIGN.md: "The database is the truth"; _commit.py). Metric rows bypass the lock: the
store fences and deduplicates them by itself.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import logging
import random
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent import futures
from dataclasses import replace
from typing import Any

from assay.master import _agents
from assay.master._agents import (
    AgentHandle,
    ClusterView,
    KillRun,
    Load,
    Outbox,
    Registration,
)
from assay.master._auth import mask_secrets
from assay.master._checkpoints import reported_location
from assay.master._commit import GroupCommit
from assay.master._config import MasterConfig
from assay.master._fleet import Fleet
from assay.master._gc import collect_later
from assay.master._state import Ledger, ModelCache, load_live
from assay.master._submission import PreparedExperiment, check_submission, new_record
from assay.master.errors import InvalidArgumentError
from assay.master.lifecycle import (
    ExperimentState,
    ExperimentStatus,
    Restore,
    Run,
    TrialState,
    TrialStatus,
    finish_run,
    run_end,
)
from assay.master.lifecycle import _effects as fx
from assay.master.lifecycle import agent as agent_life
from assay.master.lifecycle import experiment as experiment_life
from assay.master.lifecycle import trial as trial_life
from assay.master.lifecycle.run import end_trial, preemption
from assay.master.scheduler import Request, Running, Scheduler, choose_victims
from assay.master.searcher import Create, Operation
from assay.master.store import (
    AllocationRecord,
    CheckpointRecord,
    ExperimentRecord,
    LogLine,
    MetricReport,
    Store,
    WriteBatch,
)

log = logging.getLogger("assay.master")
REAP_INTERVAL_S = 1.0
E, T = ExperimentStatus, TrialStatus


class Master:
    """Owns the scheduler, the agent connections and the runs; persists to `store`.

    Public methods change memory under `lock`, record the change in the open write
    batch, and wait for it to commit before they return; messages to agents are sent
    only after the commit that records them (see _commit.py).
    """

    def __init__(
        self,
        config: MasterConfig,
        store: Store,
        on_fatal: Callable[[BaseException], None] = lambda e: None,
    ) -> None:
        self.config = config
        self.store = store
        self.cluster_id = str(uuid.uuid4())
        self.lock = threading.RLock()
        self.commit = GroupCommit(store, self.lock, on_fatal)
        self.scheduler = Scheduler()
        self.fleet = Fleet(
            self.scheduler, lambda: self.commit.batch, self.commit.after, config.kill_grace_s
        )
        # Memory of the live experiments: the ledger's own dicts, read here, changed there.
        self.ledger = ledger = Ledger(lambda: self.commit.batch)
        self.experiments, self.trials, self.tokens = (
            ledger.experiments,
            ledger.trials,
            ledger.tokens,
        )
        self.runs, self.run_of_trial, self.queued = ledger.runs, ledger.run_of_trial, ledger.queued
        self.models = ModelCache(store)
        # Queued trials that cannot be placed even on an idle cluster, and why.
        self.unplaceable: dict[int, str] = {}
        self.trial_api = config.advertised_address or f"127.0.0.1:{config.grpc_port}"
        # Allocation tokens derive from a secret in the store, so a restarted master
        # recognises the trial processes that kept running. The HMAC's keyed state is
        # built once and copied per token (building it costs more than the digest).
        self._token_mac = hmac.new(store.secret("allocation-tokens"), digestmod=hashlib.sha256)
        self._checkpoint_root = str(config.checkpoint_root)
        # Checkpoint deletions, one at a time, off the master's lock (storage I/O).
        self._gc = futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="gc")
        self._storages: dict[str, Any] = {}
        self._recover()
        self._stop_reaper = threading.Event()
        self._reaper = threading.Thread(target=self._reap_loop, name="reaper", daemon=True)
        self._reaper.start()

    @property
    def batch(self) -> WriteBatch:
        return self.commit.batch

    @property
    def agents(self) -> dict[str, AgentHandle]:
        return self.fleet.agents

    def _reap_loop(self) -> None:
        while not self._stop_reaper.wait(REAP_INTERVAL_S):
            try:
                self.reap()
            except Exception:
                log.exception("checking for lost agents failed")

    def close(self) -> None:
        self._stop_reaper.set()
        self.commit.close()
        self._gc.shutdown(wait=False, cancel_futures=True)

    def token(self, allocation_id: str) -> str:
        mac = self._token_mac.copy()
        mac.update(allocation_id.encode())
        digest = mac.digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def commit_and_wait(self) -> None:
        """Called under the lock at the end of a change: release it, then wait."""
        ticket = self.commit.ticket()
        self.lock.release()
        try:
            self.commit.wait(ticket)
        finally:
            self.lock.acquire()

    # --- start-up -------------------------------------------------------------------------

    def _recover(self) -> None:
        """Reload the live experiments and requeue their unfinished trials (a restart)."""
        with self.lock:
            active = self.store.active_allocations()
            for experiment in load_live(self.store):
                self.ledger.add_experiment(experiment)
                if experiment.needs_start:
                    self._adopt_trials(experiment)
            for allocation in active:
                if not self._await_run(allocation):
                    self.batch.set_allocation(allocation.id, state="TERMINATED", ended_at=_now())
            for experiment in list(self.experiments.values()):
                self.do(trial_life.after_restart(experiment, self.run_of_trial, _now()))
            self.schedule()
        self.commit.flush()

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
        )
        if run is None:
            return False
        self.ledger.add_run(run)
        log.info("trial %d run %d: waiting for its agents to confirm it", trial.id, run.run_id)
        return True

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

    # --- effects --------------------------------------------------------------------------

    def do(self, effects: Iterable[fx.Effect]) -> None:
        """Apply a lifecycle decision's effects, in order."""
        for effect in effects:
            self._apply(effect)

    def _apply(self, effect: fx.Effect) -> None:
        if isinstance(effect, fx.SetTrial):
            self.ledger.set_trial(effect.trial_id, effect.fields)
        elif isinstance(effect, fx.SetExperiment):
            self.ledger.set_experiment(effect.experiment_id, effect.fields)
        elif isinstance(effect, fx.Enqueue):
            self.ledger.enqueue(effect.trial_id, self.fleet.slot_type(), to_back=effect.to_back)
        elif isinstance(effect, fx.Dequeue):
            self.queued.pop(effect.trial_id, None)
        elif isinstance(effect, fx.Kill):
            run = self.runs.get(effect.allocation_id)
            if run is not None:
                if effect.stopping is not None:
                    run.stopping = effect.stopping
                self.fleet.kill(run, graceful=effect.graceful)
        elif isinstance(effect, fx.Log):
            # The trial's log has the line; the master's own log repeats what went wrong.
            level = logging.getLevelName(effect.level)
            shown = level if level >= logging.WARNING else logging.DEBUG
            log.log(shown, "trial %d: %s", effect.trial_id, effect.message)
            self.batch.log(
                effect.trial_id, effect.run_id, effect.message, level=effect.level, now=_now()
            )
        elif isinstance(effect, fx.Tell):
            self._tell(effect)
        elif isinstance(effect, fx.Settle):
            self._settle(effect.experiment_id)
        elif isinstance(effect, fx.CollectGarbage):
            self._collect_garbage(effect)
        elif isinstance(effect, fx.Drop):
            self.ledger.drop_experiment(effect.experiment_id)
            self.models.drop(effect.experiment_id)
        elif isinstance(effect, fx.NewTrial):
            self._new_trial(effect)
        elif isinstance(effect, fx.StartRun):
            self._start_run(effect)
        elif isinstance(effect, fx.Adopt):
            self._adopt(effect)
        elif isinstance(effect, fx.PartLost):
            self._part_lost(effect.allocation_id, effect.agent_id, effect.why)
        elif isinstance(effect, fx.DropAgent):
            self.drop_agent(effect.agent_id, effect.why)
        elif isinstance(effect, fx.KillUnknown):
            self.fleet.send(effect.agent_id, KillRun(effect.allocation_id, graceful=False))

    def _collect_garbage(self, effect: fx.CollectGarbage) -> None:
        """Once the end is committed, delete the checkpoints the policy does not keep."""
        collect = collect_later(
            self._gc,
            self.store,
            effect.experiment_id,
            self.experiments[effect.experiment_id].config,
            ended_trial_ids=effect.ended_trial_ids,
            experiment_ended=effect.experiment_ended,
            default_root=self.config.checkpoint_root,
            storage_cache=self._storages,
        )
        self.commit.after(collect)

    def search(self, experiment: ExperimentState, ops: Sequence[Operation]) -> None:
        """Carry out the searcher's operations (and those they lead to), then record it."""
        pending = deque(ops)
        while pending:
            op = pending.popleft()
            for effect in experiment_life.apply_operation(
                experiment, op, self.run_of_trial, _now()
            ):
                if isinstance(effect, fx.Tell) and effect.event in (
                    "on_trial_created",
                    "on_trial_closed",
                ):
                    # The searcher's answers join the queue of operations.
                    handler = getattr(experiment.searcher, effect.event)
                    pending.extend(handler(effect.request_id, *effect.args))
                else:
                    self._apply(effect)
        progress = max(experiment.progress, experiment.searcher.progress())
        search = {"searcher_state": experiment.search_state(), "progress": progress}
        self.ledger.set_experiment(experiment.id, search)

    def _tell(self, tell: fx.Tell) -> None:
        """Tell the searcher what became of a trial, and carry out its answer."""
        experiment = self.experiments.get(tell.experiment_id)
        if experiment is None or experiment.state not in (E.ACTIVE, E.PAUSED):
            return  # the experiment is being canceled or killed: the search is over
        handler = getattr(experiment.searcher, tell.event)
        self.search(experiment, handler(tell.request_id, *tell.args))

    def _new_trial(self, new: fx.NewTrial) -> None:
        trial_id = self.store.reserve_id("trials")
        trial = TrialState(
            trial_id, new.experiment_id, new.request_id, new.hparams, new.seed, new.state
        )
        self.ledger.add_trial(trial, _now())
        if trial.state == T.QUEUED:
            self.ledger.enqueue(trial.id, self.fleet.slot_type())

    def _settle(self, experiment_id: int) -> None:
        experiment = self.experiments.get(experiment_id)
        if experiment is None:
            return
        effects, problem = experiment_life.settle(experiment, self.queued, _now())
        if problem:
            log.error("%s", problem)
        self.do(effects)

    # --- experiments ----------------------------------------------------------------------

    def create_experiment(
        self, config_yaml: str, model_definition: bytes, *, activate: bool, owner: str = "admin"
    ) -> ExperimentRecord:
        """Store a new experiment and its first trial; return it as stored."""
        prepared = self.prepare_experiment(config_yaml, model_definition, owner=owner)
        record, ticket, _ = self.add_experiment(prepared, activate=activate)
        self.commit.wait(ticket)
        return record

    def prepare_experiment(
        self, config_yaml: str, model_definition: bytes, *, owner: str = "admin"
    ) -> PreparedExperiment:
        """Check a submission (no lock taken); `InvalidArgumentError` says what to fix."""
        config, searcher = check_submission(config_yaml, model_definition)
        owner_id = self.store.user_id(owner)
        return PreparedExperiment(
            config, model_definition, owner, owner_id, searcher, config_text=config_yaml
        )

    def add_experiment(
        self, prepared: PreparedExperiment, *, activate: bool
    ) -> tuple[ExperimentRecord, int, str | None]:
        """Record a checked experiment and its first trials; return it, the commit ticket
        to wait for, and why its trials could not start even on this cluster idle (None
        when they can, once slots are free)."""
        config, model_definition = prepared.config, prepared.model_definition
        experiment_id = self.store.reserve_id("experiments")
        now = _now()
        state = E.ACTIVE if activate else E.PAUSED
        with self.lock:
            self.batch.add_experiment(
                experiment_id,
                name=config.name,
                owner_id=prepared.owner_id,
                config=dict(config.raw),
                model_definition=model_definition,
                state=state,
                description=config.description,
                labels=config.labels,
                priority=config.resources.priority,
                now=now,
                config_text=prepared.config_text,
            )
            experiment = ExperimentState(
                experiment_id, config, state, config.resources.priority, prepared.searcher
            )
            self.ledger.add_experiment(experiment)
            self.models.put(experiment_id, model_definition)
            self.search(experiment, experiment.searcher.initial_operations())
            self.schedule()
            ticket = self.commit.ticket()
            why = self.scheduler.why_never(config.resources.slots_per_trial, self.fleet.slot_type())
        return new_record(prepared, experiment_id, state, now, experiment.progress), ticket, why

    def experiment_action(self, experiment_id: int, action: str) -> None:
        with self.lock:
            experiment = self.experiments.get(experiment_id)
            if experiment is not None:
                runs = self.ledger.runs_by_trial()
                self.do(experiment_life.act(experiment, action, runs, _now()))
                self.schedule()
                self.commit_and_wait()
                return
        # A finished experiment (or none): only its stored row can change.
        self.commit.flush()
        record = self.store.get_experiment(experiment_id)
        experiment_life.check_action(experiment_id, record.state, action)
        self.store.update_experiment(experiment_id, archived=action == "archive")

    # --- scheduling -----------------------------------------------------------------------

    def schedule(self) -> None:
        if not self.queued:
            if self.unplaceable:
                self.unplaceable = {}
            return
        # Agents may have joined or left since a request was queued: one pass sets its type.
        slot_type = self.fleet.slot_type()
        pending = [
            r if r.slot_type == slot_type else replace(r, slot_type=slot_type)
            for r in self.queued.values()
        ]
        decision = self.scheduler.schedule(pending)
        self._note_unplaceable(decision.unschedulable)
        placed = {a.request_id for a in decision.assignments}
        if self.config.preemption and len(placed) < len(pending):
            unplaced = (r for r in pending if r.id not in placed)
            self._preempt_for(min(unplaced, key=lambda r: r.rank))
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
                self.do([*end_trial(trial, T.ERROR, _now()), fx.Settle(trial.experiment_id)])

    def _note_unplaceable(self, unschedulable: Sequence[tuple[str, str]]) -> None:
        """Remember why queued trials cannot be placed on the cluster as it is; a trial's
        log says so once (and again when the reason changes) when the cluster has agents."""
        now = {int(request_id): why for request_id, why in unschedulable}
        # With no agent at all (a master starting, its agents not back yet) the reason
        # is in the queue and describe, not written into every queued trial's log.
        for trial_id, why in now.items() if self.scheduler.agents else ():
            if self.unplaceable.get(trial_id) != why:
                trial = self.trials[trial_id]
                self.do([fx.Log(trial_id, trial.run_id, f"waiting: {why}", "WARNING")])
        self.unplaceable = now  # one assignment: readers without the lock see old or new

    def _preempt_for(self, request: Request) -> None:
        """Stop lower-priority runs (gracefully) so that `request` fits when they are gone."""
        if any(run.stopping == "preempt" for run in self.runs.values()):
            return  # one wave at a time: the slots it frees go to the queue first
        running = [
            Running(str(run.trial_id), experiment.priority, run.trial_id, run.placement)
            for run in self.runs.values()
            if run.stopping is None
            and not run.awaiting
            and (experiment := self.experiments.get(run.experiment_id)) is not None
        ]
        free = {
            a.id: len(self.scheduler.free_slots(a.id))
            for a in self.scheduler.agents
            if a.enabled and a.slot_type == request.slot_type
        }
        victims = choose_victims(request, running, free) or []
        runs = [self.runs[self.run_of_trial[int(v)]] for v in victims]
        self.do(preemption(request.id, request.priority, runs))

    def _start(self, trial: TrialState, placement: tuple[tuple[str, tuple[int, ...]], ...]) -> None:
        experiment = self.experiments[trial.experiment_id]
        # The suffix only tells runs of restarted masters apart; the token is the secret.
        allocation_id = f"{trial.id}.{trial.run_id + 1}.{random.getrandbits(32):08x}"
        host = experiment.config.checkpoint_storage.host_directory
        root = str(host) if host is not None else self._checkpoint_root
        effects = trial_life.start(
            trial,
            experiment,
            placement,
            allocation_id=allocation_id,
            token=self.token(allocation_id),
            addresses=self.fleet.addresses(a for a, _ in placement),
            port=20000 + random.randrange(20000),
            model=self.models.get(trial.experiment_id),
            trial_api=self.trial_api,
            checkpoint_root=root,
            now=_now(),
        )
        self.do(effects)
        log.info("trial %d run %d started on %s", trial.id, trial.run_id, _where(placement))

    def _start_run(self, start: fx.StartRun) -> None:
        run = start.run
        if start.supersede_after is not None:
            self.batch.supersede_metrics(run.trial_id, start.supersede_after)
        self.batch.add_allocation(
            run.allocation_id,
            trial_id=run.trial_id,
            run_id=run.run_id,
            placement=[{"agent_id": a, "slots": list(s)} for a, s in run.placement],
            now=_now(),
        )
        self.ledger.add_run(run)
        for agent_id, message in start.messages:
            self.fleet.send(agent_id, message)

    # --- agents -------------------------------------------------------------------------

    def register_agent(self, register: Registration, peer_host: str, outbox: Outbox) -> AgentHandle:
        """A (re)connecting agent: its running allocations are kept, the rest forgotten."""
        with self.lock:
            handle, lost = self.fleet.register(register, peer_host, outbox, _now())
            self.parts_lost(register.agent_id, lost)
            running = register.running_allocations
            self.do(agent_life.reconcile(handle.id, running, list(self.runs.values())))
            self.schedule()
            self.commit_and_wait()
            return handle

    def heartbeat(self, agent_id: str, beat: Load) -> None:
        with self.lock:
            self.fleet.heard_from(agent_id, beat)

    def agent_disconnected(self, agent_id: str, handle: AgentHandle | None = None) -> None:
        """The stream of `handle` ended; a newer connection of the same agent is kept.

        The agent's trials keep their slots for `agent_reconnect_wait_s`: an agent back in
        time keeps them running; after that they are requeued (see `reap`).
        """
        with self.lock:
            wait = self.config.agent_reconnect_wait_s
            if not self.fleet.disconnected(agent_id, handle, keep=wait > 0):
                return
            if wait <= 0:
                self.drop_agent(agent_id, "disconnected")
            else:
                log.warning("agent %s disconnected; its trials wait %g s for it", agent_id, wait)
            self.commit.ticket()

    def reap(self) -> None:
        """Give up on agents silent or gone for longer than the window, and their runs."""
        with self.lock:
            effects = agent_life.reap(
                self.fleet.clocks(),
                list(self.runs.values()),
                now=time.monotonic(),
                wall=time.time(),
                wait_s=self.config.agent_reconnect_wait_s,
                heartbeat_s=self.config.heartbeat_interval_s,
            )
            if effects:
                self.do(effects)
                self.schedule()
                self.commit.ticket()

    def set_agent_enabled(self, agent_id: str, enabled: bool) -> None:
        with self.lock:
            self.fleet.set_enabled(agent_id, enabled)
            self.schedule()  # disabled: what waits may now never fit, and says so
            self.commit_and_wait()

    def allocation_running(self, agent_id: str, allocation_id: str) -> None:
        """An agent started its part of an allocation (not waited for)."""
        with self.lock:
            self.fleet.heard_from(agent_id)
            if allocation_id in self.runs:
                self.batch.set_allocation(allocation_id, state="RUNNING")
                self.commit.ticket()

    def allocation_exited(
        self, agent_id: str, allocation_id: str, exit_codes: Sequence[int], message: str = ""
    ) -> None:
        """An agent's part of an allocation ended with these exit codes, one per rank (none:
        its processes could not start). Not waited for: the agent needs no answer."""
        with self.lock:
            self.fleet.heard_from(agent_id)
            run = self.runs.get(allocation_id)
            if run is None:
                return
            run.exit_codes[agent_id] = list(exit_codes)
            if message:
                run.messages.append(mask_secrets(f"{agent_id}: {message}"))
            failed = not exit_codes or any(c != 0 for c in exit_codes)
            if failed and run.stopping is None:
                # One part of the gang is gone: the other ranks cannot go on without it.
                self.fleet.kill(run, graceful=False)
            if run.over:
                self.finish_run(run)
                self.schedule()
            self.commit.ticket()

    def ship_logs(self, allocation_id: str, lines: Sequence[LogLine]) -> None:
        """Store an allocation's log lines (secrets masked); lines of no running
        allocation are dropped."""
        run = self.runs.get(allocation_id)
        if run is None:
            return
        masked = [replace(line, message=mask_secrets(line.message)) for line in lines]
        self.store.append_logs(run.trial_id, run.run_id, masked)

    def cluster_view(self) -> ClusterView:
        """A copy of the agents and the queue for the read-only RPCs."""
        with self.lock:
            queue = sorted(self.queued.values(), key=lambda r: r.rank)
            return _agents.cluster_view(
                self.cluster_id,
                self.fleet.slot_type(),
                self.agents.values(),
                self.scheduler.allocations,
                self.run_of_trial,
                [(r, self.trials[int(r.id)]) for r in queue],
                {e.id: e.config.name for e in self.experiments.values()},
                self.unplaceable,
            )

    def close_streams(self) -> None:
        """Close every agent's stream (the master is stopping)."""
        with self.lock:
            self.fleet.close_streams()

    # --- agents' effects -------------------------------------------------------------------

    def _adopt(self, adopt: fx.Adopt) -> None:
        run = self.runs[adopt.allocation_id]
        run.awaiting.discard(adopt.agent_id)
        slots = dict(run.placement)[adopt.agent_id]
        self.scheduler.adopt(str(run.trial_id), adopt.agent_id, slots)
        log.info("trial %d run %d re-adopted on %s", run.trial_id, run.run_id, adopt.agent_id)

    def _part_lost(self, allocation_id: str, agent_id: str, why: str = "") -> None:
        run = self.runs.get(allocation_id)
        if run is None:
            return
        if why:
            log.warning("trial %d run %d: agent %s %s", run.trial_id, run.run_id, agent_id, why)
        run.awaiting.discard(agent_id)
        run.lost = True
        run.exit_codes[agent_id] = []  # gone: nothing more will come from it
        self.fleet.kill(run, graceful=False)
        # The other agents' parts keep their slots until those agents report the
        # processes gone, so no new run is placed onto slots still in use.
        if run.over:
            self.finish_run(run)

    def drop_agent(self, agent_id: str, why: str) -> None:
        """Give up on an agent: its runs' parts are lost, its slots leave the scheduler."""
        log.warning("agent %s %s", agent_id, why)
        self.parts_lost(agent_id, self.fleet.drop(agent_id))
        self.schedule()

    def parts_lost(self, agent_id: str, request_ids: Iterable[str]) -> None:
        for request_id in request_ids:
            allocation_id = self.run_of_trial.get(int(request_id))
            if allocation_id is not None:
                self._part_lost(allocation_id, agent_id)

    # --- the end of a run -----------------------------------------------------------------

    def finish_run(self, run: Run) -> None:
        if not self.ledger.end_run(run):
            return
        self.scheduler.release(str(run.trial_id))
        self.batch.set_allocation(run.allocation_id, state="TERMINATED", ended_at=_now())
        trial = self.trials[run.trial_id]
        experiment = self.experiments[run.experiment_id]
        config = experiment.config
        end = run_end(
            run,
            trial,
            experiment.state,
            is_script=config.is_script,
            max_restarts=config.max_restarts,
        )
        outcome, effects = finish_run(run, trial, end, _now())
        log.debug("trial %d run %d ended: %s", trial.id, run.run_id, outcome.value)
        self.do(effects)

    # --- the harness's calls --------------------------------------------------------------

    def run_for_token(self, token: str, trial_id: int, run_id: int) -> Run:
        with self.lock:
            return self.ledger.run_for_token(token, trial_id)

    def next_operation(self, run: Run, total_batches: int) -> int | None:
        """The batch count to train to next, or None: checkpointed, the process may exit.

        Asked at start and after each completed target. A trial whose target is reached
        but not yet reported (a restore right after its validation) gets the same target
        back, validates and reports it.
        """
        with self.lock:
            answer = trial_life.next_target(run, self.trials.get(run.trial_id))
            run.released = answer is None
            ticket = self.commit.ticket()
        self.commit.wait(ticket)  # answer only what is durable
        return answer

    def complete_operation(
        self, run: Run, total_batches: int, metric: float, *, stop_requested: bool = False
    ) -> None:
        """The trial validated at its target: tell the searcher (a retry is a no-op).

        `stop_requested`: the trial's code asked to end here (Determined's
        `set_stop_requested`), at or before its target: it ends as completed once its
        process exits, and the searcher counts it as a trial that ended early.
        """
        with self.lock:
            trial = self.trials.get(run.trial_id)
            experiment = self.experiments.get(run.experiment_id)
            if trial is not None and experiment is not None:
                effects = trial_life.validated(
                    trial, experiment, total_batches, metric, stop_requested=stop_requested
                )
                self.do(effects)
                if effects:
                    self.schedule()
            # Once what the first report changed is durable, a retry has nothing to do.
            self.commit_and_wait()

    def best_validation(self, run: Run) -> float | None:
        """The best searcher-metric value any trial of `run`'s experiment has reported."""
        with self.lock:
            experiment = self.experiments.get(run.experiment_id)
            return trial_life.experiment_best(experiment) if experiment else None

    def report_progress(self, run: Run, progress: float) -> None:
        """A script's own estimate of how far it is (0..1): see `progress_reported`."""
        if not 0.0 <= progress <= 1.0:
            raise InvalidArgumentError(f"progress must be between 0 and 1, got {progress!r}")
        with self.lock:
            experiment = self.experiments.get(run.experiment_id)
            if experiment is None or experiment.config.searcher.name != "single":
                return
            self.do(trial_life.progress_reported(experiment, progress))
            self.commit_and_wait()

    def report_metrics(self, run: Run, group: str, reports: Sequence[MetricReport]) -> int:
        """Store a run's metrics and the trial's progress in one transaction (the store
        fences stale runs and makes retries no-ops), then update memory with it."""
        experiment = self.experiments.get(run.experiment_id)  # one read: no lock needed
        searcher = experiment.config.searcher if experiment is not None else None
        done = self.store.report_metrics_and_progress(
            run.trial_id,
            run.run_id,
            group,
            reports,
            searcher_metric=searcher.metric if searcher is not None else None,
            smaller_is_better=searcher.smaller_is_better if searcher is not None else True,
        )
        with self.lock:
            trial = self.trials.get(run.trial_id)
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
        with self.lock:
            experiment = self.experiments.get(run.experiment_id)
            config = experiment.config if experiment is not None else None
        location = reported_location(
            self.store, run.experiment_id, config, checkpoint, self.config.checkpoint_root
        )
        self.store.add_checkpoint(
            replace(checkpoint, trial_id=run.trial_id, run_id=run.run_id, location=location)
        )
        with self.lock:
            trial = self.trials.get(run.trial_id)
            if trial is not None:
                trial.checkpointed = True
            # As the store does: the newest checkpoint by batches is the one to restore.
            if trial is not None and checkpoint.total_batches >= trial.total_batches:
                trial.checkpoint = Restore(checkpoint.uuid, checkpoint.total_batches, location)
                trial.total_batches = checkpoint.total_batches


def _where(placement: tuple[tuple[str, tuple[int, ...]], ...]) -> str:
    """`agent-1 (slots 0, 1), agent-2 (slot 0)`: a placement as a person reads it."""
    return ", ".join(
        f"{agent} (slot{'s' if len(slots) != 1 else ''} {', '.join(map(str, slots))})"
        for agent, slots in placement
    )


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


__all__ = ["Master", "Run"]
