"""End to end: population-based training on a real master and two agents.

Four trials of the regression fixture train three rounds of 4 batches; after rounds 0 and
1 the worst trial is closed and replaced by a copy of the best, which starts from the best
one's checkpoint. The searched hyperparameter does not change training (only `lr` does,
and it is constant; dropout is 0 and the data are not shuffled), so a copy that really
continues its parent's weights, optimizer state and data position validates exactly as
its parent does at the end of the next round. A copy that started over would not.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from assay.cli._client import Client
from tests.conftest import REGRESSION_DIR, regression_config
from tests.e2e.conftest import Cluster, start_cluster, stop_cluster

pytestmark = pytest.mark.slow

WAIT_S = 480
ROUND = 4


@pytest.fixture(scope="module")
def pbt_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = start_cluster(tmp_path_factory.mktemp("pbt"), None, agents=2, slots=1)
    try:
        yield cluster
    finally:
        stop_cluster(cluster)


@pytest.fixture(scope="module")
def api(pbt_cluster: Cluster) -> Iterator[Client]:
    """Reads in this process (a CLI process takes a second or more to start)."""
    client = Client(pbt_cluster.address)
    yield client
    client.close()


def _validations(api: Client, trial_id: int) -> dict[int, float]:
    reports = api.get_trial_metrics(trial_id, "validation").reports
    return {int(r.total_batches): float(r.metrics["val_loss"]) for r in reports}


def _training_batches(api: Client, trial_id: int) -> list[int]:
    return [int(r.total_batches) for r in api.get_trial_metrics(trial_id, "training").reports]


@pytest.mark.timeout(WAIT_S + 120)
def test_pbt_copies_the_best_checkpoint_and_records_the_lineage(
    pbt_cluster: Cluster, api: Client, tmp_path: Path
) -> None:
    cluster = pbt_cluster
    config: dict[str, Any] = regression_config(batches=ROUND, global_batch_size=8)
    config["hyperparameters"]["unused"] = {"type": "double", "minval": 0.1, "maxval": 0.9}
    config["searcher"] = {
        "name": "pbt",
        "metric": "val_loss",
        "population_size": 4,
        "num_rounds": 3,
        "length_per_round": {"batches": ROUND},
        "replace_function": {"truncate_fraction": 0.25},
        "explore_function": {"resample_probability": 0.5, "perturb_factor": 0.2},
    }
    path = tmp_path / "pbt.yaml"
    path.write_text(yaml.safe_dump(config))
    plan = cluster.json("preview-search", str(path))
    assert [r["new_trials"] for r in plan["rounds"]] == [4, 1, 1]

    experiment_id = str(cluster.json("experiment", "create", str(path), str(REGRESSION_DIR))["id"])
    waited = cluster.cli(
        "experiment", "wait", experiment_id, "--timeout", str(WAIT_S), timeout=WAIT_S + 60
    )
    assert waited.returncode == 0, f"{waited.stdout}\n{waited.stderr}\n{cluster.dump_logs()}"
    described: dict[str, Any] = cluster.json("experiment", "describe", experiment_id)
    assert described["state"] == "COMPLETED", cluster.dump_logs()
    trials = {int(t["id"]): t for t in described["trials"]}
    assert len(trials) == 6, trials
    assert all(t["state"] == "COMPLETED" for t in trials.values()), trials

    first = sorted(trials)[:4]
    copies = sorted(trials)[4:]
    assert all(trials[t]["parent_trial_id"] is None for t in first)
    assert [trials[t]["search_round"] for t in copies] == [1, 2]
    for copy_id in copies:
        copy = trials[copy_id]
        parent_id = copy["parent_trial_id"]
        assert parent_id in trials, copy
        assert parent_id < copy_id, copy
        start = copy["search_round"] * ROUND  # where its parent paused
        parent = _validations(api, parent_id)
        # The parent was the best of its round.
        round_values = [v for t in trials for b, v in _validations(api, t).items() if b == start]
        assert parent[start] == min(round_values)
        # The copy trained on from the parent's batch count, never from 0 ...
        training = _training_batches(api, copy_id)
        assert training, copy
        assert min(training) > start, training
        own = _validations(api, copy_id)
        assert min(own) == start + ROUND, own
        # ... and from its weights: both trained the same next round from one checkpoint.
        assert own[start + ROUND] == pytest.approx(parent[start + ROUND], rel=1e-6)
        detail = cluster.json("trial", "describe", str(copy_id))
        assert (detail["parent_trial_id"], detail["search_round"]) == (
            parent_id,
            copy["search_round"],
        )
        logs = cluster.cli("trial", "logs", str(copy_id)).stdout
        assert f"of trial {parent_id} at batch {start}" in logs, logs
    # Survivors and copies all reached the last round's length.
    assert sum(t["total_batches"] == 3 * ROUND for t in trials.values()) == 4
