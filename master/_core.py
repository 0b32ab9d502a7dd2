"""The master's brain: experiments -> trials -> gang requests -> allocations on agents.

All state transitions happen in memory under one lock and reach the store in group
commits before the master acts on them (DESIGN.md: "The database is the truth";
_commit.py). Placement decisions come from the pure `Scheduler`; this module turns them
into messages for agents. Metric rows bypass the lock: the store fences and
deduplicates them by itself.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import json
import logging
import math
import random
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence, Set
from concurrent import futures
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

from assay.common.archive import MAX_MODEL_DEF_BYTES, ModelDefinitionError, check_model_archive
from assay.common.storage import StorageError, checkpoint_location, checkpoint_uuid
from assay.config import ExperimentConfig, parse_config, searcher_in_batches
from assay.errors import INVALID_HP_EXIT_CODE, PREEMPTED_EXIT_CODE, InvalidConfigError
from assay.master._agents import (
    AgentHandle,
    AgentMessage,
    AgentView,
    ClusterView,
    KillRun,
    Load,
    Outbox,
    QueuedView,
    Registration,
    SlotView,
    StartRun,
)
from assay.master._auth import mask_secrets
from assay.master._commit import GroupCommit
from assay.master._config import MasterConfig
from assay.master._gc import collect
from assay.master._state import (
    TERMINAL_EXPERIMENT,
    TERMINAL_TRIAL,
    ExperimentState,
    ModelCache,
    Restore,
    TrialState,
    load_live,
    new_searcher,
)
from assay.master.errors import (
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
)
from assay.master.scheduler import (
    Agent,
    Request,
    Running,
    Scheduler,
    SlotType,
    choose_victims,
)
from assay.master.searcher import Close, Create, Operation, Searcher, Shutdown, ValidateAfter
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
# The stop a restarted master finishes for a run of an experiment in each state.
_STOPPING_OF = {"PAUSED": "pause", "STOPPING_CANCELED": "cancel", "STOPPING_KILLED": "kill"}

_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass(frozen=True)
class PreparedExperiment:
    """A submission that passed every check, ready to be recorded."""

    config: ExperimentConfig
    model_definition: bytes
    owner: str
    owner_id: int
    searcher: Searcher


@dataclass
class Run:
    """One allocation: a trial's run on its slots."""

    allocation_id: str
    trial_id: int
    run_id: int
    experiment_id: int
    placement: tuple[tuple[str, tuple[int, ...]], ...]
    token: str
    exit_codes: dict[str, list[int]] = field(default_factory=dict)
    messages: list[str] = field(default_factory=list)
    stopping: str | None = None  # pause | cancel | kill
    lost: bool = False  # an agent vanished: not the user's fault
    # Found running by a restarted master: the agents whose part has not been confirmed
    # yet, and until when (monotonic) they may confirm it.
    awaiting: set[str] = field(default_factory=set)
    deadline: float = 0.0
    released: bool = False  # the master answered "stop": its processes may exit 0


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
        self.agents: dict[str, AgentHandle] = {}
        self.experiments: dict[int, ExperimentState] = {}  # the live ones
        self.trials: dict[int, TrialState] = {}  # of live experiments
        self.runs: dict[str, Run] = {}  # by allocation id
        self.run_of_trial: dict[int, str] = {}
        self.tokens: dict[str, str] = {}  # token -> allocation id
        self.queued: dict[int, Request] = {}  # trial id -> request
        self.models = ModelCache(store)
        self._connected_types: dict[str, int] = {}  # slot type -> connected agents
        self._order = 0
        self.trial_api = config.advertised_address or f"127.0.0.1:{config.grpc_port}"
        # Allocation tokens derive from a secret in the store, so a restarted master
        # recognises the trial processes that kept running.
        self._token_key = store.secret("allocation-tokens")
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

    def close(self) -> None:
        self._stop_reaper.set()
        self.commit.close()
        self._gc.shutdown(wait=False, cancel_futures=True)

    def _token(self, allocation_id: str) -> str:
        digest = hmac.new(self._token_key, allocation_id.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def _commit_and_wait(self) -> None:
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
                self._add_experiment(experiment)
                if experiment.needs_start:
                    self._adopt_trials(experiment)
            for allocation in active:
                if not self._await_run(allocation):
                    self.batch.set_allocation(allocation.id, state="TERMINATED", ended_at=_now())
            for experiment in list(self.experiments.values()):
                stopping = experiment.state.startswith("STOPPING_")
                for trial in experiment.trials.values():
                    if trial.id in self.run_of_trial:
                        continue  # still running, we hope: its agent will say
                    if trial.state not in ("RUNNING", "QUEUED", "STOPPING", "PAUSED"):
                        continue
                    if stopping:
                        # A cancel or kill was under way: finish it rather than resume.
                        self._set_trial(trial, state="CANCELED", end_time=_now())
                    elif trial.state == "PAUSED" and (
                        trial.target is None or experiment.state != "ACTIVE"
                    ):
                        continue
                    elif experiment.state == "ACTIVE":
                        self._set_trial(trial, state="QUEUED")
                        self._enqueue(trial)
                    else:
                        self._set_trial(trial, state="PAUSED")
                self._settle_experiment(experiment)
            self._schedule()
        self.commit.flush()

    def _await_run(self, allocation: AllocationRecord) -> bool:
        """Keep a run found in the store for its agents to confirm; False if it is over."""
        trial = self.trials.get(allocation.trial_id)
        if trial is None or trial.run_id != allocation.run_id:
            return False
        if trial.state not in ("RUNNING", "STOPPING") or self.config.agent_reconnect_wait_s <= 0:
            return False
        experiment = self.experiments[trial.experiment_id]
        placement = tuple(
            (str(part["agent_id"]), tuple(int(s) for s in part["slots"]))
            for part in allocation.placement
        )
        run = Run(
            allocation.id,
            trial.id,
            trial.run_id,
            trial.experiment_id,
            placement,
            self._token(allocation.id),
            stopping=_STOPPING_OF.get(experiment.state),
            awaiting={agent_id for agent_id, _ in placement},
            deadline=time.monotonic() + self.config.agent_reconnect_wait_s,
        )
        self.runs[run.allocation_id] = run
        self.run_of_trial[trial.id] = run.allocation_id
        self.tokens[run.token] = run.allocation_id
        log.info("trial %d run %d: waiting for its agents to confirm it", trial.id, run.run_id)
        return True

    def _add_experiment(self, experiment: ExperimentState) -> None:
        self.experiments[experiment.id] = experiment
        self.trials.update(experiment.trials)

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
        self._apply(experiment, ops)

    # --- memory and store together --------------------------------------------------------

    def _set_trial(self, trial: TrialState, **fields: Any) -> None:
        for key, value in fields.items():
            setattr(trial, key, value)
        self.batch.set_trial(trial.id, **fields)
        if fields.get("state") in TERMINAL_TRIAL and trial.checkpointed:
            # A trial that never checkpointed leaves nothing to collect: no store reads.
            self._collect_garbage(trial.experiment_id, ended_trial_ids=(trial.id,))

    def _collect_garbage(
        self,
        experiment_id: int,
        *,
        ended_trial_ids: Sequence[int] = (),
        experiment_ended: bool = False,
    ) -> None:
        """Once the end is committed, delete the checkpoints the policy does not keep."""
        config = self.experiments[experiment_id].config

        def run() -> None:
            try:
                result = collect(
                    self.store,
                    experiment_id,
                    config,
                    ended_trial_ids=ended_trial_ids,
                    experiment_ended=experiment_ended,
                    default_root=self.config.checkpoint_root,
                    storage_cache=self._storages,
                )
            except Exception:
                log.exception("checkpoint collection of experiment %d failed", experiment_id)
                return
            if result.deleted or result.failed:
                log.info("experiment %d: %s", experiment_id, result)

        def submit() -> None:
            self._gc.submit(run)

        self.commit.after(submit)

    def _set_experiment(self, experiment: ExperimentState, **fields: Any) -> None:
        for key in ("state", "progress"):
            if key in fields:
                setattr(experiment, key, fields[key])
        self.batch.set_experiment(experiment.id, **fields)

    def _live_experiment(self, experiment_id: int) -> ExperimentState | None:
        return self.experiments.get(experiment_id)

    # --- experiments ----------------------------------------------------------------------

    def create_experiment(
        self, config_yaml: str, model_definition: bytes, *, activate: bool, owner: str = "admin"
    ) -> ExperimentRecord:
        """Store a new experiment and its first trial; return it as stored."""
        prepared = self.prepare_experiment(config_yaml, model_definition, owner=owner)
        record, ticket = self.add_experiment(prepared, activate=activate)
        self.commit.wait(ticket)
        return record

    def prepare_experiment(
        self, config_yaml: str, model_definition: bytes, *, owner: str = "admin"
    ) -> PreparedExperiment:
        """Check a submission (no lock taken); `InvalidArgumentError` says what to fix."""
        _check_config_text(config_yaml)
        try:
            raw = yaml.load(config_yaml, Loader=_YAML_LOADER)  # a safe loader (C if built)
        except yaml.YAMLError as e:
            raise InvalidArgumentError(f"the config is not valid YAML: {e}") from None
        try:
            config = parse_config(raw)
        except InvalidConfigError as e:
            raise InvalidArgumentError(str(e)) from None
        _check_cluster_config(config)
        try:
            searcher = new_searcher(config)
        except ValueError as e:
            raise InvalidArgumentError(str(e)) from None
        _check_model_definition(model_definition)
        return PreparedExperiment(
            config, model_definition, owner, self.store.user_id(owner), searcher
        )

    def add_experiment(
        self, prepared: PreparedExperiment, *, activate: bool
    ) -> tuple[ExperimentRecord, int]:
        """Record a checked experiment and its first trials; return it and the commit
        ticket to wait for."""
        config, model_definition = prepared.config, prepared.model_definition
        experiment_id = self.store.reserve_id("experiments")
        now = _now()
        state = "ACTIVE" if activate else "PAUSED"
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
            )
            experiment = ExperimentState(
                experiment_id, config, state, config.resources.priority, prepared.searcher
            )
            self._add_experiment(experiment)
            self.models.put(experiment_id, model_definition)
            self._apply(experiment, experiment.searcher.initial_operations())
            self._schedule()
            ticket = self.commit.ticket()
        record = ExperimentRecord(
            id=experiment_id,
            name=config.name,
            description=config.description,
            owner=prepared.owner,
            state=state,
            labels=tuple(sorted(set(config.labels))),
            priority=config.resources.priority,
            progress=0.0,
            archived=False,
            config=dict(config.raw),
            searcher_state=None,
            created_at=now,
            start_time=now,
            end_time=None,
        )
        return replace(record, progress=experiment.progress), ticket

    # --- the search -----------------------------------------------------------------------

    def _apply(self, experiment: ExperimentState, ops: Sequence[Operation]) -> None:
        """Carry out the searcher's operations (and those they lead to), then record it."""
        pending = deque(ops)
        searcher = experiment.searcher
        while pending:
            op = pending.popleft()
            if isinstance(op, Create):
                if op.request_id not in experiment.by_request:  # (adopted ones exist)
                    self._new_trial(experiment, op)
                pending.extend(searcher.on_trial_created(op.request_id))
            elif isinstance(op, ValidateAfter):
                trial = experiment.by_request[op.request_id]
                trial.target = op.length
                waiting = trial.state == "PAUSED" and trial.id not in self.run_of_trial
                if waiting and experiment.state == "ACTIVE":
                    # A promotion: the trial resumes from its checkpoint.
                    self._set_trial(trial, state="QUEUED")
                    self._enqueue(trial)
            elif isinstance(op, Close):
                trial = experiment.by_request[op.request_id]
                trial.closed, trial.target = True, None
                if trial.id not in self.run_of_trial and trial.state not in TERMINAL_TRIAL:
                    # Not running: nothing to stop. A running one stops at its next question.
                    self.queued.pop(trial.id, None)
                    self._set_trial(trial, state="COMPLETED", end_time=_now())
                    pending.extend(searcher.on_trial_closed(op.request_id))
            elif isinstance(op, Shutdown):
                experiment.shutdown = True
        self._save_search(experiment)

    def _save_search(self, experiment: ExperimentState) -> None:
        progress = max(experiment.progress, experiment.searcher.progress())
        self._set_experiment(
            experiment, searcher_state=experiment.search_state(), progress=progress
        )

    def _new_trial(self, experiment: ExperimentState, op: Create) -> TrialState:
        trial = TrialState(
            id=self.store.reserve_id("trials"),
            experiment_id=experiment.id,
            request_id=op.request_id,
            hparams=op.hparams,
            seed=op.seed,
            state="QUEUED" if experiment.state == "ACTIVE" else "PAUSED",
        )
        self.batch.add_trial(
            trial.id,
            experiment_id=experiment.id,
            request_id=trial.request_id,
            hparams=trial.hparams,
            seed=trial.seed,
            state=trial.state,
            now=_now(),
        )
        experiment.add_trial(trial)
        self.trials[trial.id] = trial
        if trial.state == "QUEUED":
            self._enqueue(trial)
        return trial

    def _searcher_event(
        self, experiment: ExperimentState, trial: TrialState, event: str, *args: Any
    ) -> None:
        """Tell the searcher what became of a trial, and carry out its answer."""
        if experiment.state not in ("ACTIVE", "PAUSED"):
            return  # the experiment is being canceled or killed: the search is over
        handler = getattr(experiment.searcher, event)
        self._apply(experiment, handler(trial.request_id, *args))

    def experiment_action(self, experiment_id: int, action: str) -> None:
        allowed = _ALLOWED_ACTIONS[action]
        with self.lock:
            experiment = self._live_experiment(experiment_id)
            if experiment is not None:
                self._check_action(experiment_id, experiment.state, action, allowed)
                getattr(self, f"_{action}")(experiment)
                self._commit_and_wait()
                return
        # A finished experiment (or none): only its stored row can change.
        self.commit.flush()
        record = self.store.get_experiment(experiment_id)
        self._check_action(experiment_id, record.state, action, allowed)
        self.store.update_experiment(experiment_id, archived=action == "archive")

    @staticmethod
    def _check_action(experiment_id: int, state: str, action: str, allowed: Set[str]) -> None:
        if state not in allowed:
            raise ConflictError(
                f"cannot {action} experiment {experiment_id}: it is {state}; {action} "
                f"applies to {', '.join(sorted(allowed))} experiments"
            )

    def _pause(self, experiment: ExperimentState) -> None:
        self._set_experiment(experiment, state="PAUSED")
        self._stop_trials(experiment, "pause", queued_state="PAUSED")

    def _activate(self, experiment: ExperimentState) -> None:
        self._set_experiment(experiment, state="ACTIVE")
        for trial in experiment.trials.values():
            # Trials waiting for a promotion stay paused until the searcher asks for more.
            if trial.state == "PAUSED" and trial.target is not None:
                self._set_trial(trial, state="QUEUED")
                self._enqueue(trial)
        self._settle_experiment(experiment)  # its last trial may have ended while paused
        if experiment.id in self.experiments:
            self._schedule()

    def _cancel(self, experiment: ExperimentState) -> None:
        self._set_experiment(experiment, state="STOPPING_CANCELED")
        self._stop_trials(experiment, "cancel", queued_state="CANCELED")
        self._settle_experiment(experiment)

    def _kill(self, experiment: ExperimentState) -> None:
        self._set_experiment(experiment, state="STOPPING_KILLED")
        self._stop_trials(experiment, "kill", queued_state="CANCELED")
        self._settle_experiment(experiment)

    def _stop_trials(self, experiment: ExperimentState, how: str, *, queued_state: str) -> None:
        for trial in experiment.trials.values():
            if trial.state in TERMINAL_TRIAL:
                continue
            allocation_id = self.run_of_trial.get(trial.id)
            if allocation_id is not None:
                run = self.runs[allocation_id]
                run.stopping = how
                self._set_trial(trial, state="STOPPING")
                self._send_kill(run, graceful=how != "kill")
            else:
                self.queued.pop(trial.id, None)
                end = {"end_time": _now()} if queued_state in TERMINAL_TRIAL else {}
                self._set_trial(trial, state=queued_state, **end)

    # --- scheduling -----------------------------------------------------------------------

    def _enqueue(self, trial: TrialState) -> None:
        config = self.experiments[trial.experiment_id].config
        if not trial.order:  # requeued trials keep their place: first come, first served
            self._order += 1
            trial.order = self._order
        self.queued[trial.id] = Request(
            id=str(trial.id),
            slots=config.resources.slots_per_trial,
            slot_type=self.cluster_slot_type(),
            priority=config.resources.priority,
            order=trial.order,
        )

    def cluster_slot_type(self) -> SlotType:
        """cuda when every connected agent offers GPUs, else cpu."""
        cuda = self._connected_types.get("cuda", 0)
        return "cuda" if cuda and cuda == sum(self._connected_types.values()) else "cpu"

    def _count_agent(self, slot_type: str, delta: int) -> None:
        self._connected_types[slot_type] = self._connected_types.get(slot_type, 0) + delta

    def _schedule(self) -> None:
        if not self.queued:
            return
        # Agents may have joined or left since a request was queued: one pass sets its type.
        slot_type = self.cluster_slot_type()
        pending = [
            r if r.slot_type == slot_type else replace(r, slot_type=slot_type)
            for r in self.queued.values()
        ]
        decision = self.scheduler.schedule(pending)
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
                allocation_id = self.run_of_trial.pop(trial.id, None)
                run = self.runs.pop(allocation_id, None) if allocation_id else None
                if run is not None:
                    self.tokens.pop(run.token, None)
                    self._send_kill(run, graceful=False)
                self._set_trial(trial, state="ERROR", end_time=_now())
                self._settle_experiment(self.experiments[trial.experiment_id])

    def _preempt_for(self, request: Request) -> None:
        """Stop lower-priority runs (gracefully) so that `request` fits when they are gone."""
        if any(run.stopping == "preempt" for run in self.runs.values()):
            return  # one wave at a time: the slots it frees go to the queue first
        running: list[Running] = []
        for run in self.runs.values():
            experiment = self.experiments.get(run.experiment_id)
            if run.stopping is None and experiment is not None and not run.awaiting:
                running.append(
                    Running(str(run.trial_id), experiment.priority, run.trial_id, run.placement)
                )
        free = {
            a.id: len(self.scheduler.free_slots(a.id))
            for a in self.scheduler.agents
            if a.enabled and a.slot_type == request.slot_type
        }
        victims = choose_victims(request, running, free)
        for victim in victims or []:
            run = self.runs[self.run_of_trial[int(victim)]]
            trial = self.trials[run.trial_id]
            run.stopping = "preempt"
            self._set_trial(trial, state="STOPPING")
            message = (
                f"assay: run {run.run_id} preempted for trial {request.id} (priority "
                f"{request.priority}); it checkpoints and requeues"
            )
            log.info("trial %d: %s", trial.id, message)
            self.batch.log(trial.id, run.run_id, message, level="WARNING", now=_now())
            self._send_kill(run, graceful=True)

    def _start(self, trial: TrialState, placement: tuple[tuple[str, tuple[int, ...]], ...]) -> None:
        experiment = self.experiments[trial.experiment_id]
        config = experiment.config
        restore = trial.checkpoint
        now = _now()
        fields: dict[str, Any] = {"run_id": trial.run_id + 1, "state": "RUNNING"}
        if trial.start_time is None:
            fields["start_time"] = now
        if restore is not None:
            # Metrics the failed run reported past its checkpoint leave the curves.
            fields["total_batches"] = restore.total_batches
            self.batch.supersede_metrics(trial.id, restore.total_batches)
        self._set_trial(trial, **fields)
        run_id = trial.run_id
        allocation_id = f"{trial.id}.{run_id}.{uuid.uuid4().hex[:8]}"
        token = self._token(allocation_id)
        self.batch.add_allocation(
            allocation_id,
            trial_id=trial.id,
            run_id=run_id,
            placement=[{"agent_id": a, "slots": list(s)} for a, s in placement],
            now=now,
        )
        run = Run(allocation_id, trial.id, run_id, trial.experiment_id, placement, token)
        self.runs[allocation_id] = run
        self.run_of_trial[trial.id] = allocation_id
        self.tokens[token] = allocation_id
        model = self.models.get(trial.experiment_id)
        world = sum(len(slots) for _, slots in placement)
        chief = self.agents[placement[0][0]]
        port = 20000 + random.randrange(20000)
        config_json = json.dumps(dict(config.raw))
        hparams_json = json.dumps(dict(trial.hparams))
        rank = 0
        for agent_id, slots in placement:
            ranks = list(range(rank, rank + len(slots)))
            rank += len(slots)
            message = StartRun(
                allocation_id=allocation_id,
                trial_id=trial.id,
                run_id=run_id,
                experiment_id=trial.experiment_id,
                slots=slots,
                ranks=tuple(ranks),
                world_size=world,
                master_addr=chief.address or "127.0.0.1",
                master_port=port,
                model_definition=model,
                config_json=config_json,
                checkpoint_uuid=restore.uuid if restore else "",
                checkpoint_location=restore.location if restore else "",
                trial_api=self.trial_api,
                token=token,
                hparams_json=hparams_json,
                trial_seed=trial.seed,
                checkpoint_root=self._checkpoint_root(config),
            )
            self._send(self.agents[agent_id], message)
        log.info("trial %d run %d started on %s", trial.id, run_id, placement)

    def _send(self, handle: AgentHandle, message: AgentMessage) -> None:
        """Queue `message` for the agent once the changes recorded so far are committed."""
        outbox = handle.outbox
        self.commit.after(lambda: outbox.put(message))

    def _checkpoint_root(self, config: ExperimentConfig) -> str:
        return str(config.checkpoint_storage.host_directory or self.config.checkpoint_root)

    def _send_kill(self, run: Run, *, graceful: bool) -> None:
        """Kill the run's processes on every agent that has not reported them gone."""
        kill = KillRun(
            allocation_id=run.allocation_id,
            graceful=graceful,
            grace_seconds=int(self.config.kill_grace_s),
        )
        for agent_id, _ in run.placement:
            if agent_id in run.exit_codes:
                continue
            handle = self.agents.get(agent_id)
            if handle is not None and handle.connected:
                self._send(handle, kill)

    # --- agents ---------------------------------------------------------------------------

    def register_agent(self, register: Registration, peer_host: str, outbox: Outbox) -> AgentHandle:
        """A (re)connecting agent: its running allocations are kept, the rest forgotten."""
        slot_type = register.slot_type
        slots = len(register.devices)
        if slots < 1:
            raise InvalidArgumentError(f"agent {register.agent_id!r} offers no slots")
        with self.lock:
            old = self.agents.get(register.agent_id)
            if old is not None and old.connected:
                raise ConflictError(f"an agent named {register.agent_id!r} is already connected")
            handle = AgentHandle(
                id=register.agent_id,
                slot_type=slot_type,
                slots=slots,
                address=register.address or peer_host,
                devices=register.devices,
                memory_bytes=register.memory_bytes,
                outbox=outbox,
            )
            if old is not None and (old.slots, old.slot_type) == (slots, slot_type):
                # Back within the window: it keeps its slots and its running trials.
                handle.enabled = old.enabled
                self.scheduler.set_agent_enabled(handle.id, handle.enabled)
            else:
                if old is not None:
                    self._drop_agent(old.id)
                self.scheduler.add_agent(Agent(handle.id, slots, slot_type))
            self.agents[handle.id] = handle
            self._count_agent(slot_type, +1)
            self.batch.agent_registered(
                handle.id,
                slot_type=slot_type,
                slots=slots,
                devices=[{"name": d.name, "uuid": d.uuid} for d in register.devices],
                address=handle.address,
                now=_now(),
            )
            self._reconcile(handle, set(register.running_allocations))
            log.info("agent %s connected with %d %s slots", handle.id, slots, slot_type)
            self._schedule()
            self._commit_and_wait()
            return handle

    def _reconcile(self, handle: AgentHandle, running: set[str]) -> None:
        """Match what the agent runs with what the master expects it to run."""
        for run in list(self.runs.values()):
            part = next((slots for a, slots in run.placement if a == handle.id), None)
            if part is None or handle.id in run.exit_codes:
                continue
            if run.allocation_id in running:
                if handle.id in run.awaiting:
                    run.awaiting.discard(handle.id)
                    self.scheduler.adopt(str(run.trial_id), handle.id, part)
                    log.info(
                        "trial %d run %d re-adopted on %s", run.trial_id, run.run_id, handle.id
                    )
                if run.stopping is not None:
                    self._send_kill(run, graceful=run.stopping != "kill")
            else:
                # The agent lost it (or it exited while nobody listened): not the user's doing.
                run.awaiting.discard(handle.id)
                self._part_lost(run, handle.id)
        for allocation_id in running - self.runs.keys():
            self._send(handle, KillRun(allocation_id=allocation_id, graceful=False))

    def _part_lost(self, run: Run, agent_id: str) -> None:
        run.lost = True
        run.exit_codes[agent_id] = []  # gone: nothing more will come from it
        self._send_kill(run, graceful=False)
        # The other agents' parts keep their slots until those agents report the
        # processes gone, so no new run is placed onto slots still in use.
        if all(a in run.exit_codes for a, _ in run.placement):
            self._finish_run(run)

    def heartbeat(self, agent_id: str, beat: Load) -> None:
        with self.lock:
            handle = self.agents.get(agent_id)
            if handle is None:
                return
            handle.last_heartbeat = time.time()
            handle.cpu_utilization = beat.cpu_utilization
            handle.memory_used_fraction = beat.memory_used_fraction
            if beat.devices:
                handle.devices = beat.devices

    def agent_disconnected(self, agent_id: str, handle: AgentHandle | None = None) -> None:
        """The stream of `handle` ended; a newer connection of the same agent is kept.

        The agent's trials keep their slots for `agent_reconnect_wait_s`: an agent back in
        time keeps them running; after that they are requeued (see `_reap`).
        """
        with self.lock:
            current = self.agents.get(agent_id)
            if current is None or (handle is not None and current is not handle):
                return
            handle = current
            if not handle.connected:
                return
            handle.connected = False
            handle.disconnected_at = time.monotonic()
            handle.outbox.put(None)
            self._count_agent(handle.slot_type, -1)
            wait = self.config.agent_reconnect_wait_s
            if wait <= 0:
                log.warning("agent %s disconnected", agent_id)
                self._drop_agent(agent_id)
            else:
                log.warning("agent %s disconnected; its trials wait %g s for it", agent_id, wait)
                self.scheduler.set_agent_enabled(agent_id, False)  # no new work meanwhile
                self.batch.agent_state(agent_id, "DISCONNECTED")
            self.commit.ticket()

    def _drop_agent(self, agent_id: str) -> None:
        # The gang's other parts keep their slots until their processes are gone.
        affected = self.scheduler.remove_agent(agent_id, keep_other_parts=True)
        dropped = self.agents.pop(agent_id, None)
        if dropped is not None and dropped.connected:
            self._count_agent(dropped.slot_type, -1)
        self.batch.agent_state(agent_id, "DISCONNECTED")
        for request_id in affected:
            allocation_id = self.run_of_trial.get(int(request_id))
            if allocation_id is not None:
                self._part_lost(self.runs[allocation_id], agent_id)
        self._schedule()

    def cluster_view(self) -> ClusterView:
        """A copy of the agents and the queue for the read-only RPCs."""
        with self.lock:
            owners: dict[tuple[str, int], int] = {}
            for request_id, placement in self.scheduler.allocations.items():
                for agent_id, slots in placement:
                    for slot in slots:
                        owners[agent_id, slot] = int(request_id)
            agents = tuple(
                AgentView(
                    id=a.id,
                    address=a.address,
                    slot_type=a.slot_type,
                    devices=tuple(a.devices),
                    slots=tuple(
                        SlotView(
                            index=i,
                            enabled=a.enabled,
                            allocation_id=self.run_of_trial.get(owners.get((a.id, i), 0), ""),
                            trial_id=owners.get((a.id, i), 0),
                        )
                        for i in range(a.slots)
                    ),
                    connected=a.connected,
                    enabled=a.enabled,
                    last_heartbeat=a.last_heartbeat,
                    memory_bytes=a.memory_bytes,
                    memory_used_fraction=a.memory_used_fraction,
                    cpu_utilization=a.cpu_utilization,
                )
                for a in sorted(self.agents.values(), key=lambda a: a.id)
            )
            queue = []
            for request in sorted(self.queued.values(), key=lambda r: r.rank):
                trial = self.trials[int(request.id)]
                experiment = self.experiments[trial.experiment_id]
                queue.append(
                    QueuedView(
                        trial.id,
                        experiment.id,
                        experiment.config.name,
                        request.priority,
                        request.slots,
                    )
                )
            return ClusterView(self.cluster_id, self.cluster_slot_type(), agents, tuple(queue))

    def close_streams(self) -> None:
        """Close every agent's stream (the master is stopping)."""
        with self.lock:
            for handle in self.agents.values():
                handle.outbox.put(None)

    # --- the window for lost agents -------------------------------------------------------

    def _reap_loop(self) -> None:
        while not self._stop_reaper.wait(REAP_INTERVAL_S):
            try:
                self.reap()
            except Exception:
                log.exception("checking for lost agents failed")

    def reap(self) -> None:
        """Give up on agents silent or gone for longer than the window, and their runs."""
        wait = self.config.agent_reconnect_wait_s
        # Silence: no message for the window, and for at least three heartbeats.
        silence = max(wait, 3 * self.config.heartbeat_interval_s)
        now = time.monotonic()
        wall = time.time()
        with self.lock:
            changed = False
            for handle in list(self.agents.values()):
                gone = handle.disconnected_at is not None and now - handle.disconnected_at > wait
                silent = handle.connected and wall - handle.last_heartbeat > silence
                if silent:
                    log.warning(
                        "agent %s sent nothing for %.0f s: treating it as lost",
                        handle.id,
                        wall - handle.last_heartbeat,
                    )
                    handle.outbox.put(None)  # close its stream; it may register again
                if gone or silent:
                    if gone:
                        log.warning("agent %s did not come back in %g s", handle.id, wait)
                    self._drop_agent(handle.id)
                    changed = True
            for run in list(self.runs.values()):
                if run.awaiting and now > run.deadline:
                    for agent_id in sorted(run.awaiting):
                        log.warning(
                            "trial %d run %d: agent %s did not confirm it; requeued",
                            run.trial_id,
                            run.run_id,
                            agent_id,
                        )
                        run.awaiting.discard(agent_id)
                        if run.allocation_id in self.runs:
                            self._part_lost(run, agent_id)
                    changed = True
            if changed:
                self._schedule()
                self.commit.ticket()

    def set_agent_enabled(self, agent_id: str, enabled: bool) -> None:
        with self.lock:
            handle = self.agents.get(agent_id)
            if handle is None:
                raise NotFoundError(f"agent {agent_id!r} is not connected")
            handle.enabled = enabled
            self.scheduler.set_agent_enabled(agent_id, enabled)
            self.batch.agent_state(agent_id, "ACTIVE" if enabled else "DISABLED")
            if enabled:
                self._schedule()
            self._commit_and_wait()

    def allocation_running(self, agent_id: str, allocation_id: str) -> None:
        """An agent started its part of an allocation (not waited for)."""
        with self.lock:
            self._heard_from(agent_id)
            run = self.runs.get(allocation_id)
            if run is None:
                return
            self.batch.set_allocation(run.allocation_id, state="RUNNING")
            self.commit.ticket()

    def _heard_from(self, agent_id: str) -> None:
        handle = self.agents.get(agent_id)
        if handle is not None:
            handle.last_heartbeat = time.time()  # any message shows it is alive

    def allocation_exited(
        self, agent_id: str, allocation_id: str, exit_codes: Sequence[int], message: str = ""
    ) -> None:
        """An agent's part of an allocation ended with these exit codes, one per rank (none:
        its processes could not start). Not waited for: the agent needs no answer."""
        with self.lock:
            self._heard_from(agent_id)
            run = self.runs.get(allocation_id)
            if run is None:
                return
            run.exit_codes[agent_id] = list(exit_codes)
            if message:
                run.messages.append(f"{agent_id}: {message}")
            failed = not exit_codes or any(c != 0 for c in exit_codes)
            if failed and run.stopping is None:
                # One part of the gang is gone: the other ranks cannot go on without it.
                self._send_kill(run, graceful=False)
            if all(a in run.exit_codes for a, _ in run.placement):
                self._finish_run(run)
                self._schedule()
            self.commit.ticket()

    def ship_logs(self, allocation_id: str, lines: Sequence[LogLine]) -> None:
        """Store an allocation's log lines (secrets masked); lines of no running
        allocation are dropped."""
        run = self.runs.get(allocation_id)
        if run is None:
            return
        masked = [replace(line, message=mask_secrets(line.message)) for line in lines]
        self.store.append_logs(run.trial_id, run.run_id, masked)

    # --- the end of a run -----------------------------------------------------------------

    def _finish_run(self, run: Run) -> None:
        if run.allocation_id not in self.runs:
            return
        del self.runs[run.allocation_id]
        self.tokens.pop(run.token, None)
        self.run_of_trial.pop(run.trial_id, None)
        self.scheduler.release(str(run.trial_id))
        self.batch.set_allocation(run.allocation_id, state="TERMINATED", ended_at=_now())
        codes = [c for codes in run.exit_codes.values() for c in codes]
        trial = self.trials[run.trial_id]
        experiment = self.experiments[run.experiment_id]
        ok = bool(codes) and all(c == 0 for c in codes)
        preempted = PREEMPTED_EXIT_CODE in codes and all(
            c in (0, PREEMPTED_EXIT_CODE) for c in codes
        )
        if run.stopping in ("cancel", "kill"):
            self._set_trial(trial, state="CANCELED", end_time=_now())
        elif ok and trial.closed:
            # Done: the searcher closed it, whatever stop was landing as it exited.
            self._set_trial(trial, state="COMPLETED", end_time=_now())
            self._searcher_event(experiment, trial, "on_trial_closed")
        elif run.stopping == "preempt":
            self._set_trial(trial, state="QUEUED")  # resumes from its checkpoint later
            self._enqueue(trial)
        elif run.stopping == "pause":
            if experiment.state == "ACTIVE":
                # Activated again while the pause was landing: run on.
                self._set_trial(trial, state="QUEUED")
                self._enqueue(trial)
            else:
                self._set_trial(trial, state="PAUSED")
        elif run.lost:
            message = f"assay: run {run.run_id} lost its agent; requeued (not a restart)"
            self.batch.log(trial.id, run.run_id, message, level="WARNING", now=_now())
            self._set_trial(trial, state="QUEUED")
            self._enqueue(trial)
        elif ok and trial.target is None:
            # Validated at its rung and not promoted (yet): it waits, checkpointed.
            self._set_trial(trial, state="PAUSED")
        elif ok and run.released:
            # Told to stop at its rung, then promoted while it was on its way out.
            self._set_trial(trial, state="QUEUED")
            self._enqueue(trial)
        elif ok and experiment.config.is_script:
            # A script that exits 0 has finished, as in Determined: its code decided so,
            # and running it again would decide the same. The searcher learns it ended
            # before the length it asked for.
            message = (
                f"assay: run {run.run_id} exited 0 at batch {trial.total_batches}, before "
                f"its searcher target {trial.target}: the trial ends as completed"
            )
            log.info("trial %d: %s", trial.id, message)
            self.batch.log(trial.id, run.run_id, message, level="WARNING", now=_now())
            self._set_trial(trial, state="COMPLETED", end_time=_now())
            self._searcher_event(experiment, trial, "on_trial_exited_early", "user_canceled")
        elif preempted:
            # Stopped at a checkpoint when asked to (SIGTERM, e.g. its agent shutting
            # down, or the master): not the user's failure.
            log.info("trial %d stopped at a checkpoint before batch %s", trial.id, trial.target)
            self._set_trial(trial, state="QUEUED")
            self._enqueue(trial)
        elif INVALID_HP_EXIT_CODE in codes:
            log.warning("trial %d: its hyperparameters are unusable (InvalidHP)", trial.id)
            self._set_trial(trial, state="CANCELED", end_time=_now())
            self._searcher_event(experiment, trial, "on_trial_exited_early", "invalid_hp")
        else:
            restarts = trial.restarts + 1
            why = mask_secrets("; ".join(run.messages)) or f"exit codes {codes}"
            if ok:
                why = f"its process exited 0 before training to batch {trial.target}"
            limit = experiment.config.max_restarts
            self._set_trial(trial, last_error=f"run {run.run_id}: {why}")
            if restarts <= limit:
                what = f"restart {restarts} of {limit} from the latest checkpoint"
                self._set_trial(trial, state="QUEUED", restarts=restarts)
                trial.order = 0  # a failing trial goes to the back; others keep their place
                self._enqueue(trial)
            else:
                what = f"no restarts left (max_restarts: {limit}): the trial ends in ERROR"
                self._set_trial(trial, state="ERROR", end_time=_now())
                self._searcher_event(experiment, trial, "on_trial_exited_early", "errored")
            message = f"assay: run {run.run_id} failed ({why}); {what}"
            log.warning("trial %d: %s", trial.id, message)
            self.batch.log(trial.id, run.run_id, message, level="ERROR", now=_now())
        self._settle_experiment(experiment)

    def _settle_experiment(self, experiment: ExperimentState) -> None:
        """End the experiment when its search is over and every trial has ended."""
        trials = experiment.trials.values()
        if experiment.state == "PAUSED" or any(t.state not in TERMINAL_TRIAL for t in trials):
            return
        states = {t.state for t in trials}
        if experiment.state.startswith("STOPPING_"):
            final = "CANCELED"
        elif not experiment.shutdown:
            if self.queued.keys() & experiment.trials.keys():
                return
            # Every trial has ended and the searcher asks for nothing more, yet has not
            # said it is done: end here rather than wait for ever.
            log.error("experiment %d: the searcher stopped without finishing", experiment.id)
            final = "COMPLETED" if "COMPLETED" in states else "ERROR"
        else:
            final = "COMPLETED" if "COMPLETED" in states else "ERROR"
        progress = 1.0 if final == "COMPLETED" else experiment.progress
        self._set_experiment(experiment, state=final, end_time=_now(), progress=progress)
        if any(t.checkpointed for t in experiment.trials.values()):
            self._collect_garbage(experiment.id, experiment_ended=True)
        del self.experiments[experiment.id]
        for trial_id in experiment.trials:
            self.trials.pop(trial_id, None)
            self.queued.pop(trial_id, None)
        self.models.drop(experiment.id)

    # --- the harness's calls --------------------------------------------------------------

    def run_for_token(self, token: str, trial_id: int, run_id: int) -> Run:
        with self.lock:
            allocation_id = self.tokens.get(token)
            run = self.runs.get(allocation_id) if allocation_id else None
        if run is None or run.trial_id != trial_id:
            raise PermissionDeniedError(
                f"this call for trial {trial_id} does not carry the token of a running "
                "allocation of that trial"
            )
        return run

    def next_operation(self, run: Run, total_batches: int) -> int | None:
        """The batch count to train to next, or None: checkpointed, the process may exit.

        Asked at start and after each completed target. A trial whose target is reached
        but not yet reported (a restore right after its validation) gets the same target
        back, validates and reports it.
        """
        with self.lock:
            trial = self.trials.get(run.trial_id)
            if run.stopping is not None or trial is None or trial.closed:
                answer = None
            else:
                answer = trial.target
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
            if stop_requested and trial is not None and experiment is not None:
                if not trial.closed:
                    target = trial.target
                    if target is not None and total_batches >= target:
                        # It finished its target first: the searcher gets that result.
                        trial.target = None
                        self._searcher_event(
                            experiment, trial, "on_validation_completed", metric, target
                        )
                    trial.target, trial.closed = None, True
                    self._searcher_event(
                        experiment, trial, "on_trial_exited_early", "user_canceled"
                    )
                    self._schedule()
                self._commit_and_wait()
                return
            if (
                trial is None
                or experiment is None
                or trial.target is None
                or total_batches < trial.target
            ):
                # Reported already (a retry), short of the target, or the experiment has
                # ended: once what the first report changed is durable, nothing to do.
                self._commit_and_wait()
                return
            # A script may validate past its target (it validates on its own schedule):
            # the searcher's rung is the target it asked for.
            target, trial.target = trial.target, None
            self._searcher_event(experiment, trial, "on_validation_completed", metric, target)
            self._schedule()
            self._commit_and_wait()

    def best_validation(self, run: Run) -> float | None:
        """The best searcher-metric value any trial of `run`'s experiment has reported."""
        with self.lock:
            experiment = self.experiments.get(run.experiment_id)
            if experiment is None:
                return None
            values = [
                t.best_validation
                for t in experiment.trials.values()
                if t.best_validation is not None and math.isfinite(t.best_validation)
            ]
            if not values:
                return None
            smaller = experiment.config.searcher.smaller_is_better
            return min(values) if smaller else max(values)

    def report_progress(self, run: Run, progress: float) -> None:
        """A script's own estimate of how far it is (0..1). It is the experiment's progress
        when the experiment is that one trial (`single`); a search's progress is the
        searcher's budget spent, which a trial's estimate does not change."""
        if not 0.0 <= progress <= 1.0:
            raise InvalidArgumentError(f"progress must be between 0 and 1, got {progress!r}")
        with self.lock:
            experiment = self.experiments.get(run.experiment_id)
            if experiment is None or experiment.config.searcher.name != "single":
                return
            if progress > experiment.progress:
                self._set_experiment(experiment, progress=min(progress, 0.99))
            self._commit_and_wait()

    def report_metrics(self, run: Run, group: str, reports: Sequence[MetricReport]) -> int:
        stored = self.store.report_metrics(run.trial_id, run.run_id, group, reports)
        latest = max((r.total_batches for r in reports), default=0)
        with self.lock:
            trial = self.trials.get(run.trial_id)
            experiment = self.experiments.get(run.experiment_id)
            if trial is None or experiment is None:
                return stored  # the experiment ended meanwhile (a kill)
            searcher = experiment.config.searcher
            fields: dict[str, Any] = {}
            if latest > trial.total_batches:
                fields["total_batches"] = latest
            if group == "validation":
                values = [
                    v
                    for r in reports
                    if (v := r.values.get(searcher.metric)) is not None and math.isfinite(v)
                ]
                if values:
                    best = min(values) if searcher.smaller_is_better else max(values)
                    old = trial.best_validation
                    if old is None or (best < old if searcher.smaller_is_better else best > old):
                        fields["best_validation"] = best
            if fields:
                self._set_trial(trial, **fields)
            self._commit_and_wait()
        return stored

    def report_checkpoint(self, run: Run, checkpoint: CheckpointRecord) -> None:
        """Record a checkpoint the run wrote; refused unless it is where it must be.

        The trial runs its user's code, so a report may say anything: only a uuid is
        accepted, and only at the location the experiment's storage gives that uuid, the
        one garbage collection and `DeleteCheckpoints` will delete.
        """
        location = self._checkpoint_location(run.experiment_id, checkpoint)
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

    def _checkpoint_location(self, experiment_id: int, checkpoint: CheckpointRecord) -> str:
        """The reported checkpoint's location, checked against the one derived from the
        experiment's storage config; `InvalidArgumentError` for a bad uuid or location."""
        with self.lock:
            experiment = self.experiments.get(experiment_id)
            config = experiment.config if experiment is not None else None
        if config is None:  # ended meanwhile: a late report of its last run
            config = parse_config(self.store.get_experiment(experiment_id).config)
        try:
            expected = checkpoint_location(
                config.checkpoint_storage,
                checkpoint_uuid(checkpoint.uuid),
                self.config.checkpoint_root,
            )
        except StorageError as e:
            raise InvalidArgumentError(f"checkpoint report refused: {e}") from None
        if checkpoint.location != expected:
            raise InvalidArgumentError(
                f"checkpoint report refused: checkpoint {checkpoint.uuid} of experiment "
                f"{experiment_id} must be at {expected}, not {checkpoint.location!r}"
            )
        return expected


