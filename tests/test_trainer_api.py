"""Determined's Trainer API (`assay.pytorch`): the digits port of its MNIST tutorial."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from assay import pytorch
from assay._local import run_local
from assay._rank_processes import free_port
from assay.common.spec import LOCAL_SPEC_ENV, LocalSpec
from assay.errors import AssayError, TrainingError, TrialLoadError

TRAINER_DIR = Path(__file__).parent / "fixtures" / "trainer"
EXIT_THREADS = Path(__file__).parent / "fixtures" / "exit_threads"
sys.path.insert(0, str(TRAINER_DIR))
import train as digits  # noqa: E402


@pytest.fixture(autouse=True)
def _off_cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in (
        "ASSAY_TRIAL_SPEC",
        "ASSAY_LOCAL_SPEC",
        "WORLD_SIZE",
        "RANK",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


def test_tutorial_in_process_trains_one_epoch_and_resumes(tmp_path: Path) -> None:
    result = digits.run(epochs=1)
    assert result is not None
    # 1,437 training images in batches of 32: 45 batches (the last one short).
    assert result["total_batches"] == 45
    assert result["validation_metrics"]["accuracy"] > 0.5
    checkpoint = Path(result["checkpoint"])
    assert checkpoint.parent == tmp_path / "checkpoints"
    # latest_checkpoint as a uuid under ./checkpoints: continues to the second epoch.
    again = digits.run(epochs=2, latest_checkpoint=checkpoint.name)
    assert again is not None
    assert again["total_batches"] == 90
    assert [v["total_batches"] for v in again["validation_history"]] == [90]
    # The StepLR (every epoch) went on from its checkpointed state: two steps in all.
    schedulers = torch.load(Path(again["checkpoint"]) / "lr_schedulers.pt", weights_only=True)
    assert schedulers[0]["last_epoch"] == 2


def test_load_trial_from_checkpoint_path(tmp_path: Path) -> None:
    result = digits.run(epochs=1)
    assert result is not None
    trial = pytorch.load_trial_from_checkpoint_path(
        result["checkpoint"], trial_class=digits.MNistTrial
    )
    assert isinstance(trial, digits.MNistTrial)
    images, labels = digits.digits(train=False).tensors
    with torch.no_grad():
        # The metric is the accuracy over the whole validation set (batch means weighted
        # by their number of images: the last batch of 32 is short).
        correct = (trial.model(images).argmax(1) == labels).float()
        accuracy = correct.mean().item()
    assert accuracy == pytest.approx(result["validation_metrics"]["accuracy"], abs=1e-6)
    with pytest.raises(TrialLoadError, match="trial_class"):
        pytorch.load_trial_from_checkpoint_path(result["checkpoint"])


def test_fit_arguments_are_checked(tmp_path: Path) -> None:
    with pytorch.init(hparams=digits.HPARAMS) as context:
        trainer = pytorch.Trainer(digits.MNistTrial(context, context.get_hparams()), context)
        with pytest.raises(AssayError, match=r"pytorch.Batch\(n\) or pytorch.Epoch\(n\)"):
            trainer.fit(max_length=10)  # type: ignore[arg-type]
        with pytest.raises(AssayError, match="checkpoint_policy"):
            trainer.fit(max_length=pytorch.Batch(1), checkpoint_policy="some")  # type: ignore[arg-type]
        with pytest.raises(AssayError, match="latest_checkpoint 'nope'"):
            trainer.fit(max_length=pytorch.Batch(1), latest_checkpoint="nope")
    with pytest.raises(ValueError, match="positive integer"):
        pytorch.Epoch(0)
    with pytest.raises(AssayError, match="pytorch.init"):
        pytorch.Trainer(digits.MNistTrial.__new__(digits.MNistTrial))


def test_minimal_config_step_zero_validation_and_policy_all(tmp_path: Path) -> None:
    class NoBatchSize(pytorch.PyTorchTrial):
        def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
            self.context = context
            self.model = context.wrap_model(torch.nn.Linear(1, 1))
            self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.1))

        def build_training_data_loader(self) -> pytorch.DataLoader[Any]:
            return pytorch.DataLoader(
                torch.utils.data.TensorDataset(torch.ones(6, 1)), batch_size=2
            )

        def build_validation_data_loader(self) -> pytorch.DataLoader[Any]:
            return pytorch.DataLoader(
                torch.utils.data.TensorDataset(torch.ones(2, 1)), batch_size=2
            )

        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> torch.Tensor:
            loss: torch.Tensor = self.model(batch[0]).pow(2).mean()
            self.context.backward(loss)
            self.context.step_optimizer(self.opt)
            return loss

        def evaluate_full_dataset(self, data_loader: pytorch.DataLoader[Any]) -> dict[str, Any]:
            return {"mine": float(sum(self.model(b[0]).sum() for b in data_loader))}

    with pytorch.init() as context:  # no hparams, no config: no searcher metric needed
        result = pytorch.Trainer(NoBatchSize(context), context).fit(
            max_length=pytorch.Epoch(2),
            validation_period=pytorch.Batch(2),
            checkpoint_policy="all",
            step_zero_validation=True,
        )
    assert result is not None
    assert [v["total_batches"] for v in result.validation_history] == [0, 2, 4, 6]
    kept = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    # 4 checkpoints, and the mark that keeps a plain run's ./checkpoints out of the archive
    assert len(kept) == 5
    assert kept[0] == ".assay-local-output"


def test_lr_scheduler_frequency_and_backward_passes_per_step(tmp_path: Path) -> None:
    from torch.optim.lr_scheduler import StepLR

    StepMode = pytorch.LRScheduler.StepMode  # noqa: N806

    class Stepped(pytorch.PyTorchTrial):
        """Two optimizers, each with a scheduler that steps every few of its events."""

        def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
            self.context = context
            self.model = context.wrap_model(torch.nn.Linear(1, 1))
            params = list(self.model.parameters())
            self.a = context.wrap_optimizer(torch.optim.SGD(params, lr=1.0))
            self.b = context.wrap_optimizer(
                torch.optim.SGD(params, lr=1.0), backward_passes_per_step=2
            )
            # Every 4th batch; and Determined's LRScheduler bringing its own frequency.
            context.wrap_lr_scheduler(
                StepLR(self.a, step_size=1, gamma=0.5), StepMode.STEP_EVERY_BATCH, frequency=4
            )
            context.wrap_lr_scheduler(
                pytorch.LRScheduler(
                    StepLR(self.b, step_size=1, gamma=0.5), StepMode.STEP_EVERY_EPOCH, frequency=2
                )
            )

        def build_training_data_loader(self) -> pytorch.DataLoader[Any]:
            data = torch.utils.data.TensorDataset(torch.ones(6, 1))
            return pytorch.DataLoader(data, batch_size=2)  # 3 batches an epoch

        def build_validation_data_loader(self) -> pytorch.DataLoader[Any]:
            return self.build_training_data_loader()

        def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> torch.Tensor:
            loss: torch.Tensor = self.model(batch[0]).pow(2).mean() * 1e-3
            self.context.backward(loss)
            self.context.step_optimizer(self.a)
            self.context.step_optimizer(self.b)
            return loss

        def evaluate_batch(self, batch: Any) -> dict[str, Any]:
            return {"validation_loss": self.model(batch[0]).pow(2).mean()}

    with pytorch.init() as context:
        result = pytorch.Trainer(Stepped(context), context).fit(max_length=pytorch.Epoch(4))
    assert result is not None
    assert result.total_batches == 12
    states = torch.load(Path(str(result.checkpoint)) / "lr_schedulers.pt", weights_only=True)
    # 12 batches: every 4th steps (3 steps); 4 epochs: every 2nd steps (2 steps).
    assert [s["last_epoch"] for s in states] == [3, 2]
    assert [s["_last_lr"] for s in states] == [[0.125], [0.25]]

    with pytorch.init() as context:
        model = context.wrap_model(torch.nn.Linear(1, 1))
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        with pytest.raises(TrainingError, match="backward_passes_per_step must be a positive"):
            context.wrap_optimizer(opt, backward_passes_per_step=0)
        with pytest.raises(TrainingError, match="frequency must be a positive integer"):
            context.wrap_lr_scheduler(StepLR(opt, step_size=1), frequency=0)


@pytest.mark.slow
def test_tutorial_as_a_script(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(TRAINER_DIR / "train.py"), "--epochs", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "ASSAY_TRIAL_SPEC"},
    )
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line.removeprefix("RESULT "))
    assert result["total_batches"] == 45
    assert Path(result["checkpoint"]).is_dir()


@pytest.mark.slow
def test_tutorial_on_two_slots_under_fsdp_checkpoints_sharded_and_resumes(tmp_path: Path) -> None:
    """torch.distributed (gloo) on two CPU processes, as torchrun would start them, under
    `optimizations.strategy: fsdp`: each rank writes its own shards into the checkpoint,
    which the tutorial then continues from on one slot (no FSDP)."""
    port = free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ)
        env.pop("ASSAY_TRIAL_SPEC", None)
        env.update(
            RANK=str(rank),
            WORLD_SIZE="2",
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
            PYTHONPATH=os.pathsep.join(
                [str(EXIT_THREADS), *filter(None, [os.environ.get("PYTHONPATH")])]
            ),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(TRAINER_DIR / "train.py"), "--strategy", "fsdp"],
                cwd=tmp_path,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    # FSDP's mesh and sharded models kept the Gloo group alive into the interpreter's
    # teardown, which aborted a finished rank now and then (exit status -6): no group
    # thread may be left when the teardown starts.
    for output in outputs:
        (left,) = [x for x in output.splitlines() if x.startswith("THREADS AT EXIT ")]
        assert "gloo" not in left, left
    results = [x for x in outputs[0].splitlines() if x.startswith("RESULT ")]
    assert not any(x.startswith("RESULT ") for x in outputs[1].splitlines())
    result = json.loads(results[0].removeprefix("RESULT "))
    # 16 per slot: each rank sees half the 1,437 images, 45 global batches an epoch.
    assert result["total_batches"] == 45
    assert result["validation_metrics"]["accuracy"] > 0.5
    checkpoint = Path(result["checkpoint"])
    shards = json.loads((checkpoint / "model-000" / "shards.json").read_text())
    assert (shards["world_size"], shards["strategy"]) == (2, "fsdp")
    assert {"__0_0.distcp", "__1_0.distcp"} <= set(shards["files"])
    assert not (checkpoint / "models.pt").exists()

    again = digits.run(epochs=2, latest_checkpoint=checkpoint.name, strategy="fsdp")
    assert again is not None
    assert again["total_batches"] == 90
    assert again["validation_metrics"]["accuracy"] > 0.5
    # The StepLR (every epoch) and the Trial's weights went on from the sharded checkpoint.
    schedulers = torch.load(Path(again["checkpoint"]) / "lr_schedulers.pt", weights_only=True)
    assert schedulers[0]["last_epoch"] == 2


def _tutorial_config(max_length: dict[str, int] | None, slots: int = 1) -> dict[str, Any]:
    """The tutorial script as `assay trial run-local` runs it: `fit(max_length=Epoch(2))`."""
    command = "python3 train.py --epochs 2"
    if slots > 1:
        command = "python3 -m determined.launch.torch_distributed " + command
    searcher: dict[str, Any] = {"name": "single", "metric": "validation_loss"}
    if max_length is not None:
        searcher["max_length"] = max_length
    return {
        "name": "trainer-run-local",
        "entrypoint": command,
        "hyperparameters": digits.HPARAMS,
        "searcher": searcher,
        "resources": {"slots_per_trial": slots},
        "max_restarts": 0,
    }


IGNORED = "fit(max_length=Epoch(2)) is ignored: run-local trains as a cluster would"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("slots", "max_length", "batches", "said"),
    [
        (1, {"batches": 20}, 20, "20 batches"),
        (2, {"batches": 20}, 20, "20 batches"),
        (1, {"records": 320}, 10, "10 batches"),  # 320 records in global batches of 32
        (2, {"epochs": 1}, 45, "1 epoch"),  # the training loader's length: 45 batches
    ],
)
def test_run_local_trains_the_configs_length_not_fits(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    slots: int,
    max_length: dict[str, int],
    batches: int,
    said: str,
) -> None:
    """As on a cluster, the searcher's length decides under run-local, on every rank; the
    script's own `fit(max_length=Epoch(2))` (90 batches) is ignored, and rank 0 says so."""
    config = _tutorial_config(max_length, slots)

    result = run_local(config=config, model_dir=TRAINER_DIR, checkpoint_dir=tmp_path / "c")

    assert result.total_batches == batches
    assert [v["total_batches"] for v in result.validation_history][-1] == batches
    output = capsys.readouterr().err
    (line,) = [line for line in output.splitlines() if IGNORED in line]
    assert line.endswith(f"to searcher.max_length ({said})"), line
    if slots > 1:
        assert line.startswith("[rank 0] ")


