"""End to end: the digits example on a master and two agents, through the CLI, on SQLite
and on PostgreSQL (one cluster per store, shared by the module's tests)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import ROOT, Cluster

EXAMPLE = "examples/digits"


def _create(cluster: Cluster, config: str) -> str:
    return str(cluster.json("experiment", "create", config, EXAMPLE)["id"])


def _wait(cluster: Cluster, experiment_id: str) -> dict[str, Any]:
    waited = cluster.cli("experiment", "wait", experiment_id, timeout=600)
    assert waited.returncode == 0, f"{waited.stdout}\n{waited.stderr}\n{cluster.dump_logs()}"
    described: dict[str, Any] = cluster.json("experiment", "describe", experiment_id)
    return described


@pytest.mark.slow
def test_digits_on_one_slot_two_slots_and_across_agents(cluster: Cluster, tmp_path: Path) -> None:
    spanning = yaml.safe_load((ROOT / EXAMPLE / "distributed.yaml").read_text())
    spanning["resources"]["slots_per_trial"] = 4  # 2 agents x 2 slots: gloo across agents
    spanning["name"] = "digits-4-slots"
    (tmp_path / "spanning.yaml").write_text(yaml.safe_dump(spanning))
    runs = [
        (f"{EXAMPLE}/const.yaml", 1),
        (f"{EXAMPLE}/distributed.yaml", 2),
        (str(tmp_path / "spanning.yaml"), 4),
    ]
    if cluster.db_url:
        # On PostgreSQL the run that spans both agents alone: the store's writes are those
        # of the smaller runs, four ranks' worth.
        runs = runs[-1:]
    # Submitted together: the 1-slot and 2-slot runs share the 4 slots, the one that spans
    # both agents starts when they are done.
    created = [(_create(cluster, config), slots) for config, slots in runs]
    for experiment_id, slots in created:
        described = _wait(cluster, experiment_id)
        assert described["state"] == "COMPLETED", cluster.dump_logs()
        [trial] = described["trials"]
        assert trial["total_batches"] == 400
        assert trial["best_validation"] >= 0.95
        assert trial["latest_checkpoint"]
        metrics = cluster.json("trial", "metrics", str(trial["id"]), "--group", "validation")
        assert [m["total_batches"] for m in metrics][-1] == 400
        training = cluster.json("trial", "metrics", str(trial["id"]), "--group", "training")
        assert len(training) == 8  # every 50 batches
        logs = cluster.cli("trial", "logs", str(trial["id"]))
        assert logs.returncode == 0
        assert "validation" in logs.stdout
        ranks = {
            line.split("]")[0] for line in logs.stdout.splitlines() if line.startswith("[rank")
        }
        assert "[rank 0" in ranks  # rank 0 reports; the others train silently
        assert len(ranks) <= slots
        checkpoints = cluster.json("checkpoint", "list", str(described["id"]))
        assert checkpoints


@pytest.mark.slow
def test_what_does_not_fit_waits_and_runs_when_slots_free(cluster: Cluster, tmp_path: Path) -> None:
    big = yaml.safe_load((ROOT / EXAMPLE / "distributed.yaml").read_text())
    big["resources"]["slots_per_trial"] = 4
    big["searcher"]["max_length"] = {"batches": 200}
    (tmp_path / "big.yaml").write_text(yaml.safe_dump(big))
    small = yaml.safe_load((ROOT / EXAMPLE / "const.yaml").read_text())
    small["searcher"]["max_length"] = {"batches": 100}
    (tmp_path / "small.yaml").write_text(yaml.safe_dump(small))
    first = cluster.json("experiment", "create", str(tmp_path / "big.yaml"), EXAMPLE)["id"]
    second = cluster.json("experiment", "create", str(tmp_path / "small.yaml"), EXAMPLE)["id"]
    # The 4-slot trial holds every slot, so the 1-slot one waits in the queue.
    waiting = cluster.json("experiment", "describe", str(second))
    assert waiting["trials"][0]["state"] == "QUEUED"
    for experiment_id in (first, second):
        done = cluster.cli("experiment", "wait", str(experiment_id), timeout=600)
        assert done.returncode == 0, cluster.dump_logs()
