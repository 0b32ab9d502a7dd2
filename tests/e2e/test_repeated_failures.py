"""On a real cluster (a master and two agents, processes on loopback): a failure that
repeats the run before it, with no progress between, ends its trial instead of being
restarted up to max_restarts; and Determined's `log_policies` act on the lines a trial
writes: `cancel_retries` ends it at its first failure, `exclude_node` steers its next
runs off the agent that wrote the line."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REGRESSION_DIR, regression_config
from tests.e2e.conftest import Cluster, start_cluster, stop_cluster

pytestmark = pytest.mark.slow

MISSING = "/nonexistent/assay-data/train.csv"
MISSING_DATA_TRIAL = f"""

class MissingDataTrial(RegressionTrial):
    def build_training_data_loader(self):
        open(self.context.get_data_config()["path"]).close()  # {MISSING}: not there
        return super().build_training_data_loader()
"""
MISSING_FILE_SCRIPT = f"""\
import assay.core

with assay.core.init() as core:
    with open("{MISSING}") as f:
        f.read()
"""
OOM_SCRIPT = """\
import sys

print("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB", flush=True)
sys.exit(1)
"""
# Says which agent it runs on (its directory is under that agent's work dir), so that
# no two runs fail with the same line.
ECC_SCRIPT = """\
import os
import sys

print(f"NVRM: Xid 48: uncorrectable ECC error encountered ({os.getcwd()})", flush=True)
sys.exit(1)
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    found = start_cluster(tmp_path_factory.mktemp("repeats"), None, agents=2, slots=1)
    try:
        yield found
    finally:
        stop_cluster(found)


def _script(tmp_path: Path, name: str, source: str, **config: Any) -> list[str]:
    model = tmp_path / name
    model.mkdir()
    (model / "train.py").write_text(source)
    path = tmp_path / f"{name}.yaml"
    searcher = {"name": "single", "metric": "loss", "max_length": 10}
    path.write_text(
        yaml.safe_dump(
            {"name": name, "entrypoint": "python3 train.py", "searcher": searcher, **config}
        )
    )
    return [str(path), str(model)]


def _trial(cluster: Cluster, eid: int) -> dict[str, Any]:
    [trial] = cluster.json("experiment", "describe", str(eid))["trials"]
    detail: dict[str, Any] = cluster.json("trial", "describe", str(trial["id"]))
    return detail


def _failed_line(cluster: Cluster, eid: int) -> str:
    described = cluster.cli("experiment", "describe", str(eid)).stdout
    [line] = [x for x in described.splitlines() if " failed: " in x]
    return line


def test_a_failure_that_repeats_ends_the_trial_at_its_second_run(
    cluster: Cluster, tmp_path: Path
) -> None:
    # A Trial that opens a missing data.path, and a script with a missing file: each ran
    # 6 times (max_restarts 5) before it ended in ERROR.
    model = tmp_path / "model"
    model.mkdir()
    shutil.copy(REGRESSION_DIR / "model_def.py", model / "model_def.py")
    with (model / "model_def.py").open("a") as f:
        f.write(MISSING_DATA_TRIAL)
    config = regression_config(batches=8)
    config.update(name="missing-data", entrypoint="model_def:MissingDataTrial")
    config["data"] = {"path": MISSING}
    path = tmp_path / "missing-data.yaml"
    path.write_text(yaml.safe_dump(config))
    started = time.monotonic()
    trial_exp = cluster.json("experiment", "create", str(path), str(model))["id"]
    script_exp = cluster.json(
        "experiment", "create", *_script(tmp_path, "missing-file", MISSING_FILE_SCRIPT)
    )["id"]

    for eid in (trial_exp, script_exp):
        waited = cluster.cli("experiment", "wait", str(eid), "--quiet", timeout=300)
        assert waited.returncode == 1, waited.stdout + waited.stderr
    took = time.monotonic() - started

    reason = "not restarted: it failed as run 1 did, at batch 0, with no batch or checkpoint"
    for eid in (trial_exp, script_exp):
        trial = _trial(cluster, eid)
        assert (trial["state"], trial["run_id"], trial["restarts"]) == ("ERROR", 2, 1), trial
        assert trial["last_error"].startswith(f"run 2 ({reason} gained since): "), trial
        assert (
            f"FileNotFoundError: [Errno 2] No such file or directory: '{MISSING}'"
            in (trial["last_error"])
        )
        assert reason in _failed_line(cluster, eid)
        logs = cluster.cli("trial", "logs", str(trial["id"])).stdout
        assert "restart 1 of 5 from the start (no checkpoint yet)" in logs, logs[-3000:]
        assert f"{reason} gained since: the trial ends in ERROR (4 of max_restarts 5 unused)" in (
            logs
        ), logs[-3000:]
        described = cluster.cli("trial", "describe", str(trial["id"])).stdout
        assert f"Last error:      run 2 ({reason}" in described
    print(f"both ended in ERROR after 2 runs each, {took:.1f} s from creation")


def test_a_cancel_retries_policy_ends_the_trial_at_its_first_failure(
    cluster: Cluster, tmp_path: Path
) -> None:
    # Determined's form before 0.36: {pattern, action: {type: ...}}.
    policies = [{"pattern": "CUDA out of memory", "action": {"type": "cancel_retries"}}]
    args = _script(tmp_path, "oom", OOM_SCRIPT, log_policies=policies)

    followed = cluster.cli("experiment", "create", *args, "--follow", timeout=300)

    assert followed.returncode == 1, followed.stdout + followed.stderr
    eid = int(followed.stdout.split("Created experiment ")[1].split()[0])
    trial = _trial(cluster, eid)
    assert (trial["state"], trial["run_id"], trial["restarts"]) == ("ERROR", 1, 0), trial
    said = "not restarted: log_policies[0] matched a line from agent"
    assert trial["last_error"].startswith(f"run 1 ({said}"), trial
    assert "CUDA out of memory. Tried to allocate 2.00 GiB (cancel_retries)" in trial["last_error"]
    assert "(5 of max_restarts 5 unused)" in followed.stdout
    assert said in _failed_line(cluster, eid)


def test_an_exclude_node_policy_moves_the_next_run_to_another_agent(
    cluster: Cluster, tmp_path: Path
) -> None:
    # Determined 0.38's form: {name, pattern, action}. Each run fails on the agent it
    # gets, which its next runs avoid: with both excluded, the trial waits and says why.
    policies = [{"name": "ecc", "pattern": r"uncorrectable ECC error", "action": "exclude_node"}]
    args = _script(tmp_path, "ecc", ECC_SCRIPT, log_policies=policies, max_restarts=3)
    eid = cluster.json("experiment", "create", *args)["id"]
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            [trial] = cluster.json("experiment", "describe", str(eid))["trials"]
            if trial["state"] == "QUEUED" and trial["waiting"]:
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"the trial did not come to wait: {trial}")
        logs = cluster.cli("trial", "logs", str(trial["id"])).stdout
        avoided = {
            line.rsplit(" ", 1)[1] for line in logs.splitlines() if "the trial's runs avoid" in line
        }
        assert avoided == {"agent0", "agent1"}, logs[-3000:]
        assert "log_policies[0] ('ecc') matched a line from agent" in logs
        assert trial["waiting"] == (
            "needs 1 CPU slot; its log_policies exclude every agent that could run it "
            "(agent0, agent1): add an agent, or kill the trial"
        )
        described = cluster.cli("experiment", "describe", str(eid)).stdout
        assert f"trial {trial['id']} cannot start: " in described
        assert trial["restarts"] == 2
    finally:
        cluster.cli("experiment", "kill", str(eid))
