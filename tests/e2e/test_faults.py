"""Fault injection on a real cluster: processes are killed with SIGKILL mid-trial.

Each scenario asserts what a user needs: the experiment ends as it should, every
validation the searcher asked for is stored exactly once, and no slot stays allocated.
The trial is the regression fixture with slow steps (20 ms), validating and
checkpointing every 50 batches, so each kill lands in the middle of training.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from assay._rank_processes import free_port
from assay.proto import common_pb2
from tests.conftest import REGRESSION_DIR, regression_config
from tests.e2e.conftest import SCRIPTS, Cluster, loop_config, start_cluster, stop_cluster

BATCHES = 300
EVERY = 50

pytestmark = pytest.mark.slow


def _config(tmp: Path, sleep_s: float = 0.02, **hparams: Any) -> Path:
    config = regression_config(
        batches=BATCHES,
        scheduling_unit=25,
        validation_period=EVERY,
        checkpoint_period=EVERY,
        sleep_s=sleep_s,
        **hparams,
    )
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _create(cluster: Cluster, config: Path) -> int:
    created = cluster.json("experiment", "create", str(config), str(REGRESSION_DIR))
    return int(created["id"])


def _describe(cluster: Cluster, eid: int) -> dict[str, Any]:
    described: dict[str, Any] = cluster.json("experiment", "describe", str(eid))
    return described


def _eventually(check: Callable[[], bool], timeout: float, cluster: Cluster, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except AssertionError:
            pass  # the master is restarting: the CLI's call failed
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached in {timeout:.0f} s:\n{cluster.dump_logs()}")
        time.sleep(0.5)


def _validations(cluster: Cluster, trial_id: int) -> list[int]:
    rows = cluster.json("trial", "metrics", str(trial_id), "--group", "validation")
    return [int(r["total_batches"]) for r in rows]


def _trained_past(cluster: Cluster, eid: int, batches: int) -> Callable[[], bool]:
    def check() -> bool:
        trials = _describe(cluster, eid)["trials"]
        return bool(trials) and any(v >= batches for v in _validations(cluster, trials[0]["id"]))

    return check


def _state(cluster: Cluster, eid: int, *states: str) -> Callable[[], bool]:
    return lambda: _describe(cluster, eid)["state"] in states


def _assert_clean_end(cluster: Cluster, eid: int, state: str = "COMPLETED") -> dict[str, Any]:
    described = _describe(cluster, eid)
    assert described["state"] == state, cluster.dump_logs()
    [trial] = described["trials"]
    # Every validation exactly once: none lost, none counted twice after a restore.
    assert _validations(cluster, trial["id"]) == list(range(EVERY, BATCHES + 1, EVERY))
    _eventually(
        lambda: all(not s["allocation_id"] for s in cluster.json("slot", "list")),
        30,
        cluster,
        "every slot free",
    )
    return trial  # type: ignore[no-any-return]


@pytest.fixture
def two_agents(tmp_path: Path) -> Iterator[Cluster]:
    env = {"ASSAY_AGENT_RECONNECT_WAIT_S": "5", "ASSAY_HEARTBEAT_INTERVAL_S": "1"}
    cluster = start_cluster(tmp_path, None, agents=2, slots=1, master_env=env)
    try:
        yield cluster
    finally:
        stop_cluster(cluster)


@pytest.mark.parametrize("down_s", [0, 20])
def test_the_master_killed_mid_trial_loses_nothing(
    two_agents: Cluster, tmp_path: Path, down_s: int
) -> None:
    cluster = two_agents
    eid = _create(cluster, _config(tmp_path))
    _eventually(_trained_past(cluster, eid, EVERY), 120, cluster, "a first validation")
    cluster.procs[0].send_signal(signal.SIGKILL)
    cluster.procs[0].wait()
    time.sleep(down_s)  # the trial trains on; its reports wait and retry
    # The restarted master waits longer than an agent's longest reconnect delay (10 s
    # after 20 s away), as the default (30 s) does: a shorter wait requeues a live run.
    cluster.env["ASSAY_AGENT_RECONNECT_WAIT_S"] = "15"
    cluster.restart_master()
    _eventually(_state(cluster, eid, "COMPLETED", "ERROR"), 180, cluster, "the end")
    trial = _assert_clean_end(cluster, eid)
    # Re-adopted where it ran: the same run, no restart of the user's code.
    assert (trial["restarts"], trial["total_batches"]) == (0, BATCHES)
    assert cluster.json("trial", "describe", str(trial["id"]))["run_id"] == 1


def test_an_agent_killed_mid_trial_moves_the_trial_to_the_other_agent(
    two_agents: Cluster, tmp_path: Path
) -> None:
    cluster = two_agents
    eid = _create(cluster, _config(tmp_path))
    _eventually(_trained_past(cluster, eid, 2 * EVERY), 120, cluster, "two validations")
    busy = [s for s in cluster.json("slot", "list") if s["allocation_id"]]
    [slot] = busy
    victim = 1 + int(slot["agent_id"].removeprefix("agent"))
    cluster.procs[victim].send_signal(signal.SIGKILL)
    cluster.procs[victim].wait()
    _eventually(_state(cluster, eid, "COMPLETED", "ERROR"), 180, cluster, "the end")
    trial = _assert_clean_end(cluster, eid)
    assert trial["restarts"] == 0  # losing a machine is not the user's failure
    moved = [s for s in cluster.json("slot", "list")]
    assert all(s["agent_id"] != slot["agent_id"] for s in moved)
    log = cluster.cli("trial", "logs", str(trial["id"])).stdout
    assert "lost its agent; requeued (not a restart)" in log, log[-3000:]


def test_user_code_that_keeps_failing_runs_max_restarts_plus_one_times(
    two_agents: Cluster, tmp_path: Path
) -> None:
    # Each run fails with a line of its own (its pid): a failure that repeats the run
    # before it exactly ends sooner (tests/e2e/test_repeated_failures.py).
    cluster = two_agents
    config = _config(tmp_path, exit_at=3, exit_says_pid=True)
    data = yaml.safe_load(config.read_text())
    data["max_restarts"] = 2
    config.write_text(yaml.safe_dump(data))
    eid = _create(cluster, config)
    _eventually(_state(cluster, eid, "ERROR", "COMPLETED"), 180, cluster, "the end")
    described = _describe(cluster, eid)
    assert described["state"] == "ERROR"
    [trial] = described["trials"]
    assert (trial["state"], trial["restarts"]) == ("ERROR", 2)
    detail = cluster.json("trial", "describe", str(trial["id"]))
    assert detail["run_id"] == 3  # ran 3 times
    assert "code 7" in detail["last_error"], detail
    logs = cluster.cli("trial", "logs", str(trial["id"])).stdout
    failures = [line for line in logs.splitlines() if "assay: run" in line and "failed" in line]
    assert len(failures) == 3, logs[-3000:]
    assert all("code 7" in line for line in failures)
    assert "no restarts left" in failures[-1]
    assert all(not s["allocation_id"] for s in cluster.json("slot", "list"))


def test_pause_then_a_master_restart_then_activate_resumes_at_the_same_batch(
    two_agents: Cluster, tmp_path: Path
) -> None:
    cluster = two_agents
    eid = _create(cluster, _config(tmp_path))
    _eventually(_trained_past(cluster, eid, EVERY), 120, cluster, "a first validation")
    assert cluster.cli("experiment", "pause", str(eid)).returncode == 0
    _eventually(
        lambda: _describe(cluster, eid)["trials"][0]["state"] == "PAUSED",
        60,
        cluster,
        "the trial paused",
    )
    paused = _describe(cluster, eid)["trials"][0]
    stopped_at = paused["total_batches"]
    assert EVERY <= stopped_at < BATCHES
    checkpoints = cluster.json("checkpoint", "list", str(eid))
    assert max(c["total_batches"] for c in checkpoints) == stopped_at  # saved on the way out
    cluster.procs[0].send_signal(signal.SIGKILL)
    cluster.procs[0].wait()
    cluster.restart_master()
    _eventually(lambda: cluster.cli("master", "info").returncode == 0, 60, cluster, "master up")
    assert cluster.cli("experiment", "activate", str(eid)).returncode == 0
    _eventually(_state(cluster, eid, "COMPLETED", "ERROR"), 180, cluster, "the end")
    trial = _assert_clean_end(cluster, eid)
    assert trial["restarts"] == 0
    logs = cluster.cli("trial", "logs", str(trial["id"])).stdout
    assert f"batch {stopped_at}: train to batch {BATCHES}" in logs, logs[-3000:]
    training = cluster.json("trial", "metrics", str(trial["id"]), "--group", "training")
    batches = [int(r["total_batches"]) for r in training]
    assert batches == sorted(set(batches))  # no training report counted twice


def test_a_trial_kill_under_way_when_the_master_died_still_ends_the_trial(
    tmp_path: Path,
) -> None:
    """`trial kill` of one of two running trials; its agent is frozen (SIGSTOP) so the
    processes are not reported gone before the master is SIGKILLed. The restarted master
    finishes the kill (not a preemption): the trial ends CANCELED at run 1, the other
    completes, and the experiment ends COMPLETED with no slot left allocated."""
    from assay.client import Client

    # A reconnect window that outlasts the freeze: the old master must not give the frozen
    # agent up (which would end the trial as killed before the restart).
    env = {"ASSAY_AGENT_RECONNECT_WAIT_S": "15", "ASSAY_HEARTBEAT_INTERVAL_S": "1"}
    cluster = start_cluster(tmp_path, None, agents=2, slots=1, master_env=env)
    try:
        config = _config(tmp_path, sleep_s=0.05)  # 15 s of training per trial
        data = yaml.safe_load(config.read_text())
        data["searcher"]["name"] = "grid"
        data["hyperparameters"]["lr"] = {"type": "categorical", "vals": [0.01, 0.05]}
        config.write_text(yaml.safe_dump(data))
        eid = _create(cluster, config)

        def both_validated() -> bool:
            trials = _describe(cluster, eid)["trials"]
            return len(trials) == 2 and all(_validations(cluster, t["id"]) for t in trials)

        _eventually(both_validated, 120, cluster, "a validation of each trial")
        victim = min(t["id"] for t in _describe(cluster, eid)["trials"])
        [agent_id] = [
            s["agent_id"]
            for s in cluster.json("slot", "list")
            if s["allocation_id"].startswith(f"{victim}.")
        ]
        agent = cluster.procs[1 + int(agent_id.removeprefix("agent"))]
        agent.send_signal(signal.SIGSTOP)  # it cannot carry out the kill, nor report it
        try:
            client = Client(cluster.address, timeout=10)
            try:
                killed = client.kill_trial(victim)
            finally:
                client.close()
            assert killed.state == common_pb2.TRIAL_STATE_STOPPING  # recorded, not landed
            cluster.procs[0].send_signal(signal.SIGKILL)
            cluster.procs[0].wait()
            cluster.restart_master()
        finally:
            agent.send_signal(signal.SIGCONT)
        _eventually(_state(cluster, eid, "COMPLETED", "ERROR", "CANCELED"), 180, cluster, "the end")
        described = _describe(cluster, eid)
        # One trial killed of two: the search goes on and the experiment completes.
        assert described["state"] == "COMPLETED", cluster.dump_logs()
        trials = {t["id"]: t for t in described["trials"]}
        assert trials.pop(victim)["state"] == "CANCELED", cluster.dump_logs()
        # Killed where it ran: not requeued, no second run.
        assert cluster.json("trial", "describe", str(victim))["run_id"] == 1
        [other] = trials.values()
        assert (other["state"], other["total_batches"]) == ("COMPLETED", BATCHES)
        assert _validations(cluster, other["id"]) == list(range(EVERY, BATCHES + 1, EVERY))
        _eventually(
            lambda: all(not s["allocation_id"] for s in cluster.json("slot", "list")),
            30,
            cluster,
            "every slot free",
        )
    finally:
        stop_cluster(cluster)


def test_a_higher_priority_experiment_preempts_a_running_one_and_both_complete(
    tmp_path: Path,
) -> None:
    env = {"ASSAY_PREEMPTION": "true", "ASSAY_HEARTBEAT_INTERVAL_S": "1"}
    cluster = start_cluster(tmp_path, None, agents=1, slots=1, master_env=env)
    try:
        low_config = _config(tmp_path)
        data = yaml.safe_load(low_config.read_text())
        data["resources"]["priority"] = 60
        low_config.write_text(yaml.safe_dump(data))
        low = _create(cluster, low_config)
        _eventually(_trained_past(cluster, low, EVERY), 120, cluster, "a first validation")
        data.update(name="urgent", resources={"slots_per_trial": 1, "priority": 10})
        high_config = tmp_path / "high.yaml"
        high_config.write_text(yaml.safe_dump(data))
        high = _create(cluster, high_config)
        for eid in (high, low):
            _eventually(_state(cluster, eid, "COMPLETED", "ERROR"), 240, cluster, "the end")
            trial = _assert_clean_end(cluster, eid)
            assert trial["restarts"] == 0
        low_trial = _describe(cluster, low)["trials"][0]
        logs = cluster.cli("trial", "logs", str(low_trial["id"])).stdout
        assert "preempted for trial" in logs, logs[-3000:]
        assert cluster.json("trial", "describe", str(low_trial["id"]))["run_id"] == 2
    finally:
        stop_cluster(cluster)


def test_dropped_replies_to_metric_reports_duplicate_nothing(tmp_path: Path) -> None:
    env = {"ASSAY_FAULT_DROP_METRIC_REPLIES": "0.1", "ASSAY_HEARTBEAT_INTERVAL_S": "1"}
    cluster = start_cluster(tmp_path, None, agents=1, slots=1, master_env=env)
    try:
        config = _config(tmp_path)
        data = yaml.safe_load(config.read_text())
        data["scheduling_unit"] = 5  # 60 training reports: about 6 replies lost
        config.write_text(yaml.safe_dump(data))
        eid = _create(cluster, config)
        _eventually(_state(cluster, eid, "COMPLETED", "ERROR"), 240, cluster, "the end")
        trial = _assert_clean_end(cluster, eid)
        training = cluster.json("trial", "metrics", str(trial["id"]), "--group", "training")
        assert [int(r["total_batches"]) for r in training] == list(range(5, BATCHES + 1, 5))
        master_log = cluster.logs[0].read_text()
        assert trial["restarts"] == 0, master_log[-3000:]
    finally:
        stop_cluster(cluster)


class Proxy:
    """A TCP relay between an agent and the master that can be cut and restored."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self.resume()

    def resume(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        """Close the listener and every relayed connection: the agent sees the master gone."""
        with self._lock:
            sockets, self._sockets = self._sockets, []
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
            self._listener.close()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            with self._lock:
                self._sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)


