"""The CLI and the log of a real `assay-master` (and agent) process on loopback: the HTTP
port named as such, a master log written for people, and `create --follow` to the end."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.e2e.conftest import Cluster, start_cluster, stop_cluster

from .conftest import REGRESSION_DIR, TRACEBACK, assert_ok, assert_one_line_error, run_cli


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_cluster(tmp_path_factory.mktemp("cluster"), None, agents=1, slots=2)
    try:
        yield c
    finally:
        stop_cluster(c)


def master_log(cluster: Cluster) -> str:
    return cluster.logs[0].read_text()


def test_the_http_port_is_named_and_the_master_logs_one_line(cluster: Cluster) -> None:
    grpc_port = cluster.address.rsplit(":", 1)[1]

    done = run_cli("e", "list", master=f"127.0.0.1:{cluster.http_port}")

    assert_one_line_error(
        done,
        f"127.0.0.1:{cluster.http_port} is the web UI's port (HTTP); the gRPC port is "
        f"{grpc_port}: use --master 127.0.0.1:{grpc_port}",
    )
    log = master_log(cluster)
    assert TRACEBACK not in log
    assert (
        f"called the HTTP port {cluster.http_port} with gRPC; the gRPC port is {grpc_port}" in log
    )


def test_a_closed_port_is_not_called_the_web_ui(cluster: Cluster) -> None:
    done = run_cli("e", "list", master="127.0.0.1:1")

    assert_one_line_error(done, "cannot reach the master at 127.0.0.1:1")


def test_follow_to_the_end_and_a_log_for_people(cluster: Cluster, tmp_path: Path) -> None:
    config = {
        "name": "watched",
        "entrypoint": "model_def:RegressionTrial",
        "hyperparameters": {
            "global_batch_size": 16,
            "lr": {"type": "log", "minval": -3, "maxval": -1},
        },
        "searcher": {
            "name": "random",
            "metric": "val_loss",
            "max_trials": 2,
            "max_length": {"batches": 8},
            "max_concurrent_trials": 2,
        },
        "min_validation_period": {"batches": 4},
        "checkpoint_storage": {"save_trial_latest": 0, "save_trial_best": 1},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))

    done = run_cli("e", "create", path, REGRESSION_DIR, "--follow", master=cluster.address)

    assert_ok(done)
    lines = done.stdout.strip().splitlines()
    summary = re.fullmatch(
        r"experiment (\d+) COMPLETED: best val_loss \S+ \(trial (\d+)\), checkpoint (\S+)",
        lines[-1],
    )
    assert summary, lines[-1]
    experiment_id, best_trial, uuid = summary.groups()
    assert any(re.fullmatch(r"experiment \d+: \d+%; trials: .*", line) for line in lines)
    for trial_id in (1, 2):
        ended = next(
            i for i, line in enumerate(lines) if line.startswith(f"trial {trial_id}: COMPLETED")
        )
        stop = next(
            i
            for i, line in enumerate(lines)
            if line.startswith(f"[trial {trial_id} rank 0] batch 8")
        )
        assert stop < ended, "a trial's last log lines come before its end"
    listed = run_cli("c", "list", experiment_id, "--trial", best_trial, master=cluster.address)
    assert uuid in listed.stdout
    log = master_log(cluster)
    for noise in ("alembic", "aiohttp.access", "GCResult(", TRACEBACK):
        assert noise not in log, noise
    assert "store schema upgraded to revision" in log


def test_an_experiment_the_cluster_cannot_run_says_so_at_create_describe_and_wait(
    cluster: Cluster, tmp_path: Path
) -> None:
    config = {
        "name": "too-big",
        "entrypoint": "model_def:RegressionTrial",
        "hyperparameters": {"global_batch_size": 16, "lr": 0.01},
        "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": 8}},
        "resources": {"slots_per_trial": 4},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    why = "needs 4 CPU slots; the cluster has 2 (1 agent)"

    done = run_cli("e", "create", path, REGRESSION_DIR, "--json", master=cluster.address)

    assert_ok(done)
    assert f"warning: its trials cannot start on this cluster as it is: each {why}" in done.stderr
    experiment_id = json.loads(done.stdout.strip().splitlines()[-1])["id"]
    try:
        described = run_cli("e", "describe", experiment_id, master=cluster.address)
        assert_ok(described)
        assert re.search(rf"trial \d+ cannot start: {re.escape(why)}", described.stdout)
        as_json = run_cli("e", "list-trials", experiment_id, "--json", master=cluster.address)
        assert [t["waiting"] for t in json.loads(as_json.stdout)] == [why]
        waited = run_cli("e", "wait", experiment_id, "--timeout", "1", master=cluster.address)
        assert waited.returncode == 1
        assert f"cannot start: {why}" in waited.stdout + waited.stderr
    finally:
        assert_ok(run_cli("e", "kill", experiment_id, master=cluster.address))
