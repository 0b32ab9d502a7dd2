"""Resource pools on a real cluster: 3 agent processes in 2 pools (agent0 and agent1 in
`default`, agent2 in `gpu` with label a100). Trials run only in their pool and on agents
with their label; a drained agent lets its running trial finish and takes no new one; an
agent naming a pool the master does not declare exits saying which pools exist."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REGRESSION_DIR, regression_config
from tests.e2e.conftest import ROOT, Cluster, start_cluster, stop_cluster

pytestmark = pytest.mark.slow

POOLS = "[{name: default, description: CPU boxes}, {name: gpu, description: labelled boxes}]"
GPU = {"resource_pool": "gpu", "agent_label": "a100"}


def _create(
    cluster: Cluster, tmp: Path, name: str, resources: dict[str, str] | None = None, slots: int = 1
) -> int:
    config: dict[str, Any] = regression_config(batches=100, slots=slots, sleep_s=0.01)
    config["resources"].update(resources or {})
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    created = cluster.json("experiment", "create", str(path), str(REGRESSION_DIR))
    return int(created["id"])


def _eventually(check: Callable[[], bool], cluster: Cluster, what: str, wait: float = 60) -> None:
    deadline = time.monotonic() + wait
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached in {wait:.0f} s:\n{cluster.dump_logs()}")
        time.sleep(0.3)


def _state(cluster: Cluster, eid: int) -> str:
    return str(cluster.json("experiment", "describe", str(eid))["state"])


def _trial(cluster: Cluster, eid: int) -> dict[str, Any]:
    [trial] = cluster.json("experiment", "describe", str(eid))["trials"]
    return dict(trial)


def _starts(cluster: Cluster) -> dict[str, int]:
    """How many allocations each agent started, from its own log."""
    return {log.stem: log.read_text().count("starting allocation") for log in cluster.logs[1:]}


def test_pools_labels_and_drain_on_a_real_cluster(tmp_path: Path) -> None:
    env = {"ASSAY_RESOURCE_POOLS": POOLS, "ASSAY_HEARTBEAT_INTERVAL_S": "1"}
    gpu_agent = ["--resource-pool", "gpu", "--agent-label", "a100"]
    cluster = start_cluster(
        tmp_path, None, agents=3, slots=1, master_env=env, agent_args=[[], [], gpu_agent]
    )
    try:
        pools = {p["name"]: p for p in cluster.json("resource-pool", "list")}
        assert sorted(pools["default"]["agents"]) == ["agent0", "agent1"]
        assert pools["gpu"]["agents"] == ["agent2"]
        assert pools["gpu"]["description"] == "labelled boxes"

        # A gang of 2 on three idle 1-slot agents: only the default pool's two may take it.
        gang = _create(cluster, tmp_path, "gang", slots=2)
        labelled = _create(cluster, tmp_path, "labelled", GPU)
        v100 = _create(cluster, tmp_path, "v100", {"resource_pool": "gpu", "agent_label": "v100"})
        _eventually(lambda: _trial(cluster, labelled)["state"] == "RUNNING", cluster, "a100 runs")
        drained = cluster.cli("agent", "disable", "--drain", "agent2")
        assert drained.returncode == 0, drained.stderr
        assert drained.stdout.strip() == "agent agent2 draining (1 slot busy)"
        listed = cluster.cli("agent", "list")
        [row] = [line for line in listed.stdout.splitlines() if line.startswith("agent2")]
        assert row.split()[4:8] == ["gpu", "a100", "yes", "draining"]
        later = _create(cluster, tmp_path, "later", GPU)

        _eventually(lambda: _state(cluster, gang) == "COMPLETED", cluster, "the gang ends")
        _eventually(lambda: _state(cluster, labelled) == "COMPLETED", cluster, "a100 ends")
        # The drained agent finished its trial and took no other.
        assert _trial(cluster, later)["state"] == "QUEUED"
        assert _trial(cluster, v100)["waiting"] == (
            "pool gpu: needs 1 CPU slot; no CPU agent with label 'v100' is connected"
        )
        assert _starts(cluster) == {"agent0": 1, "agent1": 1, "agent2": 1}
        [agent2] = [a for a in cluster.json("agent", "list") if a["id"] == "agent2"]
        assert (agent2["enabled"], agent2["draining"], agent2["used_slots"]) == (False, True, 0)
        queued = {p["name"]: p["queued_trials"] for p in cluster.json("resource-pool", "list")}
        assert queued == {"default": 0, "gpu": 2}

        # An agent naming a pool the master does not declare is refused, and exits.
        stray = subprocess.run(
            [
                sys.executable,
                "-m",
                "assay.agent.main",
                "--master",
                cluster.address,
                "--slot-type",
                "cpu",
                "--agent-id",
                "stray",
                "--work-dir",
                str(tmp_path / "stray"),
                "--resource-pool",
                "tpu",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
            check=False,
        )
        assert stray.returncode == 3, stray.stderr
        assert (
            "assay-agent: error: the master refused this agent: agent 'stray' names resource "
            "pool 'tpu', which this master does not declare: set the agent's resource_pool to "
            "one of default, gpu"
        ) in stray.stderr
        for eid in (v100, later):
            cluster.cli("experiment", "kill", str(eid))
    finally:
        stop_cluster(cluster)
