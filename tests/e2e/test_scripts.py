"""End to end: script entrypoints through the Core API on a real master and two agents.

One cluster (two agents, one CPU slot each, a 3 s kill grace) serves every test here:
Determined's Core API tutorial ports on 1 slot and on 2 slots spanning both agents, an
adaptive ASHA search that stops scripts at a rung and resumes the promoted ones from their
checkpoints, a pause/activate that resumes at the exact step, a script that ignores the
stop request (killed after the grace, resumed from its latest checkpoint), and a script
that exits 0 early.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import SCRIPTS, Cluster, loop_config, start_cluster, stop_cluster

ROOT = Path(__file__).resolve().parent.parent.parent
CORE_EXAMPLES = ROOT / "examples" / "core_api"
TRAINER_EXAMPLE = ROOT / "examples" / "trainer_api"
WAIT_S = 300

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_cluster(
        tmp_path_factory.mktemp("scripts"),
        None,
        agents=2,
        slots=1,
        # The one host_path outside the master's root a test names (no agent can write it).
        master_env={"ASSAY_KILL_GRACE_S": "3", "ASSAY_SHARED_FS_HOST_PATHS": "/proc/nonexistent"},
    )
    try:
        yield c
    finally:
        stop_cluster(c)


def _create(cluster: Cluster, config: Path | dict[str, Any], model_dir: Path, tmp: Path) -> str:
    if isinstance(config, dict):
        path = tmp / "config.yaml"
        path.write_text(yaml.safe_dump(config))
        config = path
    created = cluster.json("experiment", "create", str(config), str(model_dir))
    return str(created["id"])


def _wait(cluster: Cluster, eid: str) -> dict[str, Any]:
    done = cluster.cli("experiment", "wait", eid, "--timeout", str(WAIT_S), timeout=WAIT_S + 60)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{cluster.dump_logs()}"
    described: dict[str, Any] = cluster.json("experiment", "describe", eid)
    return described


def _eventually(
    check: Callable[[], bool], cluster: Cluster, what: str, timeout: float = 120
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}\n{cluster.dump_logs()}")


def _steps(cluster: Cluster, trial_id: int, group: str) -> list[int]:
    rows = cluster.json("trial", "metrics", str(trial_id), "--group", group)
    return [int(r["total_batches"]) for r in rows]


def test_core_api_tutorial_ports_on_one_slot_and_on_two_agents(
    cluster: Cluster, tmp_path: Path
) -> None:
    one = _create(cluster, CORE_EXAMPLES / "metrics.yaml", CORE_EXAMPLES, tmp_path)
    two = _create(cluster, CORE_EXAMPLES / "checkpoints.yaml", CORE_EXAMPLES, tmp_path)

    for eid, x in ((one, 100.0), (two, 200.0)):
        described = _wait(cluster, eid)
        assert described["state"] == "COMPLETED", cluster.dump_logs()
        [trial] = described["trials"]
        assert trial["state"] == "COMPLETED"
        assert trial["restarts"] == 0
        validation = cluster.json("trial", "metrics", str(trial["id"]), "--group", "validation")
        assert validation[-1]["metrics"]["x"] == x
    # The 2-slot trial spanned both agents and stored a checkpoint every 10 steps.
    checkpoints = cluster.json("checkpoint", "list", two)
    assert sorted(c["total_batches"] for c in checkpoints)[-1] == 100
    trial_id = str(cluster.json("experiment", "describe", two)["trials"][0]["id"])
    logs = cluster.cli("trial", "logs", trial_id).stdout
    # Each report's line once, training too, as a run off the cluster prints them.
    for line in ("step 100 checkpoint", "step 100 training: x=", "step 100 validation: "):
        assert logs.count(line) == 1, logs[-2000:]


def test_trainer_api_port_on_one_slot_and_on_two_agents(cluster: Cluster, tmp_path: Path) -> None:
    one = _create(cluster, TRAINER_EXAMPLE / "const.yaml", TRAINER_EXAMPLE, tmp_path)
    two = _create(cluster, TRAINER_EXAMPLE / "distributed.yaml", TRAINER_EXAMPLE, tmp_path)

    for eid in (one, two):
        described = _wait(cluster, eid)
        assert described["state"] == "COMPLETED", cluster.dump_logs()
        [trial] = described["trials"]
        assert trial["total_batches"] == 90
        assert trial["restarts"] == 0
        validation = cluster.json("trial", "metrics", str(trial["id"]), "--group", "validation")
        assert [int(r["total_batches"]) for r in validation] == [20, 40, 60, 80, 90]
        assert validation[-1]["metrics"]["accuracy"] > 0.8
        # The harness logs each validation and checkpoint once (its backend echoes none).
        logs = cluster.cli("trial", "logs", str(trial["id"])).stdout
        assert logs.count("batch 40 validation: ") == 1, logs[-3000:]
        assert logs.count("batch 90 checkpoint: ") == 1, logs[-3000:]


def test_determineds_launcher_with_a_trial_class(cluster: Cluster, tmp_path: Path) -> None:
    digits = ROOT / "examples" / "digits"
    config = yaml.safe_load((digits / "const.yaml").read_text())
    config["entrypoint"] = (
        "python3 -m determined.launch.torch_distributed --trial model_def:DigitsTrial"
    )
    config["searcher"]["max_length"] = {"batches": 20}
    config.pop("min_validation_period", None)
    config.pop("min_checkpoint_period", None)

    described = _wait(cluster, _create(cluster, config, digits, tmp_path))

    assert described["state"] == "COMPLETED", cluster.dump_logs()
    [trial] = described["trials"]
    assert trial["total_batches"] == 20


TENSORBOARD_TRIAL = """
import torch
from torch.utils.data import DataLoader, TensorDataset

