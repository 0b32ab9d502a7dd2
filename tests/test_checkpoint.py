"""Checkpoints: atomic, verified, and a restore in a new process continues exactly."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from assay._checkpoint import (
    CheckpointError,
    CheckpointMetadata,
    _sha256,
    new_uuid,
    verify_checkpoint,
    write_checkpoint,
)
from tests.conftest import REGRESSION_DIR, regression_config

ROOT = Path(__file__).resolve().parent.parent


def _metadata() -> CheckpointMetadata:
    return CheckpointMetadata(
        uuid=new_uuid(),
        total_batches=3,
        epoch=0,
        batch_in_epoch=3,
        world_size=1,
        trial_id=1,
        hparams={"lr": 0.1},
    )


def test_written_checkpoint_has_a_manifest_that_verifies(tmp_path: Path) -> None:
    meta = _metadata()
    path = write_checkpoint(tmp_path, {"models": [{"w": torch.ones(3)}]}, meta)
    assert path == tmp_path / meta.uuid
    loaded = verify_checkpoint(path)
    assert loaded.files["models.pt"].size == (path / "models.pt").stat().st_size
    assert len(loaded.files["models.pt"].sha256) == 64
    assert [p.name for p in tmp_path.iterdir()] == [meta.uuid]  # no temp dir left


def test_corrupted_or_incomplete_checkpoints_are_refused(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path, {"models": [{"w": torch.ones(100)}]}, _metadata())
    data = bytearray((path / "models.pt").read_bytes())
    data[-20] ^= 0xFF
    (path / "models.pt").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="models.pt fails its sha256"):
        verify_checkpoint(path)
    (path / "models.pt").write_bytes(b"short")
    with pytest.raises(CheckpointError, match="models.pt has 5 bytes"):
        verify_checkpoint(path)
    (path / "models.pt").unlink()
    with pytest.raises(CheckpointError, match="models.pt is missing"):
        verify_checkpoint(path)
    with pytest.raises(CheckpointError, match="has no metadata.json"):
        verify_checkpoint(tmp_path)


def test_a_failed_write_leaves_nothing_behind(tmp_path: Path) -> None:
    class Unpicklable:
        def __reduce__(self) -> Any:
            raise RuntimeError("cannot pickle")

    with pytest.raises(RuntimeError, match="cannot pickle"):
        write_checkpoint(
            tmp_path, {"models": [{"w": torch.ones(1)}], "user": Unpicklable()}, _metadata()
        )
    assert list(tmp_path.iterdir()) == []


def test_a_newer_format_is_refused_with_what_to_do(tmp_path: Path) -> None:
    meta = _metadata()
    meta.format_version = 99
    path = write_checkpoint(tmp_path, {"models": []}, meta)
    manifest = json.loads((path / "metadata.json").read_text())
    manifest["shards"] = {"a field": "from the future"}
    (path / "metadata.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="upgrade Assay"):
        verify_checkpoint(path)


_RUN = textwrap.dedent(
    """
    import json, sys
    import assay
    config, model_dir, ckpt, resume = json.loads(sys.argv[1])
    result = assay.run_local(config=config, model_dir=model_dir, checkpoint_dir=ckpt,
                             resume_from=resume)
    print(json.dumps(result.to_dict()))
    """
)


def _run_in_new_process(config: dict[str, Any], ckpt: Path, resume: str | None) -> dict[str, Any]:
    args = json.dumps([config, str(REGRESSION_DIR), str(ckpt), resume])
    done = subprocess.run(
        [sys.executable, "-c", _RUN, args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _weights(checkpoint: str) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = torch.load(Path(checkpoint) / "models.pt", weights_only=True)[
        0
    ]
    return state


@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [
        # shuffled data, dropout (RNG), a per-batch LR schedule, crossing epochs (16/epoch)
        {"shuffle": True, "dropout": 0.2, "scheduler": "batch"},
        # fp16 loss scaling with accumulation: scaler state and boundaries survive
        {
            "shuffle": True,
            "dropout": 0.1,
            "precision": "fp16",
            "aggregation": 2,
            "scheduler": "optimizer_step",
        },
        # two slots: every rank's RNG and the sharded data position survive
        {"shuffle": True, "dropout": 0.2, "slots": 2, "scheduler": "epoch"},
        # the first run ends in the middle of an accumulation: partial gradients survive
        {"shuffle": True, "aggregation": 4, "n": 6},
        {"shuffle": True, "aggregation": 4, "n": 6, "slots": 2},
    ],
    ids=["fp32", "fp16-accumulation", "two-slots", "mid-accumulation", "mid-accumulation-ddp"],
)
def test_restore_in_a_new_process_continues_exactly(
    tmp_path: Path, options: dict[str, Any]
) -> None:
    n = 12
    common: dict[str, Any] = {"validation_period": n, "checkpoint_period": n, **options}
    straight = _run_in_new_process(regression_config(batches=2 * n, **common), tmp_path / "a", None)
    first = _run_in_new_process(regression_config(batches=n, **common), tmp_path / "b", None)
    resumed = _run_in_new_process(
        regression_config(batches=2 * n, **common), tmp_path / "b", first["checkpoint"]
    )

    assert resumed["total_batches"] == straight["total_batches"] == 2 * n
    a, b = _weights(straight["checkpoint"]), _weights(resumed["checkpoint"])
    assert all(torch.equal(a[k], b[k]) for k in a), "weights differ after restore"
    assert resumed["validation_metrics"] == straight["validation_metrics"]
    after = [r for r in straight["training_history"] if r["total_batches"] > n]
    assert resumed["training_history"] == after
    assert first["validation_history"] == [
        r for r in straight["validation_history"] if r["total_batches"] <= n
    ]


def test_restoring_into_a_different_model_says_so(tmp_path: Path) -> None:
    import assay

    first = assay.run_local(
        config=regression_config(batches=4), model_dir=REGRESSION_DIR, checkpoint_dir=tmp_path
    )
    path = Path(str(first.checkpoint))
    torch.save([{}], path / "lr_schedulers.pt")
    meta = json.loads((path / "metadata.json").read_text())
    # Keep the manifest consistent, so that the structural check is what fails.
    meta["files"]["lr_schedulers.pt"] = {
        "size": (path / "lr_schedulers.pt").stat().st_size,
        "sha256": _sha256(path / "lr_schedulers.pt"),
    }
    (path / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(assay.TrainingError, match="1 LR schedulers but the Trial wrapped 0"):
        assay.run_local(
            config=regression_config(batches=8),
            model_dir=REGRESSION_DIR,
            checkpoint_dir=tmp_path,
            resume_from=path,
        )


def _checkpoint_at(root: Path, total_batches: int) -> Path:
    for path in root.iterdir():
        if json.loads((path / "metadata.json").read_text())["total_batches"] == total_batches:
            return path
    raise AssertionError(f"no checkpoint at batch {total_batches} in {root}")


@pytest.mark.slow
@pytest.mark.parametrize("slots", [1, 2])
def test_a_pending_metrics_window_survives_a_periodic_checkpoint(
    tmp_path: Path, slots: int
) -> None:
    # Reports every 4 batches, checkpoints every 6: the checkpoint at 6 holds batches 5-6.
    config = regression_config(
        batches=12, scheduling_unit=4, checkpoint_period=6, shuffle=True, slots=slots
    )
    straight = _run_in_new_process(config, tmp_path / "a", None)
    middle = _checkpoint_at(tmp_path / "a", 6)
    resumed = _run_in_new_process(config, tmp_path / "b", str(middle))
    after = [r for r in straight["training_history"] if r["total_batches"] > 6]
    assert resumed["training_history"] == after
    assert [r["total_batches"] for r in after] == [8, 12]


def test_resuming_a_finished_trial_reports_its_last_metrics(tmp_path: Path) -> None:
    import assay

    first = assay.run_local(
        config=regression_config(batches=4), model_dir=REGRESSION_DIR, checkpoint_dir=tmp_path
    )
    again = assay.run_local(
        config=regression_config(batches=4),
        model_dir=REGRESSION_DIR,
        checkpoint_dir=tmp_path,
        resume_from=first.checkpoint,
    )
    assert again.total_batches == 4
    assert again.validation_metrics == first.validation_metrics


def test_restoring_another_architecture_is_one_clear_error(tmp_path: Path) -> None:
    import assay
    from tests.test_context import StreamTrial

    first = assay.run_local(
        config=regression_config(batches=4), model_dir=REGRESSION_DIR, checkpoint_dir=tmp_path
    )
    with pytest.raises(assay.TrainingError, match="does not fit this Trial's models"):
        assay.run_local(
            StreamTrial,
            regression_config(batches=8, global_batch_size=4),
            checkpoint_dir=tmp_path,
            resume_from=first.checkpoint,
        )


def test_an_unwritable_checkpoint_dir_fails_before_training(tmp_path: Path) -> None:
    import assay

    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(assay.AssayError, match="cannot write checkpoints to"):
        assay.run_local(
            config=regression_config(batches=4),
            model_dir=REGRESSION_DIR,
            checkpoint_dir=blocker / "sub",
        )
