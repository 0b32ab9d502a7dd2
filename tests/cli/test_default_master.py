"""With no --master and no ASSAY_MASTER, the CLI talks to the master of the local
cluster `assay deploy local up` started, on whatever --port it was given; and
`experiment describe` of an experiment that failed says why.

The cluster is real (a master and one agent on loopback), started once for the module
in a fresh HOME with the default --state-dir, as a new user would. Each command runs as
a new shell would: a subprocess with that HOME and no ASSAY_* variables.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from assay._rank_processes import free_port
from assay.client import DEFAULT_MASTER, local_master

pytestmark = pytest.mark.slow

FAILING_SCRIPT = """\
import assay.core

with assay.core.init() as core:
    raise RuntimeError("the data directory /nonexistent is missing")
"""


class Shell:
    """A new shell: its own HOME, no ASSAY_* variables, the CLI as a subprocess."""

    def __init__(self, home: Path, **env: str) -> None:
        self.home = home
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("ASSAY_")}
        self.env.update(HOME=str(home), ASSAY_POLL_SECONDS="0.1", **env)

    def run(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "assay.cli.main", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
            check=False,
        )


def _port_taken(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _error(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Shell, int]]:
    """`assay deploy local up --port N` with the default --state-dir; N is not 8090."""
    home = tmp_path_factory.mktemp("home")
    sh = Shell(home)
    port = free_port()
    assert port != 8090
    up = ["deploy", "local", "up", "--agents", "1", "--slots-per-agent", "1"]
    started = sh.run(*up, "--port", str(port), "--http-port", "0")
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        yield sh, port
    finally:
        sh.run("deploy", "local", "down")


def test_commands_without_a_master_use_the_local_cluster_on_its_port(
    cluster: tuple[Shell, int],
) -> None:
    sh, port = cluster
    recorded = json.loads((sh.home / ".assay" / "local" / "cluster.json").read_text())

    who = sh.run("user", "whoami")
    listed = sh.run("experiment", "list", "--json")
    helped = sh.run("--help")

    assert recorded["master"] == f"127.0.0.1:{port}"
    assert who.returncode == 0, who.stderr
    assert who.stdout.strip() == f"admin (admin) on 127.0.0.1:{port}"
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout.splitlines()[-1]) == []
    assert "assay deploy local up" in helped.stdout
    assert DEFAULT_MASTER in helped.stdout


def test_master_and_assay_master_still_name_the_master(cluster: tuple[Shell, int]) -> None:
    sh, _ = cluster
    elsewhere = f"127.0.0.1:{free_port()}"

    by_option = sh.run("-m", elsewhere, "experiment", "list")
    by_variable = Shell(sh.home, ASSAY_MASTER=elsewhere).run("experiment", "list")

    for done in (by_option, by_variable):
        assert _error(done).startswith(f"error: cannot reach the master at {elsewhere} ")


def test_describe_of_a_failed_experiment_says_why(
    cluster: tuple[Shell, int], tmp_path: Path
) -> None:
    sh, port = cluster
    (tmp_path / "train.py").write_text(FAILING_SCRIPT)
    config = tmp_path / "failing.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": "failing",
                "entrypoint": "python3 train.py",
                "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 10}},
                "max_restarts": 0,
            }
        )
    )

    created = sh.run("experiment", "create", str(config), str(tmp_path), "--follow")
    experiment_id = int(created.stdout.split("Created experiment ")[1].split()[0])
    described = sh.run("experiment", "describe", str(experiment_id))
    as_json = sh.run("experiment", "describe", str(experiment_id), "--json")

    assert created.returncode != 0, created.stdout + created.stderr
    assert described.returncode == 0, described.stderr
    assert "State:           ERROR" in described.stdout
    detail = json.loads(as_json.stdout.splitlines()[-1])
    (trial,) = detail["trials"]
    assert trial["state"] == "ERROR"
    assert "RuntimeError: the data directory /nonexistent is missing" in trial["last_error"]
    failed = [line for line in described.stdout.splitlines() if " failed" in line]
    assert failed == [
        f"trial {trial['id']} failed: {trial['last_error'].strip().splitlines()[-1].strip()} "
        f"(see assay trial logs {trial['id']})"
    ]
    assert "the data directory /nonexistent is missing" in failed[0]
    assert f"127.0.0.1:{port}" not in described.stderr


# --- a cluster that is gone, or files that say nothing ----------------------------------


def _state(home: Path, pids: object, cluster: object) -> Path:
    state = home / ".assay" / "local"
    state.mkdir(parents=True)
    (state / "pids.json").write_text(pids if isinstance(pids, str) else json.dumps(pids))
    (state / "cluster.json").write_text(
        cluster if isinstance(cluster, str) else json.dumps(cluster)
    )
    return state


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize(
    ("pids", "cluster"),
    [
        ("dead", {"master": "127.0.0.1:18090", "ui_url": None}),
        ({"master": "alive"}, "{not json"),
        ({}, {"master": "127.0.0.1:18090", "ui_url": None}),
        ({"master": "alive"}, {"ui_url": None}),
    ],
    ids=["master-gone", "torn-cluster-file", "no-master-pid", "no-address"],
)
def test_a_cluster_that_is_down_or_unreadable_leaves_the_default(
    tmp_path: Path, pids: object, cluster: object
) -> None:
    pids = {"master": _dead_pid()} if pids == "dead" else pids
    if isinstance(pids, dict) and pids.get("master") == "alive":
        pids = {"master": os.getpid()}
    state = _state(tmp_path, pids, cluster)

    assert local_master(state) is None
    if _port_taken(8090):
        pytest.skip("something answers on 127.0.0.1:8090 here")
    done = Shell(tmp_path).run("experiment", "list")
    assert _error(done).startswith(f"error: cannot reach the master at {DEFAULT_MASTER} ")


def test_a_recorded_master_that_does_not_answer_is_named(tmp_path: Path) -> None:
    # A master pid still alive (here: this test's own, as after a pid is reused) whose
    # port answers nothing: the error names the address the CLI tried.
    address = f"127.0.0.1:{free_port()}"
    state = _state(tmp_path, {"master": os.getpid()}, {"master": address, "ui_url": None})

    done = Shell(tmp_path).run("experiment", "list")

    assert local_master(state) == address
    assert _error(done).startswith(f"error: cannot reach the master at {address} ")


SDK_SCRIPT = """\
import assay
from assay import client

