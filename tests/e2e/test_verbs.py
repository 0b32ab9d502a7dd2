"""Building on earlier work from the CLI, on one real cluster: `create --config`
overrides, `experiment fork`, `experiment download-model-def`, `trial download
--best|--latest` and `checkpoint describe`, each with its bad paths."""

from __future__ import annotations

import filecmp
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from assay import client
from assay.errors import AssayError
from tests.conftest import REGRESSION_DIR, regression_config
from tests.credentials import ADMIN_PASSWORD
from tests.e2e.conftest import Cluster, start_cluster, stop_cluster

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    found = start_cluster(tmp_path_factory.mktemp("verbs"), None, agents=1, slots=1)
    try:
        yield found
    finally:
        stop_cluster(found)


@pytest.fixture(scope="module")
def done(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A completed experiment created with overrides: checkpoints at batches 4 and 8."""
    path = tmp_path_factory.mktemp("configs") / "base.yaml"
    path.write_text(yaml.safe_dump(regression_config(batches=40)))
    created = cluster.json(
        "experiment",
        "create",
        str(path),
        str(REGRESSION_DIR),
        "--config",
        "searcher.max_length.batches=8",
        "--config",
        "name=verbs-overridden",
        "--config",
        "min_validation_period={batches: 4}",
        "--config",
        "min_checkpoint_period.batches=4",
        "--config",
        "checkpoint_storage.save_trial_latest=2",
        "--follow",
        "-q",
    )
    return dict(cluster.json("experiment", "describe", str(created["id"])))


def _fails(cluster: Cluster, *args: str) -> str:
    result = cluster.cli(*args)
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr
    return result.stderr.strip()


def test_create_applies_config_overrides(done: dict[str, Any]) -> None:
    assert done["state"] == "COMPLETED"
    assert done["name"] == "verbs-overridden"
    assert done["config"]["searcher"]["max_length"] == {"batches": 8}
    assert done["config"]["min_validation_period"] == {"batches": 4}
    assert done["trials"][0]["total_batches"] == 8


def test_bad_overrides_are_refused_before_upload(cluster: Cluster, tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(regression_config(batches=8)))
    before = cluster.json("experiment", "list", "--all")
    base = ("experiment", "create", str(path), str(REGRESSION_DIR), "--config")
    assert "is not KEY=VALUE" in _fails(cluster, *base, "no-equals-sign")
    assert "searcher.max_length" in _fails(cluster, *base, "searcher.max_length.batches=-1")
    assert "name is 'regression', not a mapping" in _fails(cluster, *base, "name.first=x")
    assert "not valid YAML" in _fails(cluster, *base, "hyperparameters.lr=[1,")
    assert cluster.json("experiment", "list", "--all") == before


def test_download_model_def(cluster: Cluster, done: dict[str, Any], tmp_path: Path) -> None:
    target = tmp_path / "def"
    result = cluster.cli("experiment", "download-model-def", str(done["id"]), str(target))
    assert result.returncode == 0, result.stderr
    assert filecmp.cmp(target / "model_def.py", REGRESSION_DIR / "model_def.py", shallow=False)
    again = _fails(cluster, "experiment", "download-model-def", str(done["id"]), str(target))
    assert "not empty" in again
    assert "experiment 99999 does not exist" in _fails(
        cluster, "experiment", "download-model-def", "99999", str(tmp_path / "none")
    )


def test_fork_takes_the_config_and_model_definition(
    cluster: Cluster, done: dict[str, Any], tmp_path: Path
) -> None:
    partial = tmp_path / "partial.yaml"
    partial.write_text("description: a fork\nhyperparameters: {lr: 0.01}\n")
    forked = cluster.json(
        "experiment",
        "fork",
        str(done["id"]),
        "--config",
        str(partial),
        "--config",
        "name=verbs-fork",
        "--paused",
    )
    assert forked["forked_from"] == done["id"]
    new = cluster.json("experiment", "describe", str(forked["id"]))
    try:
        assert new["name"] == "verbs-fork"
        assert new["config"]["description"] == "a fork"
        assert new["config"]["hyperparameters"]["lr"] == 0.01
        # Everything else is the source's, its own overrides included.
        assert new["config"]["searcher"] == done["config"]["searcher"]
        assert new["config"]["min_checkpoint_period"] == {"batches": 4}
        code = tmp_path / "code"
        got = cluster.cli("experiment", "download-model-def", str(forked["id"]), str(code))
        assert got.returncode == 0, got.stderr
        assert filecmp.cmp(code / "model_def.py", REGRESSION_DIR / "model_def.py", shallow=False)
    finally:
        cluster.cli("experiment", "kill", str(forked["id"]))

    before = cluster.json("experiment", "list", "--all")
    assert "experiment 99999 does not exist" in _fails(cluster, "experiment", "fork", "99999")
    bad = _fails(cluster, "experiment", "fork", str(done["id"]), "--config", "searcher.name=nope")
    assert "searcher.name" in bad
    missing = _fails(cluster, "experiment", "fork", str(done["id"]), "--config", "no/such.yaml")
    assert "cannot read config file no/such.yaml" in missing
    assert cluster.json("experiment", "list", "--all") == before


def _search(cluster: Cluster, tmp_path: Path) -> dict[str, Any]:
    """A paused random search of 3 trials whose config sets no seed, described."""
    config = regression_config(batches=8)
    del config["reproducibility"]
    config["hyperparameters"]["lr"] = {"type": "log", "minval": -3, "maxval": -1}
    config["searcher"] = {
        "name": "random",
        "metric": "val_loss",
        "max_trials": 3,
        "max_concurrent_trials": 3,
        "max_length": {"batches": 8},
    }
    path = tmp_path / "search.yaml"
    path.write_text(yaml.safe_dump(config))
    created = cluster.json("experiment", "create", str(path), str(REGRESSION_DIR), "--paused")
    return dict(cluster.json("experiment", "describe", str(created["id"])))


def _points(cluster: Cluster, described: dict[str, Any]) -> list[tuple[float, int]]:
    """Each trial's lr and seed, in the order the search created them."""
    ids = sorted(t["id"] for t in described["trials"])
    trials = [cluster.json("trial", "describe", str(i)) for i in ids]
    return [(t["hparams"]["lr"], t["seed"]) for t in trials]


def test_fork_searches_anew_unless_it_reproduces(cluster: Cluster, tmp_path: Path) -> None:
    # A fork is a new experiment, with a seed of its own unless --reproduce keeps the
    # source's; three experiments of one config used to try the same points in order.
    source = _search(cluster, tmp_path)
    forked = cluster.json("experiment", "fork", str(source["id"]), "--paused")
    kept = cluster.json("experiment", "fork", str(source["id"]), "--paused", "--reproduce")
    text = cluster.cli("experiment", "fork", str(source["id"]), "--paused")
    conflict = _fails(
        cluster,
        *("experiment", "fork", str(source["id"]), "--reproduce"),
        *("--config", "reproducibility.experiment_seed=5"),
    )
    described = cluster.cli("experiment", "describe", str(source["id"]))
    try:
        seed = source["seed"]
        assert source["config"]["reproducibility"] == {"experiment_seed": seed}
        assert forked["seed"] != seed
        assert kept["seed"] == seed
        points = _points(cluster, source)
        assert len(points) == 3
        assert _points(cluster, cluster.json("experiment", "describe", str(kept["id"]))) == points
        new = _points(cluster, cluster.json("experiment", "describe", str(forked["id"])))
        assert not set(new) & set(points)
        assert f"Seed:            {seed} (drawn by the master;" in described.stdout
        assert text.returncode == 0, text.stderr
        assert "a new seed, " in text.stdout
        assert f"experiment {source['id']} has {seed}: --reproduce keeps it" in text.stdout
        assert f"--reproduce keeps experiment {source['id']}'s seed {seed}" in conflict
    finally:
        for found in re.findall(r"Created experiment (\d+)", text.stdout):
            cluster.cli("experiment", "kill", found)
        for eid in (source["id"], forked["id"], kept["id"]):
            cluster.cli("experiment", "kill", str(eid))


def test_trial_download_best_and_latest(
    cluster: Cluster, done: dict[str, Any], tmp_path: Path
) -> None:
    trial_id = str(done["trials"][0]["id"])
    checkpoints = cluster.json("checkpoint", "list", str(done["id"]))
    assert sorted(c["total_batches"] for c in checkpoints) == [4, 8]
    best = min(checkpoints, key=lambda c: c["validation_metrics"]["val_loss"])

    got = cluster.json("trial", "download", trial_id, str(tmp_path / "best"), "--best")
    assert got["uuid"] == best["uuid"]
    manifest = json.loads((tmp_path / "best" / "metadata.json").read_text())
    assert manifest["uuid"] == best["uuid"]
    got = cluster.json("trial", "download", trial_id, str(tmp_path / "latest"), "--latest")
    assert got["total_batches"] == 8

    assert "--best or --latest" in _fails(cluster, "trial", "download", trial_id, str(tmp_path))
    assert "trial 99999" in _fails(cluster, "trial", "download", "99999", "x", "--best")


def test_checkpoint_describe(cluster: Cluster, done: dict[str, Any]) -> None:
    listed = cluster.json("checkpoint", "list", str(done["id"]))[0]
    described = cluster.json("checkpoint", "describe", listed["uuid"])
    assert described == listed
    shown = cluster.cli("checkpoint", "describe", listed["uuid"])
    assert shown.returncode == 0, shown.stderr
    assert "metadata.json" in shown.stdout
    assert f"Trial:           {listed['trial_id']}" in shown.stdout
    unknown = "00000000-0000-0000-0000-000000000000"
    assert "does not exist" in _fails(cluster, "checkpoint", "describe", unknown)


def test_set_name_description_labels_and_label_add_remove(
    cluster: Cluster, done: dict[str, Any]
) -> None:
    eid = str(done["id"])
    for field, value in [("name", "renamed"), ("description", "two\nlines"), ("labels", "a, b")]:
        result = cluster.cli("experiment", "set", field, eid, value)
        assert result.returncode == 0, result.stderr
    assert "labels is now a, b" in result.stdout
    assert cluster.cli("experiment", "label", "add", eid, "c").returncode == 0
    assert cluster.cli("experiment", "label", "add", eid, "c").returncode == 0  # idempotent
    removed = cluster.cli("experiment", "label", "remove", eid, "a")
    assert removed.stdout.strip() == f"experiment {eid}: labels b, c"
    assert cluster.cli("experiment", "label", "remove", eid, "zzz").returncode == 0
    listed = cluster.json("experiment", "list", "--name", "renamed")
    assert [(e["id"], e["labels"]) for e in listed] == [(done["id"], ["b", "c"])]
    assert cluster.json("experiment", "list", "--label", "c")[0]["id"] == done["id"]
    assert cluster.json("experiment", "list", "--label", "a") == []
    client.login(cluster.address, "admin", ADMIN_PASSWORD)
    assert client.get_experiment(done["id"]).description == "two\nlines"

    assert "name" in _fails(cluster, "experiment", "set", "name", eid, " ")
    assert "at most 255" in _fails(cluster, "experiment", "label", "add", eid, "x" * 300)
    assert "control character" in _fails(cluster, "experiment", "set", "name", eid, "a\x01b")
    assert "experiment 99999 does not exist" in _fails(
        cluster, "experiment", "label", "add", "99999", "x"
    )
    unchanged = cluster.json("experiment", "list", "--name", "renamed")[0]
    assert unchanged["labels"] == ["b", "c"]
    assert cluster.cli("experiment", "set", "labels", eid, "").returncode == 0
    assert cluster.json("experiment", "list", "--name", "renamed")[0]["labels"] == []


def test_templates_merge_under_the_experiment_config(cluster: Cluster, tmp_path: Path) -> None:
    partial = tmp_path / "t.yaml"
    partial.write_text(
        "description: from the template\n"
        "searcher: {name: single, metric: val_loss, max_length: {batches: 4}}\n"
        "resources: {slots_per_trial: 1}\n"
    )
    made = cluster.json("template", "create", "verbs-small", str(partial))
    assert made["config"]["searcher"]["max_length"] == {"batches": 4}
    assert [t["name"] for t in cluster.json("template", "list")] == ["verbs-small"]
    shown = cluster.cli("template", "describe", "verbs-small")
    assert "max_length:" in shown.stdout

    own = tmp_path / "own.yaml"
    config = regression_config(batches=40)
    del config["searcher"]
    config["name"] = "verbs-templated"
    own.write_text(yaml.safe_dump(config))
    created = cluster.json(
        "experiment",
        "create",
        str(own),
        str(REGRESSION_DIR),
        "--template",
        "verbs-small",
        "--config",
        "description=overridden",
        "--paused",
    )
    try:
        got = cluster.json("experiment", "describe", str(created["id"]))
        assert got["config"]["searcher"]["max_length"] == {"batches": 4}  # the template's
        assert got["config"]["hyperparameters"]["lr"] == 0.05  # the experiment's own
        assert got["config"]["description"] == "overridden"  # --config last
    finally:
        cluster.cli("experiment", "kill", str(created["id"]))

    assert "exists already" in _fails(cluster, "template", "create", "verbs-small", str(partial))
    secret = tmp_path / "secret.yaml"
    secret.write_text("checkpoint_storage: {type: s3, bucket: b, secret_key: hunter2}\n")
    assert "keep secrets" in _fails(cluster, "template", "create", "verbs-secret", str(secret))
    listed = tmp_path / "list.yaml"
    listed.write_text("- 1\n")
    assert "must hold a mapping" in _fails(cluster, "template", "create", "x", str(listed))
    assert "not allowed" in _fails(cluster, "template", "create", "bad name", str(partial))
    unknown = _fails(
        cluster, "experiment", "create", str(own), str(REGRESSION_DIR), "--template", "nope"
    )
    assert "template 'nope' does not exist" in unknown
    assert cluster.cli("template", "delete", "verbs-small").returncode == 0
    assert cluster.json("template", "list") == []
    assert "does not exist" in _fails(cluster, "template", "delete", "verbs-small")


def test_continue_trains_the_same_trial_on_from_its_checkpoint(
    cluster: Cluster, tmp_path: Path
) -> None:
    path = tmp_path / "short.yaml"
    path.write_text(yaml.safe_dump(regression_config(batches=4, scheduling_unit=1)))
    created = cluster.json(
        "experiment", "create", str(path), str(REGRESSION_DIR), "--config", "name=continued"
    )
    exp = str(created["id"])
    assert cluster.cli("experiment", "wait", exp, "-q").returncode == 0
    first = cluster.json("experiment", "describe", exp)["trials"][0]
    assert first["total_batches"] == 4
    before = cluster.json("checkpoint", "list", exp)
    assert [c["total_batches"] for c in before] == [4]

    got = cluster.cli("experiment", "continue", exp, "--config", "searcher.max_length.batches=8")
    assert got.returncode == 0, got.stderr
    assert f"experiment {exp} continues to 8 batches" in got.stdout
    assert cluster.cli("experiment", "wait", exp, "-q").returncode == 0
    after = cluster.json("experiment", "describe", exp)
    assert after["state"] == "COMPLETED"
    assert after["config"]["searcher"]["max_length"] == {"batches": 8}  # stored: a restart knows
    (trial,) = after["trials"]
    assert (trial["id"], trial["total_batches"]) == (first["id"], 8)
    # Every batch trained once: the second run went on from batch 4 to 8.
    rows = cluster.json("trial", "metrics", str(trial["id"]), "--group", "training")
    assert [r["total_batches"] for r in rows] == [1, 2, 3, 4, 5, 6, 7, 8]
    checkpoints = cluster.json("checkpoint", "list", exp)
    latest = max(checkpoints, key=lambda c: c["total_batches"])
    assert (latest["total_batches"], latest["trial_id"], latest["run_id"]) == (8, trial["id"], 2)
    assert trial["latest_checkpoint"] == latest["uuid"]
    logs = cluster.cli("trial", "logs", str(trial["id"])).stdout
    assert before[0]["uuid"] in logs  # the second run restored the first one's checkpoint

    # Each bad case, one clear error: a change a continued trial cannot take, a length
    # not past its checkpoint, a live experiment, several trials, no checkpoint.
    bad = _fails(cluster, "experiment", "continue", exp, "--config", "hyperparameters.lr=0.5")
    assert "continue cannot change hyperparameters.lr: a continued trial keeps" in bad
    assert f"`assay experiment fork {exp} --config ...`" in bad
    again = _fails(cluster, "experiment", "continue", exp)
    assert "latest checkpoint is at batch 8: continue to a longer searcher.max_length" in again
    paused = cluster.json("experiment", "create", str(path), str(REGRESSION_DIR), "--paused")
    live = str(paused["id"])
    refused = _fails(cluster, "experiment", "continue", live)
    assert f"cannot continue experiment {live}: it is PAUSED" in refused
    cluster.cli("experiment", "kill", live)
    assert cluster.cli("experiment", "wait", live, "-q").returncode != 0  # CANCELED
    empty = _fails(cluster, "experiment", "continue", live, "--config", "max_restarts=2")
    assert "has no checkpoint to continue from: `assay experiment fork" in empty
    grid = cluster.json(
        "experiment",
        "create",
        str(path),
        str(REGRESSION_DIR),
        "--paused",
        "--config",
        "searcher={name: grid, metric: val_loss, max_length: {batches: 4}}",
        "--config",
        "hyperparameters.lr={type: categorical, vals: [0.01, 0.05]}",
    )
    cluster.cli("experiment", "kill", str(grid["id"]))
    cluster.cli("experiment", "wait", str(grid["id"]), "-q")
    several = _fails(cluster, "experiment", "continue", str(grid["id"]))
    assert "has 2 trials: continue applies to a single-trial experiment" in several
    assert "experiment 99999 does not exist" in _fails(cluster, "experiment", "continue", "99999")
    # The SDK's call is the same RPC: its refusal is the master's message.
    client.login(cluster.address, "admin", ADMIN_PASSWORD)
    with pytest.raises(AssayError, match="continue cannot change searcher.metric"):
        client.get_experiment(int(exp)).continue_training(16, config={"searcher": {"metric": "x"}})


def test_trial_kill_then_experiment_delete(
    cluster: Cluster, done: dict[str, Any], tmp_path: Path
) -> None:
    """`trial kill` ends one trial and the search goes on; `experiment delete` refuses a
    live experiment and a registered checkpoint, then deletes files and rows, and
    nothing of another experiment."""
    import time

    client.login(cluster.address, "admin", ADMIN_PASSWORD)
    config = regression_config(batches=200, scheduling_unit=20, checkpoint_period=100)
    config["name"] = "verbs-kill"
    config["searcher"]["name"] = "grid"
    config["hyperparameters"]["lr"] = {"type": "categorical", "vals": [0.01, 0.05]}
    path = tmp_path / "kill.yaml"
    path.write_text(yaml.safe_dump(config))
    exp = str(cluster.json("experiment", "create", str(path), str(REGRESSION_DIR))["id"])
    experiment = client.get_experiment(int(exp))
    deadline = time.monotonic() + 120
    running: list[client.Trial] = []
    while not running:  # one slot: one trial runs, the other waits for it
        assert time.monotonic() < deadline, "no trial started"
        running = [t for t in experiment.trials() if t.state == "RUNNING"]
        time.sleep(0.2)
    victim = running[0]
    killed = cluster.cli("trial", "kill", str(victim.id))
    assert killed.returncode == 0, killed.stderr
    assert f"trial {victim.id} of experiment {exp}" in killed.stdout
    assert experiment.wait(progress=False, timeout=240) == "COMPLETED"
    trials = {t["id"]: t for t in cluster.json("experiment", "describe", exp)["trials"]}
    assert trials.pop(victim.id)["state"] == "CANCELED"
    [other] = trials.values()
    assert (other["state"], other["total_batches"]) == ("COMPLETED", 200)
    with pytest.raises(AssayError, match=f"cannot kill trial {victim.id}: it has ended"):
        victim.kill()

    # Deletion: refused while it runs, and while a model version pins a checkpoint.
    created = cluster.json("experiment", "create", str(path), str(REGRESSION_DIR), "--paused")
    paused = str(created["id"])
    refused = _fails(cluster, "experiment", "delete", paused, "--yes")
    assert f"experiment {paused} is PAUSED: kill it first" in refused
    checkpoints = [c for c in cluster.json("checkpoint", "list", exp) if c["state"] == "COMPLETED"]
    assert checkpoints
    assert all(Path(c["location"]).is_dir() for c in checkpoints)
    assert cluster.cli("model", "create", "verbs-deleted").returncode == 0
    pinned = cluster.cli("model", "register-version", "verbs-deleted", checkpoints[0]["uuid"])
    assert pinned.returncode == 0, pinned.stderr
    in_use = _fails(cluster, "experiment", "delete", exp, "--yes")
    assert "registered as model 'verbs-deleted' version 1" in in_use
    assert cluster.json("experiment", "describe", exp)["state"] == "COMPLETED"
    assert all(Path(c["location"]).is_dir() for c in checkpoints)
    unpin = cluster.cli("model", "delete-version", "verbs-deleted", "1", "--yes")
    assert unpin.returncode == 0, unpin.stderr

    kept = cluster.json("checkpoint", "list", str(done["id"]))
    deleted = cluster.cli("experiment", "delete", exp, "--yes")
    assert deleted.returncode == 0, deleted.stderr
    assert f"deleted experiment {exp} and " in deleted.stdout
    assert not any(Path(c["location"]).exists() for c in checkpoints)
    assert f"experiment {exp} does not exist" in _fails(cluster, "experiment", "describe", exp)
    assert "does not exist" in _fails(cluster, "trial", "describe", str(other["id"]))
    uuid = checkpoints[0]["uuid"]
    assert "does not exist" in _fails(cluster, "checkpoint", "describe", uuid)
    assert int(exp) not in {e["id"] for e in cluster.json("experiment", "list", "--all")}
    # Nothing else is lost: another experiment's checkpoints, the model.
    assert cluster.json("checkpoint", "list", str(done["id"])) == kept
    assert all(Path(c["location"]).is_dir() for c in kept if c["state"] == "COMPLETED")
    assert cluster.json("model", "describe", "verbs-deleted")["name"] == "verbs-deleted"
    # The SDK's delete: the killed paused experiment, which has no checkpoints.
    assert cluster.cli("experiment", "kill", paused).returncode == 0
    stopped = client.get_experiment(int(paused))
    assert stopped.wait(progress=False, timeout=60) == "CANCELED"
    assert stopped.delete() == []
    assert "does not exist" in _fails(cluster, "experiment", "describe", paused)
