"""A multi-objective search on a real cluster: every trial's validation vector reaches the
searcher, and the experiment reports a Pareto front that nothing dominates."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from assay.master.searcher._multi import dominates
from assay.master.store import Store
from tests.conftest import REGRESSION_DIR, regression_config
from tests.e2e.conftest import Cluster, start_cluster, stop_cluster

pytestmark = pytest.mark.slow

WAIT_S = 300
TRIALS = 4


@pytest.fixture(scope="module")
def mo_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = start_cluster(tmp_path_factory.mktemp("multi"), None, agents=1, slots=2)
    try:
        yield cluster
    finally:
        stop_cluster(cluster)


def _create(cluster: Cluster, tmp: Path, searcher: dict[str, Any]) -> int:
    config = regression_config(batches=4, global_batch_size=8, report_weight_norm=True)
    config["hyperparameters"]["lr"] = {"type": "log", "minval": -3, "maxval": -0.5}
    config["searcher"] = searcher
    path = tmp / "multi.yaml"
    path.write_text(yaml.safe_dump(config))
    return int(cluster.json("experiment", "create", str(path), str(REGRESSION_DIR))["id"])


def _wait(cluster: Cluster, eid: int) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_S
    while True:
        described: dict[str, Any] = cluster.json("experiment", "describe", str(eid))
        if described["state"] in ("COMPLETED", "ERROR", "CANCELED"):
            return described
        if time.monotonic() > deadline:
            raise AssertionError(f"experiment {eid} did not end:\n{cluster.dump_logs()}")
        time.sleep(0.5)


@pytest.mark.timeout(WAIT_S + 120)
def test_tpe_search_on_two_metrics_reports_a_non_dominated_front(
    mo_cluster: Cluster, tmp_path: Path
) -> None:
    cluster = mo_cluster
    # The first metric (the searcher metric wherever one is used) is larger-is-better.
    metrics = [
        {"name": "weight_norm", "smaller_is_better": False},
        {"name": "val_loss", "smaller_is_better": True},
    ]
    searcher = {
        "name": "random",
        "sampler": "tpe",
        "metrics": metrics,
        "max_trials": TRIALS,
        "max_concurrent_trials": 2,
        "max_length": {"batches": 4},
    }
    eid = _create(cluster, tmp_path, searcher)
    described = _wait(cluster, eid)
    assert described["state"] == "COMPLETED", cluster.dump_logs()

    assert described["objectives"] == metrics
    points = described["pareto_points"]
    assert sorted(p["trial_id"] for p in points) == sorted(t["id"] for t in described["trials"])
    assert len(points) == TRIALS
    # Each point is the trial's final validation, as stored.
    for p in points:
        rows = cluster.json("trial", "metrics", str(p["trial_id"]), "--group", "validation")
        last = max(rows, key=lambda r: int(r["total_batches"]))
        assert p["total_batches"] == 4
        assert p["values"] == pytest.approx(
            [last["metrics"]["weight_norm"], last["metrics"]["val_loss"]]
        )
    # The front: exactly the points no other point dominates (weight_norm larger-is-better).
    oriented = {p["trial_id"]: [-p["values"][0], p["values"][1]] for p in points}
    front = set(described["pareto_front"])
    assert front
    for t, v in oriented.items():
        dominated = any(dominates(w, v) for u, w in oriented.items() if u != t)
        assert (t in front) == (not dominated), (t, oriented)
    assert all((p["rank"] == 0) == p["on_front"] for p in points)

    # The searcher learnt every trial's vector (its snapshot's history, oriented).
    store = Store.open(f"sqlite:///{cluster.state_dir / 'assay.db'}", migrate_schema=False)
    try:
        state = store.get_experiment(eid).searcher_state
    finally:
        store.close()
    assert state is not None
    learnt = [e["value"] for e in state["searcher"]["sampler"]["history"].values()]
    expected = sorted(oriented.values())
    assert len(learnt) == len(expected)
    for got, want in zip(sorted(learnt), expected, strict=True):
        assert got == pytest.approx(want)

    text = cluster.cli("experiment", "describe", str(eid)).stdout
    assert "Pareto front (weight_norm higher is better, val_loss lower is better): trial" in text
    assert all(math.isfinite(v) for p in points for v in p["values"])
    # The experiment's best is the first metric's, in its direction.
    listed = {e["id"]: e for e in cluster.json("experiment", "list")}
    assert listed[eid]["best_validation"] == pytest.approx(max(p["values"][0] for p in points))


def test_asha_with_several_metrics_is_refused_before_anything_runs(
    mo_cluster: Cluster, tmp_path: Path
) -> None:
    config = regression_config(batches=4, report_weight_norm=True)
    config["searcher"] = {
        "name": "asha",
        "metrics": [{"name": "val_loss"}, {"name": "weight_norm"}],
        "max_trials": 4,
        "max_length": {"batches": 4},
    }
    path = tmp_path / "asha.yaml"
    path.write_text(yaml.safe_dump(config))
    result = mo_cluster.cli("experiment", "create", str(path), str(REGRESSION_DIR))
    assert result.returncode != 0
    assert "searcher.metrics: the asha searcher takes one metric" in result.stderr
    assert "early stopping" in result.stderr
