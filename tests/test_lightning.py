"""`assay.lightning.AssayCallback` off the cluster: a plain `python3 train.py` and
`assay trial run-local`, on the Lightning example in examples/lightning (10 steps an
epoch, validated at each epoch's end, with Lightning's EarlyStopping and ModelCheckpoint).
On a cluster: tests/e2e/test_scripts.py (stopped at an ASHA rung, resumed when promoted)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

FIXTURE = Path(__file__).resolve().parent.parent / "examples" / "lightning"
TIMEOUT = 300

pytest.importorskip("lightning")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    shutil.copytree(FIXTURE, tmp_path / "project")
    return tmp_path / "project"


def _run(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASSAY_")}
    done = subprocess.run(
        [sys.executable, *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def _records(project: Path) -> list[dict[str, Any]]:
    lines = (project / "assay-metrics" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _checkpoints(project: Path) -> dict[int, Path]:
    found = {}
    for path in (project / "checkpoints").iterdir():
        if (path / "metadata.json").is_file():
            metadata = json.loads((path / "metadata.json").read_text())
            found[int(metadata["total_batches"])] = path
    return found


def test_a_plain_run_reports_checkpoints_and_validates_its_last_step(project: Path) -> None:
    done = _run(project, "train.py")

    records = _records(project)
    steps = {
        group: [r["steps_completed"] for r in records if r.get("group") == group]
        for group in ("training", "validation")
    }
    # Lightning validates at epoch ends (10, 20); max_steps 25 ends the third epoch early,
    # so the callback validates once more at 25, where a searcher's target would be.
    assert steps["validation"] == [10, 20, 25]
    assert steps["training"] == [5, 10, 15, 20, 25]
    validation = [r["metrics"] for r in records if r.get("group") == "validation"]
    assert set(validation[0]) == {"val_loss", "val_acc"}  # what validation_step logged
    training = [r["metrics"] for r in records if r.get("group") == "training"]
    assert set(training[0]) == {"train_loss"}
    assert sorted(_checkpoints(project)) == [10, 20, 25]
    assert all((p / "lightning.ckpt").is_file() for p in _checkpoints(project).values())
    assert "done at step 25" in done.stdout


def test_run_local_resumes_from_an_epochs_checkpoint_with_early_stopping(
    project: Path,
) -> None:
    # A checkpoint taken before EarlyStopping had ended its epoch made Lightning run that
    # end again on resume, without the metric: "Early stopping conditioned on metric
    # `val_loss` which is not available".
    cli = ["-m", "assay.cli.main", "trial", "run-local", "single.yaml", ".", "--json"]
    _run(project, *cli)
    at_20 = _checkpoints(project)[20]

    resumed = _run(project, *cli, "--resume-from", str(at_20))

    result = json.loads(resumed.stdout.splitlines()[-1])
    assert result["total_batches"] == 25
    assert set(result["validation_metrics"]) == {"val_loss", "val_acc"}
    assert "Restored all states from the checkpoint" in resumed.stderr
    assert "step 20 checkpoint" not in resumed.stderr  # not stored again at its own step
    assert "step 25 validation" in resumed.stderr
    # The metrics restored for EarlyStopping are not reported again as training's, and
    # the checkpoint's step (whose epoch end Lightning runs again) not again at all: a
    # master refuses a second report of a step with other values.
    trained = [line for line in resumed.stderr.splitlines() if " training: " in line]
    assert trained, resumed.stderr
    assert not any("val_" in line for line in trained), trained
    assert not any(line.startswith("step 20 ") for line in trained), trained


def test_a_resume_from_an_epochs_end_keeps_its_epoch_count_under_max_epochs(
    project: Path,
) -> None:
    """Lightning 2.6 resumed a checkpoint taken at an epoch's end one epoch too far when
    max_steps is set (as the callback has it): with max_epochs=3 and 10 steps an epoch,
    the resume from step 20 stopped at 21, "`max_epochs=3` reached"."""
    script = project / "train.py"
    text = script.read_text()
    limit = "max_steps=assay_cb.max_steps(default=25),"
    assert limit in text
    optimizer = "return torch.optim.SGD(self.parameters(), lr=self.lr)"
    assert optimizer in text
    seen = "self.trainer.max_steps, int(self.trainer.estimated_stepping_batches)"
    steps = f"print('optimizer for', {seen})"
    text = text.replace(optimizer, f"{steps}\n        {optimizer}")
    script.write_text(text.replace(limit, limit + " max_epochs=3,"))
    cli = ["-m", "assay.cli.main", "trial", "run-local", "single.yaml", ".", "--json"]
    _run(project, *cli)
    at_20 = _checkpoints(project)[20]

    resumed = _run(project, *cli, "--resume-from", str(at_20))

    assert json.loads(resumed.stdout.splitlines()[-1])["total_batches"] == 25
    assert "done at step 25" in resumed.stderr, resumed.stderr
    assert "`max_epochs=3` reached" not in resumed.stderr
    # The loops' restore is not step-based, max_steps itself stays: configure_optimizers
    # still sees it (a OneCycleLR's total_steps from estimated_stepping_batches).
    assert "optimizer for 25 25" in resumed.stderr


def test_two_ddp_slots_report_once_and_resume_together(project: Path) -> None:
    cli = ["-m", "assay.cli.main", "trial", "run-local", "single.yaml", ".", "--json"]
    first = _run(project, *cli, "--slots", "2")
    # 5 steps an epoch on each of 2 ranks (Lightning's distributed sampler).
    assert sorted(_checkpoints(project)) == [5, 10, 15, 20, 25]
    assert first.stderr.count("step 10 validation") == 1  # rank 0 reports

    resumed = _run(project, *cli, "--slots", "2", "--resume-from", str(_checkpoints(project)[10]))

    assert json.loads(resumed.stdout.splitlines()[-1])["total_batches"] == 25
    assert resumed.stderr.count("Restored all states from the checkpoint") >= 1
    validated = [s for s in (15, 20, 25) if f"step {s} validation" in resumed.stderr]
    assert validated == [15, 20, 25]
    assert "step 10 validation" not in resumed.stderr


VARIANT = """\
import lightning as L, torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
import assay.core
from assay.lightning import AssayCallback