_ALLOWED_ACTIONS: dict[str, Set[str]] = {
    "pause": {"ACTIVE"},
    "activate": {"PAUSED"},
    "cancel": {"ACTIVE", "PAUSED"},
    "kill": {"ACTIVE", "PAUSED", "STOPPING_CANCELED", "STOPPING_KILLED"},
    "archive": TERMINAL_EXPERIMENT,
    "unarchive": TERMINAL_EXPERIMENT,
}


def _check_cluster_config(config: ExperimentConfig) -> None:
    """The searcher counts batches: a length in epochs must convert (records_per_epoch)."""
    try:
        searcher_in_batches(config)
    except InvalidConfigError as e:
        raise InvalidArgumentError(str(e)) from None


def _check_model_definition(data: bytes) -> None:
    """The archive checks an agent applies before unpacking, done before it is stored."""
    try:
        check_model_archive(data)
    except ModelDefinitionError as e:
        raise InvalidArgumentError(
            f"{e}; exclude data and checkpoints with .assayignore"
            if len(data) > MAX_MODEL_DEF_BYTES
            else str(e)
        ) from None


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


MAX_CONFIG_BYTES = 2**20


def _check_config_text(config_yaml: str) -> None:
    """Refuse configs whose size or YAML aliases could make loading them, or anything
    done with them later, cost far more than their length (a "billion laughs")."""
    if len(config_yaml) > MAX_CONFIG_BYTES:
        raise InvalidArgumentError(
            f"the config is {len(config_yaml)} characters; at most {MAX_CONFIG_BYTES} are taken"
        )
    if "*" not in config_yaml:
        return
    try:
        for token in yaml.scan(config_yaml):
            if isinstance(token, yaml.AliasToken):
                raise InvalidArgumentError(
                    f"the config uses the YAML alias *{token.value}; write the value out "
                    "instead (aliases are not accepted)"
                )
    except yaml.YAMLError as e:
        raise InvalidArgumentError(f"the config is not valid YAML: {e}") from None
