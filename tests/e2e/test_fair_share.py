"""Fair share on a real cluster: two experiments of weights 1 and 3 in a fair_share pool of
4 CPU slots (two agents of 2) converge to 1 and 3 slots; `experiment set max-slots` caps
one at once, and `job list` says why its trials wait."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REGRESSION_DIR, regression_config
from tests.e2e.conftest import Cluster, start_cluster, stop_cluster

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fair_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    env = {
        "ASSAY_RESOURCE_POOLS": "[{name: default, scheduler: fair_share}]",
        "ASSAY_PREEMPTION": "true",
        "ASSAY_HEARTBEAT_INTERVAL_S": "1",
    }
    cluster = start_cluster(
        tmp_path_factory.mktemp("fair"), None, agents=2, slots=2, master_env=env
    )
    try:
        yield cluster
    finally:
        stop_cluster(cluster)


def _create(cluster: Cluster, tmp: Path, name: str, weight: float, trials: int) -> int:
    config = regression_config(batches=400, sleep_s=0.03, checkpoint_period=8)
    config["name"] = name
    config["searcher"] = {
        "name": "random",
        "metric": "val_loss",
        "max_trials": trials,
        "max_concurrent_trials": trials,
        "max_length": {"batches": 400},
    }
    config["hyperparameters"]["lr"] = {"type": "double", "minval": 0.01, "maxval": 0.1}
    config["resources"]["weight"] = weight
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return int(cluster.json("experiment", "create", str(path), str(REGRESSION_DIR))["id"])


def _held(cluster: Cluster, experiments: dict[int, set[int]]) -> dict[int, int]:
    """Slots held now by each experiment (trial ids looked up once per experiment)."""
    slots: list[dict[str, Any]] = cluster.json("slot", "list")
    held = dict.fromkeys(experiments, 0)
    for slot in slots:
        for eid, trials in experiments.items():
            if slot["trial_id"] in trials:
                held[eid] += 1
    return held


def _trials(cluster: Cluster, eid: int) -> set[int]:
    return {t["id"] for t in cluster.json("experiment", "describe", str(eid))["trials"]}


def test_two_experiments_converge_to_their_weights_and_max_slots_holds(
    fair_cluster: Cluster, tmp_path: Path
) -> None:
    cluster = fair_cluster
    light = _create(cluster, tmp_path, "light", 1.0, 6)  # first: it takes all 4 slots
    time.sleep(1.0)
    heavy = _create(cluster, tmp_path, "heavy", 3.0, 6)
    ids = {light: _trials(cluster, light), heavy: _trials(cluster, heavy)}
    deadline = time.monotonic() + 40
    seen: list[dict[int, int]] = []
    while time.monotonic() < deadline:
        held = _held(cluster, ids)
        seen.append(held)
        if held == {light: 1, heavy: 3}:
            break
        time.sleep(0.3)
    else:
        raise AssertionError(
            f"no convergence to 1 and 3 slots: {seen[-10:]}\n{cluster.dump_logs()}"
        )
    jobs = cluster.json("job", "list")
    assert jobs, "both experiments still have queued trials"
    assert [j["position"] for j in jobs] == list(range(1, len(jobs) + 1))
    assert {j["wait_kind"] for j in jobs} <= {"share", "no_free_slots", "priority"}

    # A live cap: heavy may hold 2 at most from now on; the slot it gives up goes to light.
    done = cluster.cli("experiment", "set", "max-slots", str(heavy), "2")
    assert done.returncode == 0, done.stderr
    assert f"experiment {heavy}: max-slots is now 2" in done.stdout
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        held = _held(cluster, ids)
        if held[heavy] <= 2 and held[light] == 2:
            break
        time.sleep(0.3)
    else:
        raise AssertionError(f"max_slots 2 not reached: {held}\n{cluster.dump_logs()}")
    for _ in range(5):  # and it holds: nothing places a third trial of heavy
        assert _held(cluster, ids)[heavy] <= 2
        time.sleep(0.3)
    waits = {j["experiment_id"]: j for j in cluster.json("job", "list")}
    assert waits[heavy]["wait_kind"] == "max_slots", waits
    assert "max_slots 2" in waits[heavy]["waiting"]

    bad = cluster.cli("experiment", "set", "weight", str(heavy), "0")
    assert bad.returncode == 1
    assert "error: weight must be a number from 0.001 to 1e+06, got 0" in bad.stderr
    for eid in (light, heavy):
        cluster.cli("experiment", "kill", str(eid))
