"""Fault injection on a real cluster: processes are killed with SIGKILL mid-trial.

Each scenario asserts what a user needs: the experiment ends as it should, every
validation the searcher asked for is stored exactly once, and no slot stays allocated.
The trial is the regression fixture with slow steps (20 ms), validating and
checkpointing every 50 batches, so each kill lands in the middle of training.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REGRESSION_DIR, regression_config
from tests.e2e.conftest import Cluster, start_cluster, stop_cluster

BATCHES = 300
EVERY = 50

pytestmark = pytest.mark.slow


def _config(tmp: Path, **hparams: Any) -> Path:
    config = regression_config(
        batches=BATCHES,
        scheduling_unit=25,
        validation_period=EVERY,
        checkpoint_period=EVERY,
        sleep_s=0.02,
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
    cluster = two_agents
    config = _config(tmp_path, exit_at=3)
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
