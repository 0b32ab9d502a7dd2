"""End to end: the digits example on a master and two agents, through the CLI."""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.conftest import Cluster

EXAMPLE = "examples/digits"


def _run(cluster: Cluster, config: str, *extra: str) -> dict[str, Any]:
    created = cluster.json("experiment", "create", f"{EXAMPLE}/{config}", EXAMPLE, *extra)
    experiment_id = str(created["id"])
    waited = cluster.cli("experiment", "wait", experiment_id, timeout=600)
    assert waited.returncode == 0, f"{waited.stdout}\n{waited.stderr}\n{cluster.dump_logs()}"
    described: dict[str, Any] = cluster.json("experiment", "describe", experiment_id)
    return described


@pytest.mark.slow
def test_digits_on_one_slot_two_slots_and_across_agents(cluster: Cluster, tmp_path: object) -> None:
    for config, slots in (("const.yaml", 1), ("distributed.yaml", 2)):
        described = _run(cluster, config)
        assert described["state"] == "COMPLETED"
        [trial] = described["trials"]
        assert trial["total_batches"] == 400
        assert trial["best_validation"] >= 0.95
        assert trial["latest_checkpoint"]
        metrics = cluster.json("trial", "metrics", str(trial["id"]), "--group", "validation")
        assert [m["total_batches"] for m in metrics][-1] == 400
        logs = cluster.cli("trial", "logs", str(trial["id"]))
        assert logs.returncode == 0
        assert "validation" in logs.stdout
        checkpoints = cluster.json("checkpoint", "list", str(described["id"]))
        assert checkpoints
        del slots