g = torch.Generator().manual_seed(0)
x = torch.randn(160, 8, generator=g)
y = (x[:, 0] > 0).long()


class Data(L.LightningDataModule):
    def train_dataloader(self):
        return DataLoader(TensorDataset(x, y), batch_size=16)

    def val_dataloader(self):
        return DataLoader(TensorDataset(x[:40], y[:40]), batch_size=40)


class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(8, 2)

    def training_step(self, batch, i):
        loss = nn.functional.cross_entropy(self.net(batch[0]), batch[1])
        self.log("loss", loss)  # the same name in training and in validation
        return loss

    def validation_step(self, batch, i):
        self.log("loss", nn.functional.cross_entropy(self.net(batch[0]), batch[1]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


with assay.core.init() as core:
    cb = AssayCallback(core, report_every_n_steps=1)
    trainer = L.Trainer(
        max_steps=MAX_STEPS, accumulate_grad_batches=ACCUMULATE, callbacks=[cb],
        logger=False, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False,
    )
    cb.fit(trainer, Net(), Data())  # Lightning's fit(model, datamodule), positionally
"""


@pytest.mark.parametrize(
    ("max_steps", "accumulate", "validations", "trainings"),
    [
        # 10 batches an epoch: the run ends before the first epoch's validation
        (3, 1, [3], [1, 2, 3]),
        # 2 batches a step: 5 steps an epoch, validated at 5 and at the end, 7
        (7, 2, [5, 7], [1, 2, 3, 4, 5, 6, 7]),
    ],
    ids=["before-the-first-validation", "accumulating"],
)
def test_shared_names_datamodules_accumulation_and_short_runs(
    tmp_path: Path, max_steps: int, accumulate: int, validations: list[int], trainings: list[int]
) -> None:
    script = VARIANT.replace("MAX_STEPS", str(max_steps)).replace("ACCUMULATE", str(accumulate))
    (tmp_path / "train.py").write_text(script)

    _run(tmp_path, "train.py")

    records = _records(tmp_path)
    steps = {
        group: [r["steps_completed"] for r in records if r.get("group") == group]
        for group in ("training", "validation")
    }
    assert steps == {"training": trainings, "validation": validations}
    assert all(set(r["metrics"]) == {"loss"} for r in records if "group" in r)


def test_a_stop_asked_mid_epoch_checkpoints_there_without_validating(tmp_path: Path) -> None:
    # The cluster's stop (here asked at step 13 of an epoch of 10) needs a checkpoint, not
    # a validation: Lightning validates before an early stop unless told not to, which
    # cost a whole validation inside the agent's grace period.
    script = VARIANT.replace("MAX_STEPS", "25").replace("ACCUMULATE", "1")
    script = script.replace(
        "    cb.fit(trainer, Net(), Data())",
        "    core.preempt.should_preempt = lambda *a, **k: trainer.global_step >= 13\n"
        "    cb.fit(trainer, Net(), Data())",
    )
    (tmp_path / "train.py").write_text(script)

    _run(tmp_path, "train.py")

    records = _records(tmp_path)
    assert [r["steps_completed"] for r in records if r.get("group") == "validation"] == [10]
    assert sorted(_checkpoints(tmp_path)) == [10, 13]


def test_without_lightning_the_import_says_what_to_install() -> None:
    """The callback's module, in a Python without Lightning: one error naming the package
    to install, not a bare `No module named 'lightning'` from inside Assay."""
    blocked = "import sys; sys.modules['lightning'] = None; import assay.lightning"
    done = subprocess.run(
        [sys.executable, "-c", blocked], capture_output=True, text=True, timeout=60, check=False
    )

    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ModuleNotFoundError: assay.lightning needs Lightning"), last
    assert "pip install 'lightning>=2.4'" in last
    assert "examples" in last


VALIDATION = Path(__file__).resolve().parent / "fixtures" / "validation"


def _validate(tmp_path: Path, slots: int, n_val: int) -> dict[str, float]:
    """The metrics reported by `lightning_fit.py` (weights that stay as drawn: lr 0)."""
    import assay

    project = tmp_path / f"{n_val}-on-{slots}"
    shutil.copytree(VALIDATION, project, ignore=shutil.ignore_patterns("__pycache__"))
    config = {
        "name": "lightning-validation",
        "entrypoint": "python3 lightning_fit.py",
        "hyperparameters": {"n_val": n_val},
        "searcher": {"name": "single", "metric": "val_acc", "max_length": 2},
        "resources": {"slots_per_trial": slots},
        "max_restarts": 0,
    }
    result = assay.run_local(config=config, model_dir=project, checkpoint_dir=project / "c")
    assert result.total_batches == 2
    return result.validation_metrics


def test_validation_metrics_are_the_whole_sets_on_1_2_and_3_ddp_slots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same weights validated on 1, 2 and 3 DDP slots, in batches of 12, 6 and 4 over
    47 samples: rank 0's own mean (`val_loss`, logged without `sync_dist`) and
    Lightning's DistributedSampler, which pads 47 samples to 48 on 2 and 3 ranks (both
    metrics), made the reported metrics depend on the slots."""
    sys.path.insert(0, str(VALIDATION))
    from validation_trial import reference

    runs = {slots: _validate(tmp_path, slots, n_val=47) for slots in (1, 2, 3)}

    for name, value in reference(n_val=47).items():
        got = {slots: metrics[name] for slots, metrics in runs.items()}
        assert all(abs(v - value) <= 1e-6 for v in got.values()), (name, value, got)
    assert "count twice" not in capsys.readouterr().err
    # 50 samples on 3 ranks in batches of 4: unpadded shares of 17, 17 and 16 samples
    # would give the third rank a batch less, so Lightning's padding stays (sample 0
    # counted twice) and rank 0 says so; the reduction is still over all three ranks.
    padded = _validate(tmp_path, 3, n_val=50)
    for name, value in reference(n_val=50, repeat=1).items():
        assert padded[name] == pytest.approx(value, abs=1e-6), name
    err = capsys.readouterr().err
    assert "repeats 1 of the 50 samples so that the 3 ranks run as many batches" in err


def test_shares_go_unpadded_only_where_every_rank_gets_as_many_batches() -> None:
    from assay.lightning import _as_many_batches

    assert _as_many_batches(47, 3, 4, drop_last=False)  # 16, 16, 15 samples: 4 batches each
    assert not _as_many_batches(50, 3, 4, drop_last=False)  # 17, 17, 16: 5, 5, 4
    assert _as_many_batches(50, 3, 4, drop_last=True)  # 4 full batches each
    assert not _as_many_batches(2, 3, 1, drop_last=False)  # a rank without a sample
    assert not _as_many_batches(47, 3, None, drop_last=False)  # a batch sampler's own sizes