@pytest.mark.slow
def test_run_local_without_a_config_length_trains_fits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A script's config may leave out `searcher.max_length`: the script decides."""
    result = run_local(
        config=_tutorial_config(None), model_dir=TRAINER_DIR, checkpoint_dir=tmp_path / "c"
    )

    assert result.total_batches == 90
    assert "is ignored" not in capsys.readouterr().err


def _local_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: dict[str, Any]) -> None:
    """This process as run-local starts a script: `ASSAY_LOCAL_SPEC` names its spec."""
    spec = LocalSpec(
        config=config,
        hparams=dict(digits.HPARAMS),
        trial_seed=0,
        checkpoint_dir=str(tmp_path / "c"),
        metrics_path=str(tmp_path / "metrics.jsonl"),
    )
    spec.write(tmp_path / "spec.json")
    monkeypatch.setenv(LOCAL_SPEC_ENV, str(tmp_path / "spec.json"))


def test_under_run_local_the_config_length_wins_and_fit_is_still_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _local_spec(tmp_path, monkeypatch, _tutorial_config({"batches": 3}))
    caplog.set_level("INFO", logger="assay")
    with pytorch.init() as context:
        trainer = pytorch.Trainer(digits.MNistTrial(context, context.get_hparams()), context)
        with pytest.raises(AssayError, match=r"pytorch.Batch\(n\) or pytorch.Epoch\(n\)"):
            trainer.fit(max_length=10)  # type: ignore[arg-type]
        result = trainer.fit(max_length=pytorch.Batch(7))
    assert result is not None
    assert result.total_batches == 3
    ignored = [(r.levelname, r.getMessage()) for r in caplog.records]
    ignored = [(level, text) for level, text in ignored if "is ignored" in text]
    assert ignored == [
        (
            "WARNING",
            "fit(max_length=Batch(7)) is ignored: run-local trains as a cluster would, to "
            "searcher.max_length (3 batches)",
        )
    ]


