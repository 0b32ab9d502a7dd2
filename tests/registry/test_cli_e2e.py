"""`assay model` on a real cluster (a master, an agent and a trial's process): a trial's
checkpoint is registered while the trial runs, survives the GC that deletes its
neighbours when the trial ends, is downloaded, and cannot be deleted while registered."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from assay.cli._model import version_dict
from assay.client import Client, checkpoint_state, experiment_state
from tests.conftest import REGRESSION_DIR, regression_config
from tests.e2e.conftest import Cluster, start_cluster, stop_cluster

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    started = start_cluster(tmp_path_factory.mktemp("registry"), None, agents=1, slots=1)
    try:
        yield started
    finally:
        stop_cluster(started)


def _eventually(check: Callable[[], Any], cluster: Cluster, what: str, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached in {timeout:.0f} s:\n{cluster.dump_logs()}")
        time.sleep(0.2)
    return found


def _fails(cluster: Cluster, *args: str) -> str:
    done = cluster.cli(*args)
    assert done.returncode == 1, (args, done.stdout, done.stderr)
    return done.stderr


@pytest.fixture(scope="module")
def api(cluster: Cluster) -> Iterator[Client]:
    """For polling (a CLI process takes seconds to start on a busy machine)."""
    client = Client(cluster.address)
    yield client
    client.close()


def _state(api: Client, eid: int) -> str:
    return experiment_state(api.get_experiment(eid).experiment.state)


@pytest.fixture(scope="module")
def run(cluster: Cluster, api: Client, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """An experiment that checkpoints every 4 batches and keeps only its latest checkpoint;
    its first checkpoint is registered as `regressor` version 1 while it trains."""
    made = cluster.json(
        "model", "create", "regressor", "--description", "y = ax + b", "--label", "demo"
    )
    assert made["owner"] == "admin"
    config = regression_config(batches=80, checkpoint_period=4, validation_period=4, sleep_s=0.1)
    config["checkpoint_storage"] = {
        "type": "shared_fs",
        "save_trial_best": 0,
        "save_trial_latest": 1,
    }
    path = tmp_path_factory.mktemp("config") / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    eid = int(cluster.json("experiment", "create", str(path), str(REGRESSION_DIR))["id"])
    first = _eventually(
        lambda: api.list_checkpoints(eid), cluster, "the experiment's first checkpoint", 300
    )[0]
    # In this process, not a CLI one (which takes seconds to start on a busy machine):
    # the trial must still be running. The CLI's register-version is tested below.
    registered = version_dict(
        api.register_model_version("regressor", first.uuid, notes="first checkpoint")
    )
    assert _state(api, eid) == "ACTIVE", (
        "the trial ended before its checkpoint was registered: slow it down"
    )
    _eventually(
        lambda: _state(api, eid) == "COMPLETED",
        cluster,
        "the experiment's end",
    )
    return {"experiment_id": eid, "uuid": first.uuid, "registered": registered}


def _checkpoints(api: Client, eid: int) -> dict[str, str]:
    return {c.uuid: checkpoint_state(c.state) for c in api.list_checkpoints(eid)}


def test_gc_keeps_the_registered_checkpoint_and_deletes_its_neighbours(
    cluster: Cluster, api: Client, run: dict[str, Any]
) -> None:
    eid, uuid = run["experiment_id"], run["uuid"]
    # GC runs after the trial's end is committed: wait for it to delete the others.
    states = _eventually(
        lambda: (
            (s := _checkpoints(api, eid)) and sum(v == "COMPLETED" for v in s.values()) == 2 and s
        ),
        cluster,
        "the end-of-trial GC",
    )
    assert len(states) > 3  # it checkpointed every 4 batches: most were deleted
    assert states[uuid] == "COMPLETED"
    assert list(states.values()).count("DELETED") == len(states) - 2


def test_list_describe_versions_and_download(
    cluster: Cluster, run: dict[str, Any], tmp_path: Path
) -> None:
    uuid = run["uuid"]
    assert run["registered"]["version"] == 1
    assert run["registered"]["experiment_id"] == run["experiment_id"]
    [listed] = cluster.json("model", "list")
    assert (listed["name"], listed["num_versions"], listed["labels"]) == ("regressor", 1, ["demo"])
    described = cluster.json("model", "describe", "regressor")
    assert described["description"] == "y = ax + b"
    assert [v["checkpoint_uuid"] for v in described["versions"]] == [uuid]
    [version] = cluster.json("model", "versions", "regressor")
    assert (version["notes"], version["user"]) == ("first checkpoint", "admin")
    assert "val_loss" in version["validation_metrics"]
    text = cluster.cli("model", "describe", "regressor")
    assert text.returncode == 0
    assert uuid in text.stdout

    done = cluster.cli("model", "download", "regressor", str(tmp_path / "latest"))
    assert done.returncode == 0, done.stderr
    assert "regressor version 1" in done.stdout
    done = cluster.cli("model", "download", "regressor", "1", str(tmp_path / "v1"))
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "v1").iterdir()) == sorted(
        p.name for p in (tmp_path / "latest").iterdir()
    )
    assert any((tmp_path / "v1").iterdir())


def test_set_and_bad_input(cluster: Cluster, run: dict[str, Any]) -> None:
    changed = cluster.json("model", "set", "regressor", "--metadata", "r2=0.98", "--label", "prod")
    assert (changed["metadata"], changed["labels"]) == ({"r2": 0.98}, ["prod"])
    assert "a model named 'regressor' exists already" in _fails(
        cluster, "model", "create", "regressor"
    )
    assert "model 'nope' does not exist" in _fails(cluster, "model", "describe", "nope")
    missing = "00000000-0000-4000-8000-000000000000"
    assert f"checkpoint {missing} does not exist" in _fails(
        cluster, "model", "register-version", "regressor", missing
    )
    assert "is not KEY=VALUE" in _fails(cluster, "model", "set", "regressor", "--metadata", "x")
    assert "give NAME [VERSION] DIR" in _fails(cluster, "model", "download", "regressor")
    assert cluster.json("model", "describe", "regressor")["num_versions"] == 1


def test_the_registered_checkpoint_is_kept_until_its_version_goes(
    cluster: Cluster, api: Client, run: dict[str, Any]
) -> None:
    eid, uuid = run["experiment_id"], run["uuid"]
    refused = _fails(cluster, "checkpoint", "delete", uuid, "--yes")
    assert f"checkpoint {uuid} is registered as model 'regressor' version 1" in refused
    assert _checkpoints(api, eid)[uuid] == "COMPLETED"

    assert "has 1 version" in _fails(cluster, "model", "delete", "regressor", "--yes")
    assert cluster.json("model", "archive", "regressor")["archived"] is True
    assert cluster.json("model", "list") == []
    assert [m["name"] for m in cluster.json("model", "list", "--all")] == ["regressor"]
    assert "archived" in _fails(cluster, "model", "register-version", "regressor", uuid)
    assert cluster.cli("model", "unarchive", "regressor").returncode == 0

    again = cluster.json("model", "register-version", "regressor", uuid)
    assert again["version"] == 2
    done = cluster.cli("model", "delete-version", "regressor", "1", "--yes")
    assert done.returncode == 0, done.stderr
    deleted = cluster.json("model", "delete", "regressor", "--force", "--yes")
    assert deleted == {"deleted": "regressor", "versions_deleted": 1}
    assert cluster.json("model", "list", "--all") == []

    done = cluster.cli("checkpoint", "delete", uuid, "--yes")
    assert done.returncode == 0, done.stderr
    assert _checkpoints(api, eid)[uuid] == "DELETED"