def _agent(cluster: Cluster, tmp: Path, name: str, master: str) -> None:
    log = tmp / f"{name}.log"
    cluster.logs.append(log)
    cmd = [sys.executable, "-m", "assay.agent.main", "--master", master, "--slots", "1"]
    cmd += ["--slot-type", "cpu", "--agent-id", name, "--work-dir", str(tmp / name)]
    cluster.procs.append(
        subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=cluster.env)
    )


@pytest.mark.parametrize("cut_s", [2, 12])
def test_an_agent_cut_off_from_the_master(tmp_path: Path, cut_s: int) -> None:
    """Shorter than the window (5 s): nothing moves. Longer: the trial moves, once."""
    env = {"ASSAY_AGENT_RECONNECT_WAIT_S": "5", "ASSAY_HEARTBEAT_INTERVAL_S": "1"}
    cluster = start_cluster(tmp_path, None, agents=0, slots=1, master_env=env)
    proxy = Proxy(int(cluster.address.rsplit(":", 1)[1]))
    try:
        _agent(cluster, tmp_path, "agent0", f"127.0.0.1:{proxy.port}")  # behind the proxy
        _eventually(lambda: len(cluster.json("agent", "list")) == 1, 60, cluster, "agent0")
        eid = _create(cluster, _config(tmp_path, sleep_s=0.06))  # 18 s of training
        _eventually(_trained_past(cluster, eid, EVERY), 120, cluster, "a first validation")
        _agent(cluster, tmp_path, "agent1", cluster.address)  # a spare, reached directly
        _eventually(lambda: len(cluster.json("agent", "list")) == 2, 60, cluster, "agent1")
        proxy.cut()
        time.sleep(cut_s)
        proxy.resume()
        _eventually(_state(cluster, eid, "COMPLETED", "ERROR"), 240, cluster, "the end")
        trial = _assert_clean_end(cluster, eid)
        run_id = cluster.json("trial", "describe", str(trial["id"]))["run_id"]
        assert trial["restarts"] == 0
        assert run_id == (1 if cut_s < 5 else 2), cluster.dump_logs()
    finally:
        proxy.cut()
        stop_cluster(cluster)