def test_under_run_local_without_any_length_the_trial_decides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No length in the config nor in fit: as on a cluster, the trial trains until it
    asks to stop (`set_stop_requested`); `test_mode` trains one batch."""

    def stops_itself(context: pytorch.PyTorchTrialContext) -> pytorch.PyTorchTrial:
        trial = digits.MNistTrial(context, context.get_hparams())
        train_batch = trial.train_batch

        def stopping(batch: Any, epoch_idx: int, batch_idx: int) -> Any:
            if batch_idx == 4:
                context.set_stop_requested(True)
            return train_batch(batch, epoch_idx, batch_idx)

        trial.train_batch = stopping
        return trial  # type: ignore[no-any-return]

    _local_spec(tmp_path, monkeypatch, _tutorial_config(None))
    with pytorch.init() as context:
        trainer = pytorch.Trainer(stops_itself(context), context)
        result = trainer.fit()
        assert result is not None
        assert result.total_batches == 5
    with pytorch.init() as context:
        trainer = pytorch.Trainer(stops_itself(context), context)
        smoke = trainer.fit(max_length=pytorch.Batch(2), test_mode=True)
    assert smoke is not None
    assert smoke.total_batches == 1


def test_plain_python_trains_fits_length_over_exp_conf(tmp_path: Path) -> None:
    """Off-cluster and not under run-local, fit's `max_length` decides; the config's is
    what `fit()` without one trains, and with neither fit refuses."""
    exp_conf = {"searcher": {"metric": "validation_loss", "max_length": {"batches": 3}}}
    with pytorch.init(hparams=digits.HPARAMS, exp_conf=exp_conf) as context:
        trainer = pytorch.Trainer(digits.MNistTrial(context, context.get_hparams()), context)
        first = trainer.fit(max_length=pytorch.Batch(2))
        assert first is not None
        assert first.total_batches == 2
    with pytorch.init(hparams=digits.HPARAMS, exp_conf=exp_conf) as context:
        trainer = pytorch.Trainer(digits.MNistTrial(context, context.get_hparams()), context)
        second = trainer.fit()
        assert second is not None
        assert second.total_batches == 3
    with pytorch.init(hparams=digits.HPARAMS) as context:
        trainer = pytorch.Trainer(digits.MNistTrial(context, context.get_hparams()), context)
        with pytest.raises(AssayError, match="needs max_length"):
            trainer.fit()


def test_a_hyperparameter_asked_of_a_context_given_none_says_where_to_give_them() -> None:
    from assay.errors import HyperparameterError

    with pytorch.init() as context, pytest.raises(HyperparameterError) as raised:
        context.get_hparam("lr")
    assert "pytorch.init(hparams={...})" in str(raised.value)
    assert "(none)" not in str(raised.value)
