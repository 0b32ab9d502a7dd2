"""An FSDP trial on a real cluster: 2 slots on 2 agents (1 slot each), paused and resumed.

The trial pauses mid-run (its checkpoint waits for the accumulation's boundary), resumes
on the cluster and completes; the paused checkpoint, downloaded, also continues on one
slot. Both continuations end on the same weights (the trial's seed, given by the
cluster, decides its initial weights). Its checkpoints are sharded: each of the two
ranks, on its own agent, wrote its own shard of the model and optimizer, and the chief's
manifest lists both with their sha256s.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

import assay
from tests.conftest import REGRESSION_DIR, regression_config
from tests.e2e.conftest import Cluster, start_cluster, stop_cluster

pytestmark = pytest.mark.slow

BATCHES = 120
AGGREGATION = 2
TOL = 1e-5


def _config(slots: int) -> dict[str, Any]:
    config = regression_config(
        batches=BATCHES,
        slots=slots,
        aggregation=AGGREGATION,
        scheduling_unit=20,
        validation_period=40,
        checkpoint_period=40,
        sleep_s=0.05,
    )
    config["optimizations"]["strategy"] = "fsdp"
    config["optimizations"]["fsdp"] = {"wrap": ["Linear"]}
    return config


def _eventually(check: Callable[[], bool], timeout: float, cluster: Cluster, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached in {timeout:.0f} s:\n{cluster.dump_logs()}")
        time.sleep(0.5)


def _trial(cluster: Cluster, eid: int) -> dict[str, Any]:
    trials = cluster.json("experiment", "describe", str(eid))["trials"]
    return dict(trials[0]) if trials else {}


def _latest(cluster: Cluster, eid: int) -> dict[str, Any]:
    checkpoints = cluster.json("checkpoint", "list", str(eid))
    return dict(max(checkpoints, key=lambda c: c["total_batches"]))


def _weights(directory: Path) -> dict[str, torch.Tensor]:
    """The model's full weights (gathered from the shards of a sharded checkpoint)."""
    return dict(assay.load_checkpoint(directory).models[0])


def _check_sharded_on_two_ranks(directory: Path) -> None:
    """`directory` holds the model and optimizer as 2 ranks' shards, each listed with its
    sha256 in `shards.json` and in the checkpoint's manifest, and no full state dicts."""
    from assay._checkpoint import verify_checkpoint

    metadata = verify_checkpoint(directory)
    assert (metadata.strategy, metadata.world_size) == ("fsdp", 2)
    assert "models.pt" not in metadata.files
    shards = json.loads((directory / "model-000" / "shards.json").read_text())
    assert shards["world_size"] == 2
    assert set(shards["files"]) == {"__0_0.distcp", "__1_0.distcp", ".metadata"}
    for name, entry in shards["files"].items():
        data = (directory / "model-000" / name).read_bytes()
        assert entry["sha256"] == hashlib.sha256(data).hexdigest()
        assert metadata.files[f"model-000/{name}"].sha256 == entry["sha256"]


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.fixture
def two_agents(tmp_path: Path) -> Iterator[Cluster]:
    cluster = start_cluster(tmp_path, None, agents=2, slots=1)
    try:
        yield cluster
    finally:
        stop_cluster(cluster)


def test_fsdp_across_two_agents_pauses_resumes_and_continues_on_one_slot(
    two_agents: Cluster, tmp_path: Path
) -> None:
    cluster = two_agents
    config = tmp_path / "fsdp.yaml"
    config.write_text(yaml.safe_dump(_config(slots=2)))
    eid = int(cluster.json("experiment", "create", str(config), str(REGRESSION_DIR))["id"])
    _eventually(lambda: _trial(cluster, eid).get("total_batches", 0) >= 30, 180, cluster, "30")
    agents = {s["agent_id"] for s in cluster.json("slot", "list") if s["allocation_id"]}
    assert len(agents) == 2  # the two ranks run on different agents
    assert cluster.cli("experiment", "pause", str(eid)).returncode == 0
    _eventually(lambda: _trial(cluster, eid).get("state") == "PAUSED", 120, cluster, "paused")
    paused = _latest(cluster, eid)
    stopped_at = int(paused["total_batches"])
    assert 30 <= stopped_at < BATCHES
    assert stopped_at % AGGREGATION == 0  # the preemption waited for the boundary

    downloaded = tmp_path / "paused"
    done = cluster.cli("checkpoint", "download", paused["uuid"], str(downloaded))
    assert done.returncode == 0, done.stderr
    _check_sharded_on_two_ranks(downloaded)
    # The paused checkpoint continues on one slot (no wrapper) to the same weights.
    one = assay.run_local(
        config=_config(slots=1),
        model_dir=REGRESSION_DIR,
        checkpoint_dir=tmp_path / "one",
        resume_from=downloaded,
    )
    assert one.total_batches == BATCHES
    assert one.checkpoint is not None

    # And on the cluster, on its two agents again.
    assert cluster.cli("experiment", "activate", str(eid)).returncode == 0
    _eventually(
        lambda: cluster.json("experiment", "describe", str(eid))["state"] == "COMPLETED",
        240,
        cluster,
        "completed",
    )
    final = _latest(cluster, eid)
    assert int(final["total_batches"]) == BATCHES
    end = tmp_path / "final"
    done = cluster.cli("checkpoint", "download", final["uuid"], str(end), "--full")
    assert done.returncode == 0, done.stderr
    _check_sharded_on_two_ranks(end)
    # --full: the plain state dict gathered from the shards, beside them.
    full = torch.load(end / "model-000" / "full_state_dict.pt", weights_only=True)
    assert _max_diff(full["model"], _weights(end)) == 0.0
    # The resumed run continued from the paused checkpoint: it restored it (the log says
    # which) and ends on the weights that the one-slot continuation of it ends on.
    logs = cluster.cli("trial", "logs", str(_trial(cluster, eid)["id"])).stdout
    restored = f"restored checkpoint {paused['uuid']} at batch {stopped_at} (taken on 2 slots"
    assert restored in logs, logs[-3000:]
    assert _max_diff(_weights(end), _weights(Path(one.checkpoint))) <= TOL
