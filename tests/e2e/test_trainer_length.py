"""End to end: how long a Trainer-API script trains on a cluster and under run-local.

The script calls `fit(max_length=Epoch(2))` (90 batches); its config says 20 batches. On
a real master with two one-slot agents, as under `assay trial run-local`, the searcher's
20 decide on one slot and on two, and rank 0 logs once that fit's length is ignored. A
config without `searcher.max_length` leaves the length to fit on both.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from assay._local import run_local
from tests.e2e.conftest import Cluster, start_cluster, stop_cluster

ROOT = Path(__file__).resolve().parent.parent.parent
TRAINER_EXAMPLE = ROOT / "examples" / "trainer_api"
WAIT_S = 300

SCRIPT = """
import logging

from mnist_trial import MNistTrial

from assay import pytorch

logging.basicConfig(level=logging.INFO, format="%(message)s")
HPARAMS = {"global_batch_size": 32, "learning_rate": 1.0, "gamma": 0.7, "n_filters1": 8,
           "n_filters2": 16, "dropout1": 0.25, "dropout2": 0.5}
with pytorch.init(hparams=HPARAMS) as context:
    trial = MNistTrial(context, hparams=context.get_hparams())
    pytorch.Trainer(trial, context).fit(
        max_length=pytorch.Epoch(2), validation_period=pytorch.Batch(10)
    )
"""

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_cluster(tmp_path_factory.mktemp("trainer"), None, agents=2, slots=1)
    try:
        yield c
    finally:
        stop_cluster(c)


def _model_dir(tmp_path: Path) -> Path:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    shutil.copy(TRAINER_EXAMPLE / "mnist_trial.py", model_dir)
    (model_dir / "train.py").write_text(SCRIPT)
    return model_dir


def _config(slots: int, max_length: dict[str, int] | None = None) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load((TRAINER_EXAMPLE / "const.yaml").read_text())
    if max_length is None:
        del config["searcher"]["max_length"]
    else:
        config["searcher"]["max_length"] = max_length
    config["resources"] = {"slots_per_trial": slots}
    if slots > 1:
        config["entrypoint"] = "python3 -m determined.launch.torch_distributed python3 train.py"
    return config


@pytest.mark.parametrize("slots", [1, 2])
def test_the_searchers_length_decides_on_a_cluster_and_under_run_local(
    cluster: Cluster, tmp_path: Path, slots: int
) -> None:
    model_dir = _model_dir(tmp_path)
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(_config(slots, {"batches": 20})))

    eid = str(cluster.json("experiment", "create", str(config_path), str(model_dir))["id"])
    done = cluster.cli("experiment", "wait", eid, "--timeout", str(WAIT_S), timeout=WAIT_S + 60)
    config = _config(slots, {"batches": 20})
    local = run_local(config=config, model_dir=model_dir, checkpoint_dir=tmp_path / "c")

    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{cluster.dump_logs()}"
    described = cluster.json("experiment", "describe", eid)
    assert described["state"] == "COMPLETED", cluster.dump_logs()
    [trial] = described["trials"]
    assert trial["total_batches"] == local.total_batches == 20
    logs = cluster.cli("trial", "logs", str(trial["id"])).stdout
    ignored = [line for line in logs.splitlines() if "fit(max_length=Epoch(2)) is ignored" in line]
    assert len(ignored) == 1, logs[-3000:]
    assert "on a cluster: the searcher decides" in ignored[0]


def test_without_a_config_length_fits_decides_on_a_cluster_and_under_run_local(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The master's target is unbounded: the trial ends, completed, at fit's Epoch(2)."""
    model_dir = _model_dir(tmp_path)
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(_config(2)))

    eid = str(cluster.json("experiment", "create", str(config_path), str(model_dir))["id"])
    done = cluster.cli("experiment", "wait", eid, "--timeout", str(WAIT_S), timeout=WAIT_S + 60)
    local = run_local(config=_config(2), model_dir=model_dir, checkpoint_dir=tmp_path / "c")

    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{cluster.dump_logs()}"
    described = cluster.json("experiment", "describe", eid)
    assert described["state"] == "COMPLETED", cluster.dump_logs()
    [trial] = described["trials"]
    assert (trial["state"], trial["restarts"]) == ("COMPLETED", 0)
    assert trial["total_batches"] == local.total_batches == 90
    validation = cluster.json("trial", "metrics", str(trial["id"]), "--group", "validation")
    assert int(validation[-1]["total_batches"]) == 90
    assert "is ignored" not in cluster.cli("trial", "logs", str(trial["id"])).stdout