session = client.login()
print(session.api.address, session.api.who_am_i().username)
try:
    assay.load_checkpoint("00000000-0000-0000-0000-000000000000")
except assay.errors.AssayError as error:
    print("error:", error)
"""


def test_the_python_sdk_and_load_checkpoint_use_the_local_cluster_too(
    cluster: tuple[Shell, int],
) -> None:
    # The same rule as the CLI: no master= and no ASSAY_MASTER is the running local
    # cluster's master, not 127.0.0.1:8090.
    sh, port = cluster

    done = subprocess.run(
        [sys.executable, "-c", SDK_SCRIPT],
        capture_output=True,
        text=True,
        timeout=120,
        env=sh.env,
        check=False,
    )

    assert done.returncode == 0, done.stdout + done.stderr
    address, error = done.stdout.strip().splitlines()
    assert address == f"127.0.0.1:{port} admin"
    assert "cannot reach" not in error
    assert "00000000-0000-0000-0000-000000000000" in error


def test_create_warns_of_checkpoint_files_in_the_model_directory(
    cluster: tuple[Shell, int], tmp_path: Path
) -> None:
    # A local run left Lightning's last.ckpt in the directory: shipped with the code, a
    # trial resuming from ckpt_path="last" would start from the laptop's weights.
    sh, _ = cluster
    (tmp_path / "train.py").write_text(FAILING_SCRIPT)
    (tmp_path / "lightning_ckpts").mkdir()
    (tmp_path / "lightning_ckpts" / "last.ckpt").write_bytes(b"w" * 2048)
    config = tmp_path / "c.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "entrypoint": "python3 train.py",
                "searcher": {"name": "single", "metric": "loss", "max_length": 10},
            }
        )
    )

    created = sh.run("experiment", "create", str(config), str(tmp_path), "--paused")

    assert created.returncode == 0, created.stderr
    assert created.stderr.count("warning: ") == 1, created.stderr
    assert "holds 1 checkpoint file (2.0 KiB: lightning_ckpts/last.ckpt)" in created.stderr


def test_create_test_runs_one_short_trial_of_a_search_on_the_cluster(
    cluster: tuple[Shell, int], tmp_path: Path
) -> None:
    # Determined's `experiment create --test`: the search's config, one trial of 1 batch,
    # validated and checkpointed on the cluster; the exit status says whether it worked.
    from tests.conftest import REGRESSION_DIR, regression_config

    sh, _ = cluster
    config = regression_config(batches=200)
    config["searcher"] = {
        "name": "asha",
        "metric": "val_loss",
        "max_length": {"batches": 200},
        "max_trials": 16,
    }
    config["hyperparameters"]["lr"] = {"type": "double", "minval": 0.01, "maxval": 0.1}
    path = tmp_path / "search.yaml"
    path.write_text(yaml.safe_dump(config))

    done = sh.run("experiment", "create", str(path), str(REGRESSION_DIR), "--test", "--json")
    refused = sh.run("experiment", "create", str(path), str(REGRESSION_DIR), "--test", "--paused")

    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(done.stdout.splitlines()[-1])
    described = json.loads(
        sh.run("experiment", "describe", str(summary["id"]), "--json").stdout.splitlines()[-1]
    )
    assert described["state"] == "COMPLETED"
    assert described["name"] == "regression (test)"
    [trial] = described["trials"]
    assert trial["total_batches"] == 1
    assert refused.returncode == 1
    assert "--test runs the experiment at once" in refused.stderr


SILENT_SCRIPT = """\
import assay.core

with assay.core.init() as core:
    core.train.report_training_metrics(steps_completed=1, metrics={"loss": 0.5})
"""


def test_create_test_fails_when_the_searchers_metric_is_never_reported(
    cluster: tuple[Shell, int], tmp_path: Path
) -> None:
    # A script that exits 0 without a validation completes its trial; a search of it
    # would rank nothing, so the test run fails and names what was expected and seen.
    sh, _ = cluster
    (tmp_path / "train.py").write_text(SILENT_SCRIPT)
    config = tmp_path / "asha.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": "silent",
                "entrypoint": "python3 train.py",
                "hyperparameters": {"lr": {"type": "double", "minval": 0.01, "maxval": 0.1}},
                "searcher": {
                    "name": "asha",
                    "metric": "val_loss",
                    "max_length": {"batches": 100},
                    "max_trials": 8,
                },
            }
        )
    )

    done = sh.run("experiment", "create", str(config), str(tmp_path), "--test")

    assert done.returncode == 1, done.stdout + done.stderr
    assert "COMPLETED: no validation val_loss reported" in done.stdout
    error = done.stderr.strip().splitlines()[-1]
    assert error.startswith("error: --test: experiment ")
    assert "no trial reported the searcher's metric 'val_loss' (searcher.metric)" in error
    assert error.endswith("it reported no validation metrics (training metrics: loss)")
