"""On a real cluster: a failure every run would repeat ends its trial in ERROR at the first
run, with its cause in `last_error`, the logs and `create --follow`; a failure that may
pass is still restarted, and says it restarts from the start when there is no checkpoint.
The trials' logs carry the metric lines `run-local` prints.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REGRESSION_DIR, regression_config
from tests.e2e.conftest import Cluster, start_cluster, stop_cluster

pytestmark = pytest.mark.slow

SCRIPTS = Path(__file__).parents[1] / "fixtures" / "scripts"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = start_cluster(tmp_path, None, agents=1, slots=4)
    try:
        yield c
    finally:
        stop_cluster(c)


def _write(tmp_path: Path, name: str, config: dict[str, Any], extra: str = "") -> list[str]:
    model = tmp_path / f"model-{name}"
    model.mkdir()
    shutil.copy(REGRESSION_DIR / "model_def.py", model / "model_def.py")
    with (model / "model_def.py").open("a") as f:
        f.write(extra)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**config, "name": name}))
    return [str(path), str(model)]


def _trial(cluster: Cluster, eid: int) -> dict[str, Any]:
    [trial] = cluster.json("experiment", "describe", str(eid))["trials"]
    detail: dict[str, Any] = cluster.json("trial", "describe", str(trial["id"]))
    return detail


def test_repeatable_failures_end_at_the_first_run_and_others_restart(
    cluster: Cluster, tmp_path: Path
) -> None:
    base = regression_config(batches=8, scheduling_unit=4)
    no_metric = _write(
        tmp_path, "no-metric", {**base, "searcher": {**base["searcher"], "metric": "accuracy"}}
    )
    flaky = _write(
        tmp_path,
        "flaky",
        {**base, "max_restarts": 1, "hyperparameters": {**base["hyperparameters"], "exit_at": 5}},
    )
    broken = _write(tmp_path, "broken", base, "\nimport a_package_nobody_installed\n")
    good = _write(tmp_path, "good", base)
    script = tmp_path / "model-script"  # a script reporting `value`, searched on `val_loss`
    script.mkdir()
    shutil.copy(SCRIPTS / "loop.py", script / "loop.py")
    script_config = tmp_path / "script.yaml"
    script_config.write_text(
        yaml.safe_dump(
            {
                "name": "script-no-metric",
                "entrypoint": "python3 loop.py",
                "hyperparameters": {"steps": 20, "every": 5},
                "searcher": {"name": "single", "metric": "val_loss", "max_length": 20},
            }
        )
    )
    runs = [("no-metric", no_metric), ("flaky", flaky), ("good", good)]
    runs.append(("script-no-metric", [str(script_config), str(script)]))
    ids = {}
    for name, args in runs:
        ids[name] = int(cluster.json("experiment", "create", *args)["id"])

    followed = cluster.cli("experiment", "create", *broken, "--follow", timeout=240)

    # The import error: one run, no restart, its cause everywhere a user looks.
    assert followed.returncode == 1, followed.stdout + followed.stderr
    out = followed.stdout + followed.stderr
    assert "No module named 'a_package_nobody_installed'" in out, out[-3000:]
    assert "every run would fail the same way" in out, out[-3000:]
    eid = int(out.split("Created experiment ")[1].split()[0])
    trial = _trial(cluster, eid)
    assert (trial["state"], trial["restarts"], trial["run_id"]) == ("ERROR", 0, 1), trial
    assert "No module named 'a_package_nobody_installed'" in trial["last_error"]
    # The missing metric: caught at the first validation, not retried 5 times.
    for eid in ids.values():
        cluster.cli("experiment", "wait", str(eid), "--quiet", timeout=240)
    trial = _trial(cluster, ids["no-metric"])
    assert (trial["state"], trial["restarts"], trial["run_id"]) == ("ERROR", 0, 1), trial
    assert "searcher.metric 'accuracy' is not among the validation metrics" in trial["last_error"]
    # A script's too: its first validation without the metric ends it, exit 78.
    trial = _trial(cluster, ids["script-no-metric"])
    assert (trial["state"], trial["restarts"], trial["run_id"]) == ("ERROR", 0, 1), trial
    logs = cluster.cli("trial", "logs", str(trial["id"])).stdout
    assert "searcher.metric 'val_loss' is not among the validation metrics" in logs, logs[-3000:]
    # User code that exits 7 may not next time: restarted, from the start (no checkpoint).
    trial = _trial(cluster, ids["flaky"])
    assert (trial["state"], trial["restarts"], trial["run_id"]) == ("ERROR", 1, 2), trial
    logs = cluster.cli("trial", "logs", str(trial["id"])).stdout
    assert "restart 1 of 1 from the start (no checkpoint yet)" in logs, logs[-3000:]
    assert "latest checkpoint" not in logs
    # The cluster's logs show training metrics as run-local prints them.
    assert "batch 4 training: loss=" in logs, logs[-3000:]
    trial = _trial(cluster, ids["good"])
    assert trial["state"] == "COMPLETED", trial
    logs = cluster.cli("trial", "logs", str(trial["id"])).stdout
    for line in ("batch 8 training: loss=", "batch 8 validation: count=", "batch 8 checkpoint: "):
        assert line in logs, logs[-3000:]
