"""Every call into the master: `MasterAdapter` wraps a real `Master` on a store (in memory
by default, or SQLite) and takes its memory as a `Snapshot`; nothing else in the
simulation touches `Master`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, cast

from assay.master._config import MasterConfig
from assay.master._core import Master
from assay.master._interpreter import Interpreter, Recorder
from assay.master.fleet import AgentHandle, Device, Load, Registration
from assay.master.lifecycle import KillRun, StartRun
from assay.master.lifecycle import effects as fx
from assay.master.simulate._snapshot import (
    ExperimentView,
    InvariantError,
    Move,
    RunView,
    Snapshot,
    TrialView,
)
from assay.master.store import (
    CheckpointRecord,
    MasterStore,
    MemoryDatabase,
    MemoryStore,
    MetricReport,
    Store,
)

StoreKind = Literal["memory", "sqlite"]


class Outbox:
    """An agent's stream: what the master sent and the agent has not read yet."""

    def __init__(self) -> None:
        self.messages: list[StartRun | KillRun | None] = []

    def put(self, message: StartRun | KillRun | None) -> None:
        self.messages.append(message)


class WatchedInterpreter(Interpreter):
    """An `Interpreter` that records in `moves` every state its effects set, in order: one
    call may move a trial several times, and each move must be an edge."""

    def __init__(
        self, config: MasterConfig, store: Store, commit: Recorder, moves: list[Move]
    ) -> None:
        super().__init__(config, store, commit)
        self.moves = moves

    def _apply(self, effect: fx.Effect) -> None:
        if isinstance(effect, fx.SetTrial) and "state" in effect.fields:
            trial = self.trials.get(effect.trial_id)
            if trial is not None:
                self.moves.append(
                    ("trial", trial.id, str(trial.state), str(effect.fields["state"]))
                )
        elif isinstance(effect, fx.SetExperiment) and "state" in effect.fields:
            experiment = self.experiments[effect.experiment_id]
            state = str(effect.fields["state"])
            self.moves.append(("experiment", experiment.id, str(experiment.state), state))
        super()._apply(effect)


class WatchedMaster(Master):
    """A `Master` whose interpreter records its moves (its recovery's too)."""

    def __init__(self, config: MasterConfig, store: MasterStore) -> None:
        self.moves: list[Move] = []
        # `Master` names the SQL store's class; it asks only what `MasterStore` offers.
        super().__init__(config, cast(Store, store))

    def _interpreter(self, config: MasterConfig, store: Store, commit: Recorder) -> Interpreter:
        return WatchedInterpreter(config, store, commit, self.moves)