def _loop_config(tmp: Path, name: str, **hparams: Any) -> Path:
    config = {**loop_config(**hparams), "name": name, "max_restarts": 0}
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_an_agent_shutting_down_gets_no_new_trials_and_its_trials_resume_later(
    tmp_path: Path,
) -> None:
    # `deploy local down` sends the agent SIGTERM: its trials stop at a checkpoint and are
    # requeued. One that stopped first used to be placed back on the agent while it
    # waited for the other, and its refusal counted as a failure (ERROR at
    # max_restarts: 0). Now the agent says it is shutting down, the master places
    # nothing on it, and both trials resume on the agent's next start, 0 restarts.
    cluster = start_cluster(tmp_path, None, agents=1, slots=2)
    try:
        quick = _loop_config(tmp_path, "quick", steps=400, every=1, sleep=0.02)
        slow = _loop_config(tmp_path, "slow", steps=100, every=25, sleep=0.1)
        eids = [
            int(cluster.json("experiment", "create", str(c), str(SCRIPTS))["id"])
            for c in (quick, slow)
        ]

        def validating(eid: int) -> Callable[[], bool]:
            def check() -> bool:
                trials = _describe(cluster, eid)["trials"]
                return bool(trials) and _validations(cluster, trials[0]["id"]) != []

            return check

        for eid in eids:
            _eventually(validating(eid), 120, cluster, f"experiment {eid} validating")
        agent = cluster.procs[1]
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=60) == 0, cluster.dump_logs()
        for eid in eids:
            [trial] = _describe(cluster, eid)["trials"]
            assert trial["state"] == "QUEUED", cluster.dump_logs()
            assert trial["restarts"] == 0
        _agent(cluster, tmp_path, "agent0", cluster.address)
        for eid in eids:
            _eventually(_state(cluster, eid, "COMPLETED", "ERROR"), 180, cluster, "the end")
            [trial] = _describe(cluster, eid)["trials"]
            assert trial["state"] == "COMPLETED", cluster.dump_logs()
            assert trial["restarts"] == 0
        master_log = cluster.logs[0].read_text()
        assert "agent agent0 is shutting down: nothing more is placed on it" in master_log
    finally:
        stop_cluster(cluster)