from assay import Trial


def data():
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    return TensorDataset(x, x.sum(1, keepdim=True))


class TBTrial(Trial):
    def __init__(self, context):
        self.context = context
        self.model = context.wrap_model(torch.nn.Linear(4, 1))
        self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.05))

    def build_training_data_loader(self):
        return DataLoader(data(), batch_size=self.context.get_per_slot_batch_size())

    def build_validation_data_loader(self):
        return DataLoader(data(), batch_size=16)

    def train_batch(self, batch, epoch_idx, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        self.context.get_tensorboard_writer().add_scalar("train/loss", loss.item(), batch_idx)
        return {"loss": loss}

    def evaluate_batch(self, batch):
        x, y = batch
        return {"loss": torch.nn.functional.mse_loss(self.model(x), y)}
"""


def test_tensorboard_events_are_kept_and_downloaded(cluster: Cluster, tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    model = tmp_path / "model"
    model.mkdir()
    (model / "model_def.py").write_text(TENSORBOARD_TRIAL)
    config = loop_config()
    config.update(
        entrypoint="model_def:TBTrial",
        hyperparameters={"global_batch_size": 8},
        searcher={"name": "single", "metric": "loss", "max_length": {"batches": 12}},
    )

    described = _wait(cluster, _create(cluster, config, model, tmp_path))

    assert described["state"] == "COMPLETED", cluster.dump_logs()
    trial_id = str(described["trials"][0]["id"])
    target = tmp_path / "tb"
    done = cluster.cli("trial", "download-tensorboard", trial_id, str(target))
    assert done.returncode == 0, done.stderr
    assert f"tensorboard --logdir {target}" in done.stdout
    events = EventAccumulator(str(target))
    events.Reload()
    steps = [e.step for e in events.Scalars("train/loss")]
    assert steps == list(range(12))
    again = cluster.cli("trial", "download-tensorboard", trial_id, str(target))
    assert again.returncode == 1
    assert "not empty" in again.stderr


def test_adaptive_asha_stops_scripts_at_a_rung_and_resumes_the_promoted(
    cluster: Cluster, tmp_path: Path
) -> None:
    config = CORE_EXAMPLES / "adaptive_asha.yaml"
    plan = cluster.json("preview-search", str(config))
    rungs = [rung["length"] for rung in plan["brackets"][0]["rungs"]]
    assert rungs == [20, 80]

    described = _wait(cluster, _create(cluster, config, CORE_EXAMPLES, tmp_path))

    assert described["state"] == "COMPLETED", cluster.dump_logs()
    trials = described["trials"]
    assert len(trials) == 6
    assert all(t["state"] == "COMPLETED" and t["restarts"] == 0 for t in trials), trials
    stopped = [t for t in trials if t["total_batches"] == 20]
    promoted = [t for t in trials if t["total_batches"] == 80]
    assert stopped, trials
    assert promoted, trials
    resumed = 0
    for trial in promoted:
        # Promoted while running (it trains on), or stopped at the rung and resumed from
        # its checkpoint there: either way no step trained twice, none skipped.
        training = _steps(cluster, trial["id"], "training")
        assert training == list(range(10, 81, 10)), training
        logs = cluster.cli("trial", "logs", str(trial["id"])).stdout
        if "stopping at step 20" in logs:
            assert "resumed at step 20" in logs, logs[-2000:]
            resumed += 1
    for trial in stopped:
        assert _steps(cluster, trial["id"], "training") == [10, 20]
        logs = cluster.cli("trial", "logs", str(trial["id"])).stdout
        assert "stopping at step 20" in logs, logs[-2000:]


def test_pause_and_activate_resume_a_script_at_the_exact_step(
    cluster: Cluster, tmp_path: Path
) -> None:
    eid = _create(cluster, loop_config(steps=400, sleep=0.02, every=10), SCRIPTS, tmp_path)
    _eventually(
        lambda: any(
            s >= 30
            for t in cluster.json("experiment", "describe", eid)["trials"]
            for s in [t["total_batches"]]
        ),
        cluster,
        "the first reports",
    )
    assert cluster.cli("experiment", "pause", eid).returncode == 0
    _eventually(
        lambda: cluster.json("experiment", "describe", eid)["trials"][0]["state"] == "PAUSED",
        cluster,
        "the trial paused",
    )
    trial = cluster.json("experiment", "describe", eid)["trials"][0]
    stopped_at = trial["total_batches"]
    assert 30 <= stopped_at < 400
    assert max(c["total_batches"] for c in cluster.json("checkpoint", "list", eid)) == stopped_at
    # A `single` search's progress is its trial's batches (it read 0% until the end).
    progress = cluster.json("experiment", "describe", eid)["progress"]
    assert progress == pytest.approx(stopped_at / 400, abs=0.011)
    assert cluster.cli("experiment", "activate", eid).returncode == 0

    described = _wait(cluster, eid)

    assert described["state"] == "COMPLETED", cluster.dump_logs()
    [trial] = described["trials"]
    assert trial["restarts"] == 0
    assert _steps(cluster, trial["id"], "training") == list(range(10, 401, 10))
    logs = cluster.cli("trial", "logs", str(trial["id"])).stdout
    assert f"preempted at step {stopped_at}" in logs
    assert f"resumed at step {stopped_at}" in logs


def test_a_script_that_ignores_the_stop_is_killed_after_the_grace_and_resumes(
    cluster: Cluster, tmp_path: Path
) -> None:
    config = loop_config(steps=300, sleep=0.02, every=10, ignore_preempt=True)
    eid = _create(cluster, config, SCRIPTS, tmp_path)
    _eventually(
        lambda: cluster.json("experiment", "describe", eid)["trials"][0]["total_batches"] >= 30,
        cluster,
        "the first reports",
    )
    started = time.monotonic()
    assert cluster.cli("experiment", "pause", eid).returncode == 0
    _eventually(
        lambda: cluster.json("experiment", "describe", eid)["trials"][0]["state"] == "PAUSED",
        cluster,
        "the trial paused",
    )
    assert time.monotonic() - started >= 2.5  # it ran on until the grace was over
    latest = max(c["total_batches"] for c in cluster.json("checkpoint", "list", eid))
    assert cluster.cli("experiment", "activate", eid).returncode == 0

    described = _wait(cluster, eid)

    assert described["state"] == "COMPLETED", cluster.dump_logs()
    trial_id = described["trials"][0]["id"]
    logs = cluster.cli("trial", "logs", str(trial_id)).stdout
    assert f"resumed at step {latest}" in logs, logs[-3000:]
    training = _steps(cluster, trial_id, "training")
    assert training == sorted(set(training))
    assert training[-1] == 300


def test_a_script_that_exits_0_before_its_target_ends_completed_without_restarts(
    cluster: Cluster, tmp_path: Path
) -> None:
    config = loop_config(steps=20, every=5)
    config["searcher"]["max_length"] = {"batches": 100}

    described = _wait(cluster, _create(cluster, config, SCRIPTS, tmp_path))

    assert described["state"] == "COMPLETED", cluster.dump_logs()
    [trial] = described["trials"]
    assert trial["restarts"] == 0
    assert trial["total_batches"] == 20
    logs = cluster.cli("trial", "logs", str(trial["id"])).stdout
    assert "before its searcher target 100" in logs, logs[-2000:]


def test_a_worker_that_reports_fails_the_trial_with_the_reason(
    cluster: Cluster, tmp_path: Path
) -> None:
    script = tmp_path / "model"
    script.mkdir()
    (script / "bad.py").write_text(
        "import assay.core\n"
        "with assay.core.init() as core:\n"
        "    core.train.report_training_metrics(1, {'loss': 1.0})\n"
    )
    config = loop_config(steps=10)
    config.update(entrypoint="python3 bad.py", max_restarts=0)
    config["resources"] = {"slots_per_trial": 2}

    described = _wait_any(cluster, _create(cluster, config, script, tmp_path))

    assert described["state"] == "ERROR"
    [trial] = described["trials"]
    assert "only the chief (rank 0) reports" in (trial.get("last_error") or ""), trial


def _wait_any(cluster: Cluster, eid: str) -> dict[str, Any]:
    cluster.cli("experiment", "wait", eid, "--timeout", str(WAIT_S), timeout=WAIT_S + 60)
    described: dict[str, Any] = cluster.json("experiment", "describe", eid)
    return described


@pytest.mark.parametrize("kind", ["script", "trial"])
def test_a_host_path_no_agent_can_write_fails_before_training_and_names_the_setting(
    cluster: Cluster, tmp_path: Path, kind: str
) -> None:
    # Before: the trial trained, then failed at its first checkpoint with a bare
    # "FileNotFoundError: ... '/proc/nonexistent'", and each restart trained again; a
    # `single` search's progress read 99%.
    from tests.conftest import REGRESSION_DIR, regression_config

    storage = {"type": "shared_fs", "host_path": "/proc/nonexistent"}
    if kind == "script":
        config, model_dir = loop_config(steps=20, every=5), SCRIPTS
    else:
        config, model_dir = regression_config(batches=20), REGRESSION_DIR
    config = {**config, "checkpoint_storage": storage, "max_restarts": 0}
    eid = _create(cluster, config, model_dir, tmp_path)
    done = cluster.cli("experiment", "wait", eid, "--timeout", str(WAIT_S), timeout=WAIT_S + 60)
    described = cluster.json("experiment", "describe", eid)

    assert done.returncode != 0
    [trial] = described["trials"]
    assert trial["state"] == "ERROR", cluster.dump_logs()
    # A Trial fails before its first batch; a script (which may never store a checkpoint)
    # is warned at init and fails at its first checkpoint, after 5 steps.
    assert trial["total_batches"] == (5 if kind == "script" else 0)
    assert described["progress"] == pytest.approx(trial["total_batches"] / 20, abs=0.011)
    assert "cannot write checkpoints to /proc/nonexistent" in trial["last_error"]
    assert (
        "checkpoint_storage.host_path (/proc/nonexistent) must be a directory"
        in (trial["last_error"])
    )


def test_a_lightning_trainer_with_assays_callback_is_stopped_at_a_rung_and_resumed(
    cluster: Cluster, tmp_path: Path
) -> None:
    # assay.lightning.AssayCallback: reports Lightning's logged metrics; the first trial
    # (the better lr, seed 0) stops at the rung (20 steps, 2 epochs) at a checkpoint and
    # waits for the second, one trial at a time; promoted, it resumes from that
    # checkpoint (Lightning restores its own state, EarlyStopping's too) and trains to 40.
    lightning_dir = ROOT / "examples" / "lightning"
    eid = _create(cluster, lightning_dir / "asha.yaml", lightning_dir, tmp_path)
    described = _wait(cluster, eid)
    assert described["state"] == "COMPLETED", cluster.dump_logs()
    trials = sorted(described["trials"], key=lambda t: t["total_batches"])
    assert [t["total_batches"] for t in trials] == [20, 40]
    assert all(t["restarts"] == 0 for t in trials)
    top = trials[-1]
    assert _steps(cluster, top["id"], "validation") == [10, 20, 30, 40]
    assert _steps(cluster, top["id"], "training")[:2] == [5, 10]
    logs = cluster.cli("trial", "logs", str(top["id"])).stdout
    assert "Restored all states from the checkpoint" in logs, logs[-3000:]
    assert "Traceback" not in logs, logs[-3000:]