class MasterAdapter:
    """The one place that calls `Master` (and reads its memory for `snapshot`).

    `store`: where the master keeps its state, "memory" (a `MemoryStore`, the default:
    the simulation's speed is the master's own) or "sqlite" (a file in `directory`, the
    store a single master runs on). A restart opens a new store on the same data.
    """

    def __init__(
        self,
        directory: Path,
        *,
        reconnect_wait_s: float,
        preemption: bool,
        store: StoreKind = "memory",
    ) -> None:
        self.url = f"sqlite:///{directory / 'assay.db'}"
        self.database = MemoryDatabase() if store == "memory" else None
        self.config = MasterConfig(
            state_dir=directory,
            agent_reconnect_wait_s=reconnect_wait_s,
            heartbeat_interval_s=1e6,  # silence never counts: agents die by a step
            kill_grace_s=1.0,
            preemption=preemption,
        )
        self.store = self._open()
        self.master = WatchedMaster(self.config, self.store)
        self.pending = False  # changes recorded that no call has waited for yet

    def _open(self) -> MasterStore:
        if self.database is not None:
            return MemoryStore(self.database)
        return Store.open(self.url)

    def restart(self) -> None:
        """Stop this master and start another on the same database, as a new process."""
        self.close()
        self.store = self._open()
        self.master = WatchedMaster(self.config, self.store)  # it commits its recovery
        self.pending = False

    def close(self) -> None:
        self.master.close()
        # Checkpoint collection runs on the master's own thread: let it finish with the
        # store it was given (the next master, or the next simulation, has its own).
        self.master._gc.shutdown(wait=True)
        self.store.close()

    def flush(self) -> None:
        """Wait until every change so far is committed and its messages are sent."""
        if self.pending:
            self.master.commit.flush()
            self.pending = False

    def _waited(self) -> None:
        """The last call waited for the commit of everything recorded so far."""
        self.pending = False

    # agents (the calls an agent's stream makes are not waited for: `pending`)
    def register(
        self, agent_id: str, slot_type: str, slots: int, running: frozenset[str], outbox: Any
    ) -> AgentHandle:
        devices = tuple(Device(i, name=slot_type) for i in range(slots))
        kind: Any = slot_type
        registration = Registration(agent_id, kind, devices, "10.0.0.1", 0, running)
        handle = self.master.register_agent(registration, "10.0.0.1", outbox)
        self._waited()
        return handle

    def disconnected(self, agent_id: str, handle: AgentHandle) -> None:
        self.pending = True
        self.master.agent_disconnected(agent_id, handle)

    def heartbeat(self, agent_id: str) -> None:
        self.pending = True
        self.master.heartbeat(agent_id, Load())

    def set_enabled(self, agent_id: str, enabled: bool) -> None:
        self.master.set_agent_enabled(agent_id, enabled)
        self._waited()

    def running(self, agent_id: str, allocation_id: str) -> None:
        self.pending = True
        self.master.allocation_running(agent_id, allocation_id)

    def exited(
        self, agent_id: str, allocation_id: str, codes: list[int], message: str, failure: str = ""
    ) -> None:
        self.pending = True
        self.master.allocation_exited(agent_id, allocation_id, codes, message, failure)

    def reap(self) -> None:
        self.pending = True
        self.master.reap()

    # users
    def create(self, config_yaml: str, archive: bytes, *, activate: bool) -> int:
        experiment_id = self.master.create_experiment(config_yaml, archive, activate=activate).id
        self._waited()
        return experiment_id

    def action(self, experiment_id: int, action: str) -> None:
        self.master.experiment_action(experiment_id, action)
        self._waited()

    def continue_(self, experiment_id: int, overrides: dict[str, Any]) -> None:
        self.master.continue_experiment(experiment_id, overrides)
        self._waited()

    def continuable(self, experiment_id: int) -> int | None:
        """The batch count an ended experiment's trial would continue from, or None when
        continue must refuse it (not a single search, or no checkpoint left)."""
        record = self.store.get_experiment(experiment_id)
        trials = self.store.list_trials(experiment_id)
        if record.config["searcher"]["name"] != "single" or len(trials) != 1:
            return None
        uuid = trials[0].latest_checkpoint
        if uuid is None:
            return None
        checkpoint = self.store.get_checkpoint(uuid)
        return None if checkpoint.state == "DELETED" else checkpoint.total_batches

    def final_states(self, experiment_id: int) -> tuple[str, dict[int, str]]:
        """An ended experiment's state and its trials' as stored."""
        state = self.store.get_experiment(experiment_id).state
        return state, {t.id: t.state for t in self.store.list_trials(experiment_id)}

    # a trial's rank 0 (each call carries the allocation's token, as over gRPC)
    def next_operation(self, token: str, trial_id: int, run_id: int, total: int) -> int | None:
        calls = self.master
        target = calls.next_operation(calls.run_for_token(token, trial_id, run_id), total)
        self._waited()
        return target

    def should_preempt(self, token: str, trial_id: int, run_id: int) -> bool:
        return self.master.run_for_token(token, trial_id, run_id).stopping is not None

    def report_metrics(
        self, token: str, trial_id: int, run_id: int, group: str, report: MetricReport
    ) -> None:
        calls, self.pending = self.master, True
        calls.report_metrics(calls.run_for_token(token, trial_id, run_id), group, [report])

    def report_checkpoint(
        self, token: str, trial_id: int, run_id: int, checkpoint: CheckpointRecord
    ) -> None:
        calls, self.pending = self.master, True
        calls.report_checkpoint(calls.run_for_token(token, trial_id, run_id), checkpoint)

    def complete_operation(
        self, token: str, trial_id: int, run_id: int, total: int, metric: float, *, stop: bool
    ) -> None:
        calls = self.master
        run = calls.run_for_token(token, trial_id, run_id)
        calls.complete_operation(run, total, metric, stop_requested=stop)
        self._waited()

    def report_progress(self, token: str, trial_id: int, run_id: int, progress: float) -> None:
        calls, self.pending = self.master, True
        calls.report_progress(calls.run_for_token(token, trial_id, run_id), progress)

    def best_validation(self, token: str, trial_id: int, run_id: int) -> float | None:
        calls = self.master
        return calls.best_validation(calls.run_for_token(token, trial_id, run_id))

    def moves(self) -> list[Move]:
        """The states written since the last call, in order."""
        moves = list(self.master.moves)
        self.master.moves.clear()
        return moves

    def snapshot(self, *, search: bool = False) -> Snapshot:
        """The master's memory as plain data; with the searchers' state if `search`."""
        m = self.master
        with m.lock:
            experiments = {
                e.id: ExperimentView(
                    str(e.state),
                    e.progress,
                    e.shutdown,
                    json.dumps(e.searcher.snapshot(), sort_keys=True) if search else "",
                    tuple(sorted(e.trials)),
                    e.config.max_restarts,
                )
                for e in m.experiments.values()
            }
            trials = {
                t.id: TrialView(
                    t.experiment_id,
                    str(t.state),
                    t.run_id,
                    t.restarts,
                    t.total_batches,
                    t.best_validation,
                    t.target,
                    t.closed,
                    t.checkpoint.uuid if t.checkpoint else None,
                )
                for t in m.trials.values()
            }
            runs = {
                r.trial_id: RunView(
                    r.allocation_id,
                    r.run_id,
                    r.placement,
                    frozenset(r.exit_codes),
                    frozenset(r.awaiting),
                    r.stopping,
                    r.released and r.stopping is None,
                )
                for r in m.runs.values()
            }
            if len(runs) != len(m.runs):
                raise InvariantError("two runs of one trial")
            allocations = {int(k): p for k, p in m.scheduler.allocations.items()}
            agents = {a.id: a.slots for a in m.scheduler.agents}
            return Snapshot(experiments, trials, runs, frozenset(m.queued), allocations, agents)
