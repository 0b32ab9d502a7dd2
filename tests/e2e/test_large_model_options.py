"""On a real cluster: a 2-slot trial with activation checkpointing and `mixed_precision:
auto` trains, and each rank's peak memory and step time reach the master in the `system`
metric group, read back through the CLI."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.conftest import REGRESSION_DIR, regression_config
from tests.e2e.conftest import Cluster, start_cluster, stop_cluster

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def two_slots(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = start_cluster(tmp_path_factory.mktemp("large"), None, agents=1, slots=2)
    try:
        yield cluster
    finally:
        stop_cluster(cluster)


def test_a_trial_reports_every_ranks_memory_and_step_time(
    two_slots: Cluster, tmp_path: Path
) -> None:
    config = regression_config(batches=8, scheduling_unit=4, slots=2, precision="auto")
    config["optimizations"]["activation_checkpointing"] = ["Linear"]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    eid = int(two_slots.json("experiment", "create", str(path), str(REGRESSION_DIR))["id"])
    deadline = time.monotonic() + 240
    while (described := two_slots.json("experiment", "describe", str(eid)))["state"] not in (
        "COMPLETED",
        "ERROR",
    ):
        assert time.monotonic() < deadline, two_slots.dump_logs()
        time.sleep(0.5)
    assert described["state"] == "COMPLETED", two_slots.dump_logs()
    [trial] = described["trials"]
    rows = two_slots.json("trial", "metrics", str(trial["id"]), "--group", "system")
    assert [r["total_batches"] for r in rows] == [4, 8]
    for row in rows:
        assert set(row["metrics"]) == {
            f"{name}/rank_{rank}" for name in ("memory_peak_mb", "step_time_ms") for rank in (0, 1)
        }
        assert all(value > 0 for value in row["metrics"].values())
    training = two_slots.json("trial", "metrics", str(trial["id"]), "--group", "training")
    assert all(not name.startswith("memory") for r in training for name in r["metrics"])
    logs = two_slots.cli("trial", "logs", str(trial["id"])).stdout
    assert "mixed_precision auto: off on cpu" in logs
