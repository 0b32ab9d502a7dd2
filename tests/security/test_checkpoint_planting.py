"""A trial runs its user's code, and every experiment's checkpoints may sit on one shared
storage: mallory's trial can reach alice's paused checkpoint, plant a pickle that runs
code when it is unpickled, change her weights, and rewrite the manifest to match. Alice's
restore must refuse that checkpoint, naming the files, and run none of it: it verifies
every file against the sha256s the master recorded when alice's trial reported the
checkpoint, and it loads no file with full pickle (real `assay-master` and `assay-agent`
processes; mallory's trial is a model definition written here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from assay.common.storage import checkpoint_uuid
from assay.master.checkpoints import recorded_sha256
from assay.master.store import CheckpointRecord
from assay.master.wire import master_message
from assay.proto import api_pb2, api_pb2_grpc
from tests.conftest import REGRESSION_DIR, regression_config
from tests.credentials import login
from tests.e2e.conftest import ROOT, Cluster, start_cluster, stop_cluster

pytestmark = pytest.mark.slow

PASSWORDS = {"alice": "alice-password-1234", "mallory": "mallory-password-1234"}

MALLORY_MODEL = '''
"""Looks like a model; its constructor goes through the shared checkpoint storage."""

import hashlib
import json
import os
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from assay import Trial


class Payload:
    """Unpickled with full pickle, it runs `code` in the process that loads it."""

    def __init__(self, code):
        self.code = code

    def __reduce__(self):
        return (exec, (self.code,))


def _sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def plant(root, marker):
    """Every checkpoint found: a payload as user_state.pt, zeroed weights, and the
    manifest rewritten so that it vouches for both."""
    planted = []
    # Each experiment's checkpoints are in root/<experiment id>: without isolation,
    # every one of them is in reach.
    found = [c for e in sorted(Path(root).iterdir()) if e.is_dir() for c in sorted(e.iterdir())]
    for checkpoint in found:
        manifest = checkpoint / "metadata.json"
        if not manifest.is_file():
            continue
        metadata = json.loads(manifest.read_text())
        payload = checkpoint / "user_state.pt"
        code = f"open({str(marker)!r}, 'w').write('in process ' + str(__import__('os').getpid()))"
        torch.save({"seen": Payload(code)}, payload)
        weights = checkpoint / "models.pt"
        models = torch.load(weights, weights_only=True)
        torch.save([{k: torch.zeros_like(v) for k, v in m.items()} for m in models], weights)
        for file in (payload, weights):
            metadata["files"][file.name] = {"size": file.stat().st_size, "sha256": _sha256(file)}
        manifest.write_text(json.dumps(metadata))
        planted.append(checkpoint.name)
    return planted


class Innocent(Trial):
    def __init__(self, context):
        self.context = context
        hp = context.get_hparams()
        spec = json.loads(Path(os.environ["ASSAY_TRIAL_SPEC"]).read_text())
        planted = plant(Path(spec["checkpoint_root"]).parent, hp["marker"])
        Path(hp["report"]).write_text(json.dumps(planted))
        self.model = context.wrap_model(nn.Linear(2, 1))
        self.optimizer = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.1))

    def _data(self):
        return DataLoader(TensorDataset(torch.ones(8, 2), torch.ones(8, 1)), batch_size=4)

    def build_training_data_loader(self):
        return self._data()

    def build_validation_data_loader(self):
        return self._data()

    def train_batch(self, batch, epoch_idx, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        return {"loss": loss}

    def evaluate_batch(self, batch):
        x, y = batch
        return {"val_loss": nn.functional.mse_loss(self.model(x), y)}
'''


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """One agent with one slot: mallory's trial runs while alice's is paused, on the
    default checkpoint storage every experiment shares."""
    c = start_cluster(tmp_path, None, agents=1, slots=1)
    try:
        with grpc.insecure_channel(c.address) as channel:
            api = api_pb2_grpc.ApiStub(channel)
            admin = (("authorization", f"Bearer {login(c.address)}"),)
            for user, password in PASSWORDS.items():
                request = api_pb2.CreateUserRequest(username=user, password=password)
                api.CreateUser(request, metadata=admin, timeout=30)
        yield c
    finally:
        stop_cluster(c)


def _as(cluster: Cluster, user: str, tmp: Path, *args: str) -> Any:
    """`assay ARGS` as `user`, with a login of their own: its last line, parsed as JSON
    when the command ends with `--json`."""
    env = dict(
        os.environ,
        ASSAY_USER=user,
        ASSAY_PASSWORD=PASSWORDS[user],
        ASSAY_AUTH_FILE=str(tmp / f"{user}-auth.json"),
    )
    done = subprocess.run(
        [sys.executable, "-m", "assay.cli.main", "-m", cluster.address, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    return json.loads(last) if args[-1] == "--json" else last


def _eventually(check: Callable[[], bool], timeout: float, cluster: Cluster, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached in {timeout:.0f} s:\n{cluster.dump_logs()}")
        time.sleep(0.5)


def _trial(cluster: Cluster, eid: int) -> dict[str, Any]:
    trials: list[dict[str, Any]] = cluster.json("experiment", "describe", str(eid))["trials"]
    return trials[0] if trials else {}


def test_a_checkpoint_planted_in_by_another_users_trial_is_refused(
    cluster: Cluster, tmp_path: Path
) -> None:
    # Alice trains, checkpoints every 50 batches, and pauses.
    config = regression_config(
        batches=300, validation_period=50, checkpoint_period=50, scheduling_unit=25, sleep_s=0.02
    )
    config["max_restarts"] = 0
    alice_config = tmp_path / "alice.yaml"
    alice_config.write_text(yaml.safe_dump(config))
    alice = int(
        _as(
            cluster,
            "alice",
            tmp_path,
            "e",
            "create",
            str(alice_config),
            str(REGRESSION_DIR),
            "--json",
        )["id"]
    )
    _eventually(
        lambda: _trial(cluster, alice).get("total_batches", 0) >= 50, 120, cluster, "a checkpoint"
    )
    _as(cluster, "alice", tmp_path, "e", "pause", str(alice))
    _eventually(lambda: _trial(cluster, alice).get("state") == "PAUSED", 60, cluster, "paused")
    paused = _trial(cluster, alice)
    [latest] = [
        c
        for c in cluster.json("checkpoint", "list", str(alice))
        if c["total_batches"] == paused["total_batches"]
    ]

    # Mallory's trial finds it on the shared storage and plants its payload.
    model_dir = tmp_path / "mallory"
    model_dir.mkdir()
    (model_dir / "model_def.py").write_text(MALLORY_MODEL)
    marker, report = tmp_path / "payload-ran", tmp_path / "planted.json"
    mallory_config = tmp_path / "mallory.yaml"
    mallory_config.write_text(
        yaml.safe_dump(
            {
                "name": "innocent",
                "entrypoint": "model_def:Innocent",
                "hyperparameters": {
                    "global_batch_size": 4,
                    "marker": str(marker),
                    "report": str(report),
                },
                "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": 2}},
                "max_restarts": 0,
            }
        )
    )
    mallory = int(
        _as(
            cluster,
            "mallory",
            tmp_path,
            "e",
            "create",
            str(mallory_config),
            str(model_dir),
            "--json",
        )["id"]
    )
    _eventually(
        lambda: _trial(cluster, mallory).get("state") in ("COMPLETED", "ERROR"),
        120,
        cluster,
        "mallory's trial",
    )
    assert latest["uuid"] in json.loads(report.read_text()), cluster.dump_logs()

    # Alice resumes: her trial refuses the checkpoint, and the payload never runs.
    _as(cluster, "alice", tmp_path, "e", "activate", str(alice))
    _eventually(
        lambda: _trial(cluster, alice).get("state") in ("ERROR", "COMPLETED"),
        120,
        cluster,
        "alice's end",
    )
    trial = _trial(cluster, alice)
    detail = cluster.json("trial", "describe", str(trial["id"]))
    assert not marker.exists(), f"the planted payload ran: {marker.read_text()}"
    assert trial["state"] == "ERROR", detail
    error = detail["last_error"]
    assert "is not the one the master recorded" in error, error
    for named in ("user_state.pt fails the recorded sha256", "models.pt fails the recorded sha256"):
        assert named in error, error
    logs = cluster.cli("trial", "logs", str(trial["id"])).stdout
    assert "user_state.pt fails the recorded sha256" in logs, logs[-3000:]


# --- the record, from the master's store to the harness's spec ----------------------------------


def test_the_start_of_a_run_carries_the_record_of_its_checkpoint() -> None:
    from assay.agent._allocation import trial_spec
    from assay.master.lifecycle import StartRun

    uuid = checkpoint_uuid("123e4567-e89b-42d3-a456-426614174000")
    record = CheckpointRecord(
        uuid=uuid,
        trial_id=1,
        run_id=1,
        total_batches=50,
        state="COMPLETED",
        location=f"/ckpts/{uuid}",
        files={"models.pt": 10, "metadata.json": 5},
        user_metadata={"sha256": {"models.pt": "a" * 64, "metadata.json": "b" * 64}},
    )
    sha = recorded_sha256(record)
    assert sha == {"models.pt": "a" * 64, "metadata.json": "b" * 64}
    start = StartRun(
        allocation_id="1.2.abc",
        trial_id=1,
        run_id=2,
        experiment_id=1,
        slots=(0,),
        ranks=(0,),
        world_size=1,
        master_addr="127.0.0.1",
        master_port=1,
        model_definition=b"",
        config_json="{}",
        checkpoint_uuid=uuid,
        checkpoint_location=record.location,
        trial_api="127.0.0.1:2",
        token="t",
        hparams_json="{}",
        trial_seed=1,
        checkpoint_root="/ckpts",
        checkpoint_sha256=sha,
    )
    spec = trial_spec(master_message(start).start)
    assert (spec.restore_from, spec.restore_sha256) == (record.location, sha)
    assert type(spec).from_dict(spec.to_dict()) == spec
    # An older row without sha256s: the harness keeps today's manifest check, with a warning.
    older = replace(record, user_metadata={})
    assert recorded_sha256(older) == {}
    unrecorded = replace(start, checkpoint_sha256={})
    assert trial_spec(master_message(unrecorded).start).restore_sha256 is None
