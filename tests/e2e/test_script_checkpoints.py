"""End to end: a Core API script's checkpoints carry the validation at their batch and the
metadata they were stored with, on a real master and agents (SQLite and PostgreSQL).

The script reports vloss 0.5, 0.1, 0.9, 0.8 at steps 10-40 and stores a checkpoint at
each, the validation before the checkpoint or after it. Garbage collection must keep the
best one (batch 20); `checkpoint list`, `trial download --best`, `experiment wait`'s best
checkpoint and `checkpoint describe` must all see its validation and its metadata.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import Cluster

pytestmark = pytest.mark.slow

WAIT_S = 300
LOSSES = {10: 0.5, 20: 0.1, 30: 0.9, 40: 0.8}

SCRIPT = """\
import assay, assay.core

info = assay.get_cluster_info()
first = info.trial.hparams["validation_first"]
losses = {10: 0.5, 20: 0.1, 30: 0.9, 40: 0.8}
with assay.core.init() as core:
    for step in (10, 20, 30, 40):
        metrics = {"vloss": losses[step]}
        if first:
            core.train.report_validation_metrics(steps_completed=step, metrics=metrics)
        with core.checkpoint.store_path({"note": "up", "steps_completed": step}) as (path, uuid):
            (path / "state.txt").write_text(str(step))
        if not first:
            core.train.report_validation_metrics(steps_completed=step, metrics=metrics)
"""


def _experiment(cluster: Cluster, tmp: Path, validation_first: bool, best: int, latest: int) -> str:
    model = tmp / f"model-{validation_first}"
    model.mkdir()
    (model / "train.py").write_text(SCRIPT)
    config = {
        "name": "gc-best",
        "entrypoint": "python3 train.py",
        "hyperparameters": {"validation_first": validation_first},
        "searcher": {"name": "single", "metric": "vloss", "max_length": {"batches": 40}},
        "checkpoint_storage": {"save_trial_best": best, "save_trial_latest": latest},
        "max_restarts": 0,
    }
    path = model / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(cluster.json("experiment", "create", str(path), str(model))["id"])


def _wait(cluster: Cluster, eid: str) -> dict[str, Any]:
    done = cluster.cli(
        "experiment", "wait", eid, "--timeout", str(WAIT_S), "--json", timeout=WAIT_S + 60
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{cluster.dump_logs()}"
    summary: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return summary


@pytest.mark.parametrize(
    ("validation_first", "best", "latest", "kept"),
    [(True, 1, 1, {20, 40}), (False, 2, 0, {10, 20})],
    ids=["validation-first-best1-latest1", "checkpoint-first-best2-latest0"],
)
def test_script_checkpoints_are_kept_and_shown_by_their_validation(
    cluster: Cluster,
    tmp_path: Path,
    validation_first: bool,
    best: int,
    latest: int,
    kept: set[int],
) -> None:
    eid = _experiment(cluster, tmp_path, validation_first, best, latest)
    summary = _wait(cluster, eid)
    assert summary["state"] == "COMPLETED", cluster.dump_logs()
    assert summary["best_validation"] == 0.1

    every = cluster.json("checkpoint", "list", eid, "--all")
    by_batches = {c["total_batches"]: c for c in every}
    assert sorted(by_batches) == [10, 20, 30, 40]
    states = {b: c["state"] for b, c in by_batches.items()}
    assert states == {b: "COMPLETED" if b in kept else "DELETED" for b in LOSSES}
    for batches, c in by_batches.items():
        assert c["validation_metrics"] == {"vloss": LOSSES[batches]}
    best_uuid = by_batches[20]["uuid"]
    assert summary["best_checkpoint"] == best_uuid

    table = cluster.cli("checkpoint", "list", eid)
    assert table.returncode == 0, table.stderr
    [row] = [line for line in table.stdout.splitlines() if line.startswith(best_uuid)]
    assert "vloss=0.1" in row

    trial_id = str(by_batches[20]["trial_id"])
    target = tmp_path / "best"
    downloaded = cluster.cli("trial", "download", trial_id, str(target), "--best")
    assert downloaded.returncode == 0, downloaded.stderr
    assert best_uuid in downloaded.stdout
    assert "batch 20" in downloaded.stdout
    assert (target / "state.txt").read_text() == "20"

    described = cluster.json("checkpoint", "describe", best_uuid)
    assert described["user_metadata"] == {"note": "up", "steps_completed": 20}
    assert described["validation_metrics"] == {"vloss": 0.1}
    text = cluster.cli("checkpoint", "describe", best_uuid)
    assert text.returncode == 0, text.stderr
    [shown] = [line for line in text.stdout.splitlines() if line.startswith("Metadata:")]
    assert sorted(shown.removeprefix("Metadata:").strip().split(", ")) == [
        "note=up",
        "steps_completed=20",
    ]
    assert "Validation:      vloss=0.1" in text.stdout
