"""The master's shell: the lock, the group commit, and the entry points.

Every public method of `Master` is an entry point (a user's, an agent's or a trial's
call): it takes the lock, asks the lifecycles in `lifecycle/` what to do, has the
`Interpreter` (_interpreter.py) apply their effects to memory, the open `WriteBatch` and
the agents' outboxes, and commits; every change reaches the store in a group commit
before the master acts on it (DESIGN.md: "The database is the truth"; _commit.py).
Metric rows bypass the lock: the store fences and deduplicates them by itself. Checks
and new state of experiments: `_intake`; `experiment set`: `_sharing`; a trial's
reports to the store: `_trial_reports`; the read-only RPCs' snapshot: `_cluster_view`.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from assay.master._cluster_view import cluster_view
from assay.master._commit import GroupCommit
from assay.master._config import MasterConfig
from assay.master._interpreter import Interpreter, Recorder
from assay.master._log_watch import LogWatches
from assay.master._state import trial_state
from assay.master.errors import ConflictError, InvalidArgumentError
from assay.master.fleet import AgentHandle, ClusterView, Load, Outbox, PoolAccess, Registration
from assay.master.lifecycle import RELEASED, ExperimentStatus, Run
from assay.master.lifecycle import agent as agent_life
from assay.master.lifecycle import effects as fx
from assay.master.lifecycle import experiment as experiment_life
from assay.master.lifecycle import trial as trial_life
from assay.master.sharing import not_settable, parse_value, resource_change
from assay.master.store import (
    CheckpointRecord,
    ExperimentRecord,
    LogLine,
    MetricReport,
    ModelDefinition,
    Store,
    WriteBatch,
)
from assay.master.submission import PreparedExperiment, SubmissionQuota, intake, new_record
from assay.master.telemetry import NO_TELEMETRY, LogKeeper, RankUsageBoard, Telemetry, reports

log = logging.getLogger("assay.master")
REAP_INTERVAL_S = 1.0


class Master:
    """Owns the lock, the group commit and the agents' reaper; its memory is the
    interpreter's (`scheduler`, `experiments`, `runs`, ... are the interpreter's own).

    Public methods change memory under `lock`, record the change in the open write
    batch, and wait for it to commit before they return; messages to agents are sent
    only after the commit that records them (see _commit.py).
    """

    def __init__(
        self,
        config: MasterConfig,
        store: Store,
        on_fatal: Callable[[BaseException], None] = lambda e: None,
        telemetry: Telemetry = NO_TELEMETRY,
    ) -> None:
        """`telemetry`: what counts the master's work for its metrics (none by default)."""
        self.config = config
        self.telemetry = telemetry
        self._storage_policy = config.storage_policy  # parsed once: on every submission
        self.quota = SubmissionQuota(
            config.experiments_per_minute,
            config.model_definitions_mb * 2**20,
            store.model_definition_bytes,
        )
        self.store = store
        self.cluster_id = str(uuid.uuid4())
        self.lock = threading.RLock()
        self.commit = GroupCommit(store, self.lock, on_fatal, telemetry=telemetry)
        self.interpreter = it = self._interpreter(config, store, self.commit)
        it.telemetry = telemetry
        # What the servicers, the simulation and the tests read of memory.
        self.scheduler, self.fleet, self.ledger = it.scheduler, it.fleet, it.ledger
        self.experiments, self.trials, self.tokens = it.experiments, it.trials, it.ledger.tokens
        self.runs, self.run_of_trial, self.queued = it.runs, it.run_of_trial, it.queued
        self.models, self._gc = it.models, it.gc
        # Which workspaces may use each pool; a workspace the settings name is made now.
        self.pool_access = PoolAccess(store, config, self.scheduler.names)
        with self.lock:
            self.fleet.load_credentials(store.agent_credentials())
            it.recover()  # a restart: reload the live experiments, requeue their trials
        self.commit.flush()
        self.pool_access.hold_back(self)  # trials of experiments a binding keeps out wait
        self._stop_reaper = threading.Event()
        self._reaper = threading.Thread(target=self._reap_loop, name="reaper", daemon=True)
        self._reaper.start()
        self.logs = LogKeeper(
            store, quota_mb=config.log_quota_mb, retention_days=config.log_retention_days
        )
        # Each running rank's latest utilisation, from the heartbeats (memory only).
        self.rank_usage = RankUsageBoard(self._runs_on)
        self.log_watches = LogWatches(self.experiments)

    def _runs_on(self, allocation_id: str, agent_id: str) -> bool:
        """Whether a part of the allocation runs on the agent (read without the lock)."""
        return agent_life.part_on(self.runs, allocation_id, agent_id) is not None

    def _interpreter(self, config: MasterConfig, store: Store, commit: Recorder) -> Interpreter:
        """The interpreter this master's lock guards (the simulation watches its own)."""
        return Interpreter(config, store, commit)

    @property
    def batch(self) -> WriteBatch:
        return self.commit.batch

    @property
    def agents(self) -> dict[str, AgentHandle]:
        return self.fleet.agents

    @property
    def unplaceable(self) -> dict[int, str]:
        """Queued trials that cannot be placed even on an idle cluster, and why; read
        without the lock (the interpreter replaces the dict in one assignment)."""
        return self.interpreter.unplaceable

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
        self.logs.close()

    def commit_and_wait(self) -> None:
        """Called under the lock at the end of a change: release it, then wait."""
        ticket = self.commit.ticket()
        self.lock.release()
        try:
            self.commit.wait(ticket)
        finally:
            self.lock.acquire()

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
        self, config_yaml: str, model_definition: ModelDefinition, *, owner: str = "admin"
    ) -> PreparedExperiment:
        """Check a submission (no lock taken); `InvalidArgumentError` says what to fix. An
        upload spooled to disk (`ArchiveFile`) is checked and stored from its file."""
        return intake.prepare(
            config_yaml,
            model_definition,
            owner,
            pools=self.scheduler.names,
            storage_policy=self._storage_policy,
            store=self.store,
        )

    def add_experiment(
        self, prepared: PreparedExperiment, *, activate: bool
    ) -> tuple[ExperimentRecord, int, str | None]:
        """Record a checked experiment and its first trials; return it, the commit ticket
        to wait for, and why its trials could not start even on this cluster idle (None
        when they can, once slots are free)."""
        experiment_id = self.store.reserve_id("experiments")
        now = _now()
        state = ExperimentStatus.ACTIVE if activate else ExperimentStatus.PAUSED
        with self.lock:
            experiment = intake.record(self.batch, prepared, experiment_id, state, now)
            self.ledger.add_experiment(experiment)
            self.models.put(experiment_id, prepared.model_definition)
            self.interpreter.search(experiment, experiment.searcher.initial_operations())
            self.interpreter.schedule()
            ticket = self.commit.ticket()
            why = intake.never_fits(prepared.config, self.scheduler, self.fleet)
        return new_record(prepared, experiment_id, state, now, experiment.progress), ticket, why

    def experiment_action(self, experiment_id: int, action: str) -> None:
        with self.lock:
            experiment = self.experiments.get(experiment_id)
            if experiment is not None:
                runs = self.ledger.runs_by_trial()
                self.interpreter.do(experiment_life.act(experiment, action, runs, _now()))
                self.interpreter.schedule()
                self.commit_and_wait()
                return
        # A finished experiment (or none): only its stored row can change.
        self.commit.flush()
        record = self.store.get_experiment(experiment_id)
        experiment_life.check_action(experiment_id, record.state, action)
        self.store.update_experiment(experiment_id, archived=action == "archive")

    def kill_trial(self, trial_id: int) -> None:
        """`assay trial kill`: kill one trial of a live experiment (see
        `experiment_life.kill_trial`); `ConflictError` for a trial that has ended."""
        with self.lock:
            trial = self.trials.get(trial_id)
            if trial is not None:
                experiment = self.experiments[trial.experiment_id]
                run = self.ledger.runs_by_trial().get(trial_id)
                self.interpreter.do(experiment_life.kill_trial(experiment, trial, run, _now()))
                self.interpreter.schedule()
                self.commit_and_wait()
                return
        self.commit.flush()
        record = self.store.get_trial(trial_id)  # NotFoundError: none
        raise experiment_life.trial_has_ended(trial_id, record.state)

    def continue_experiment(self, experiment_id: int, overrides: Mapping[str, Any]) -> None:
        """`experiment continue`: a finished single-trial experiment's trial resumes from
        its latest checkpoint and trains on with `overrides` (`_intake.continuation`); the
        stored config becomes the continued one, so a restarted master knows the length."""
        with self.lock:
            live = self.experiments.get(experiment_id)
            if live is not None:
                experiment_life.check_action(experiment_id, live.state, "continue")
        self.commit.flush()
        record = self.store.get_experiment(experiment_id)  # NotFoundError: none
        raw, config, searcher = intake.continuation(record, overrides)
        with self.lock:
            if experiment_id in self.experiments:  # continued by another call meanwhile
                raise ConflictError(f"cannot continue experiment {experiment_id}: it is active")
            trials = [trial_state(self.store, t, {}) for t in self.store.list_trials(experiment_id)]
            experiment, effects = intake.continued(record, raw, config, searcher, trials)
            self.ledger.add_experiment(experiment)
            self.interpreter.do(effects)
            self.interpreter.adopt_trials(experiment)  # the trial's target: the new length
            self.interpreter.schedule()
            self.commit_and_wait()

    def delete_experiment_rows(self, experiment_id: int) -> None:
        """`Store.delete_experiment` under the lock, once the experiment's files are gone;
        refused for one made live again meanwhile (`experiment_life.check_deletable`)."""
        with self.lock:
            experiment_life.check_deletable(experiment_id, self.experiments.get(experiment_id))
            self.store.delete_experiment(experiment_id)

    def set_experiment_resource(self, experiment_id: int, name: str, value: str) -> None:
        """`experiment set NAME VALUE`: a live experiment's priority, weight or max-slots
        changes now and for good (`_sharing.resource_change`); the next round uses it."""
        parsed = parse_value(name, value)
        with self.lock:
            experiment = self.experiments.get(experiment_id)
            if experiment is None:
                state = self.store.get_experiment(experiment_id).state  # NotFoundError: none
                raise not_settable(experiment_id, state, name)
            change = resource_change(experiment, name, parsed, self.queued)
            experiment.config, experiment.priority = change.config, change.priority
            experiment.__dict__.pop("config_json", None)  # cached from the old raw config
            self.interpreter.do(change.effects)
            self.interpreter.schedule()
            self.commit_and_wait()

    # --- agents -------------------------------------------------------------------------

    def register_agent(
        self,
        register: Registration,
        peer_host: str,
        outbox: Outbox,
        *,
        credential: str | None = None,
        joined: bool = False,
    ) -> AgentHandle:
        """A (re)connecting agent: its running allocations are kept, the rest forgotten.
        `credential` and `joined`: what it presented (see `Fleet.register`)."""
        with self.lock:
            handle, lost = self.fleet.register(
                register, peer_host, outbox, _now(), credential=credential, joined=joined
            )
            self.interpreter.parts_lost(register.agent_id, lost)
            running = register.running_allocations
            self.interpreter.do(agent_life.reconcile(handle.id, running, list(self.runs.values())))
            self.interpreter.schedule()
            self.commit_and_wait()
            return handle

    def agent_hung_up(self, handle: AgentHandle) -> None:
        """The agent of `handle` hung up before its registration was answered: it is
        disconnected, and a credential it was never told is withdrawn."""
        with self.lock:
            if handle.credential:
                self.fleet.withdraw(handle.id, handle.credential)
                handle.credential = ""
            self.commit.ticket()
        self.agent_disconnected(handle.id, handle)

    def heartbeat(self, agent_id: str, beat: Load) -> None:
        with self.lock:
            self.fleet.heard_from(agent_id, beat)

    def heard_from(self, agent_id: str) -> None:
        """Any message from the agent shows it alive: its heartbeats may be queued behind
        log batches the master is still storing."""
        with self.lock:
            self.fleet.heard_from(agent_id)

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
                self.interpreter.drop_agent(agent_id, "disconnected")
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
                self.interpreter.do(effects)
                self.interpreter.schedule()
                self.commit.ticket()

    def remove_agent(self, agent_id: str) -> bool:
        """Forget the agent's credential, so its name can join again with the join token;
        an agent connected (or awaited) is dropped as lost, its trials requeued. True if
        it was."""
        with self.lock:
            known = agent_id in self.fleet.agents
            self.fleet.forget(agent_id)
            if known:
                self.interpreter.drop_agent(agent_id, "was removed by an admin")
            self.commit_and_wait()
            return known

    def set_agent_enabled(self, agent_id: str, enabled: bool, *, drain: bool = False) -> None:
        """Enable or disable placement on an agent. Disabling stops the runs there at a
        checkpoint, and their trials requeue (Determined's disable); with `drain` they
        finish instead, and the agent shows as draining until they have."""
        with self.lock:
            self.fleet.set_enabled(agent_id, enabled, drain=drain)
            if not enabled and not drain:
                self.interpreter.do(agent_life.disabled(agent_id, list(self.runs.values())))
            self.interpreter.schedule()  # disabled: what waits may now never fit, and says so
            self.commit_and_wait()

    def allocation_running(self, agent_id: str, allocation_id: str) -> None:
        """An agent started its part of an allocation (not waited for)."""
        with self.lock:
            self.fleet.heard_from(agent_id)
            if agent_life.part_on(self.runs, allocation_id, agent_id) is not None:
                self.batch.set_allocation(allocation_id, state="RUNNING")
                self.commit.ticket()

    def allocation_exited(
        self,
        agent_id: str,
        allocation_id: str,
        exit_codes: Sequence[int],
        message: str = "",
        failure: str = "",
    ) -> None:
        """An agent's part of an allocation ended with these exit codes, one per rank (none:
        its processes could not start); `failure`: how its first rank to fail ended. Not
        waited for: the agent needs no answer."""
        with self.lock:
            self.fleet.heard_from(agent_id)
            run = self.runs.get(allocation_id)
            if run is None:
                return
            effects = agent_life.part_exited(run, agent_id, exit_codes, message, failure)
            self.interpreter.do(effects)
            if effects and isinstance(effects[-1], fx.FinishRun):
                self.interpreter.schedule()
            self.commit.ticket()

    def ship_logs(self, agent_id: str, allocation_id: str, lines: Sequence[LogLine]) -> None:
        """Store an allocation's log lines (secrets masked) within its trial's quota;
        lines of no running allocation, or from an agent it does not run on, are dropped."""
        run = agent_life.part_on(self.runs, allocation_id, agent_id)
        if run is not None:
            shown = reports.masked(lines)
            self.log_watches.scan(run, agent_id, shown)  # the experiment's log_policies
            self.logs.append(run.trial_id, run.run_id, shown)

    def cluster_view(self) -> ClusterView:
        """A copy of the agents and the queue for the read-only RPCs."""
        with self.lock:
            return cluster_view(self.cluster_id, self.interpreter)

    def close_streams(self) -> None:
        """Close every agent's stream (the master is stopping)."""
        with self.lock:
            self.fleet.close_streams()

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
            if answer is None and not run.released and run.stopping is None:
                self.batch.set_allocation(run.allocation_id, stopping=RELEASED)  # restart-proof
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
        A multi-objective search is told every metric of the validation (`searcher.metrics`).
        """
        experiment = self.experiments.get(run.experiment_id)  # one read: no lock needed
        result = reports.validation_result(self.store, experiment, run, total_batches, metric)
        with self.lock:
            trial = self.trials.get(run.trial_id)
            experiment = self.experiments.get(run.experiment_id)
            if trial is not None and experiment is not None:
                effects = trial_life.validated(
                    trial, experiment, total_batches, result, stop_requested=stop_requested
                )
                self.interpreter.do(effects)
                if effects:
                    self.interpreter.schedule()
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
            self.interpreter.do(trial_life.progress_reported(experiment, progress))
            self.commit_and_wait()

    def report_metrics(self, run: Run, group: str, metrics: Sequence[MetricReport]) -> int:
        """Store a run's metrics and the trial's progress in one transaction (the store
        fences stale runs and makes retries no-ops), then update memory with it."""
        experiment = self.experiments.get(run.experiment_id)  # one read: no lock needed
        done = reports.store_metrics(
            self.store,
            experiment,
            run,
            group,
            metrics,
            max_names=self.config.metric_names_per_trial,
        )
        self.telemetry.metric_rows(done.stored)
        with self.lock:
            trial = self.trials.get(run.trial_id)
            if trial is not None:
                reports.metrics_stored(trial, done)
                if experiment is not None and (
                    effects := trial_life.progress_trained(experiment, trial)
                ):
                    self.interpreter.do(effects)
                    self.commit.ticket()  # not waited for: the rows are stored
        return done.stored

    def report_checkpoint(self, run: Run, checkpoint: CheckpointRecord) -> None:
        """Record a checkpoint the run wrote; refused unless it is where it must be
        (`_trial_reports.store_checkpoint`)."""
        with self.lock:
            experiment = self.experiments.get(run.experiment_id)
            config = experiment.config if experiment is not None else None
        root = self.config.checkpoint_root
        location = reports.store_checkpoint(self.store, config, run, checkpoint, root)
        with self.lock:
            trial = self.trials.get(run.trial_id)
            if trial is not None:
                reports.checkpoint_stored(trial, checkpoint, location)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


__all__ = ["Master", "Run"]
