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
    ChangedCheckpointError,
    CheckpointError,
    CheckpointMetadata,
    _sha256,
    load_user_state,
    new_uuid,
    verify_checkpoint,
    write_checkpoint,
)
from assay.errors import PermanentError
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


# --- the master's record: what a restore on a cluster verifies against -----------------------


def _recorded(path: Path) -> dict[str, str]:
    """A checkpoint's files as its trial reports them to the master (the manifest too)."""
    return {p.name: _sha256(p) for p in path.iterdir()}


def _forge(path: Path, name: str, payload: Any) -> None:
    """What a hostile trial does to another's checkpoint: write `name` and list it in the
    manifest with its true size and sha256, so that the manifest alone still verifies."""
    torch.save(payload, path / name)
    manifest = json.loads((path / "metadata.json").read_text())
    manifest["files"][name] = {"size": (path / name).stat().st_size, "sha256": _sha256(path / name)}
    (path / "metadata.json").write_text(json.dumps(manifest))


class _Payload:
    """A pickle that writes a file when it is loaded with full pickle."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (exec, (f"open({str(self.marker)!r}, 'w').write('ran')",))


def test_the_record_includes_the_manifest_as_written(tmp_path: Path) -> None:
    meta = _metadata()
    path = write_checkpoint(tmp_path, {"models": [{"w": torch.ones(3)}]}, meta)
    entry = meta.manifest_entry()
    assert entry.sha256 == _sha256(path / "metadata.json")
    assert entry.size == (path / "metadata.json").stat().st_size
    assert verify_checkpoint(path, _recorded(path)).uuid == meta.uuid


def test_a_planted_or_changed_file_is_refused_against_the_record(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path, {"models": [{"w": torch.ones(3)}]}, _metadata())
    recorded = _recorded(path)
    marker = tmp_path / "ran"
    _forge(path, "user_state.pt", {"x": _Payload(marker)})
    _forge(path, "models.pt", [{"w": torch.zeros(3)}])
    verify_checkpoint(path)  # the manifest alone is fooled

    with pytest.raises(CheckpointError) as refused:
        verify_checkpoint(path, recorded)

    message = str(refused.value)
    assert "user_state.pt is not in the record" in message
    assert "models.pt fails the recorded sha256" in message
    assert "metadata.json fails the recorded sha256" in message
    assert not marker.exists()


def test_a_changed_checkpoint_ends_the_trial_and_a_missing_file_may_be_retried(
    tmp_path: Path,
) -> None:
    """A file that differs from the record is a PermanentError (exit 78: the trial ends
    at once, naming how to resume from the checkpoint before it); one that is only
    missing is not (another run may reach storage this one could not)."""
    path = write_checkpoint(tmp_path, {"models": [{"w": torch.ones(3)}]}, _metadata())
    recorded = _recorded(path)
    (path / "models.pt").rename(tmp_path / "away.pt")
    with pytest.raises(CheckpointError, match="models.pt is missing") as missing:
        verify_checkpoint(path, recorded)
    assert not isinstance(missing.value, PermanentError)
    (tmp_path / "away.pt").rename(path / "models.pt")
    _forge(path, "models.pt", [{"w": torch.zeros(3)}])
    with pytest.raises(ChangedCheckpointError) as changed:
        verify_checkpoint(path, recorded)
    assert isinstance(changed.value, PermanentError)
    assert f"`assay checkpoint delete {path.name}` and then" in str(changed.value)


def test_a_missing_file_or_a_symlink_is_refused_against_the_record(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path, {"models": [{"w": torch.ones(3)}]}, _metadata())
    recorded = _recorded(path)
    (path / "models.pt").rename(tmp_path / "elsewhere.pt")
    (path / "models.pt").symlink_to(tmp_path / "elsewhere.pt")
    with pytest.raises(CheckpointError, match=r"models.pt is a symlink; models.pt is missing"):
        verify_checkpoint(path, recorded)


def test_a_record_without_the_manifest_still_pins_the_manifests_files(tmp_path: Path) -> None:
    """Checkpoints reported before the manifest was: its file list must be the record's."""
    path = write_checkpoint(tmp_path, {"models": [{"w": torch.ones(3)}]}, _metadata())
    recorded = {n: s for n, s in _recorded(path).items() if n != "metadata.json"}
    assert verify_checkpoint(path, recorded).files.keys() == {"models.pt"}
    manifest = json.loads((path / "metadata.json").read_text())
    manifest["files"]["user_state.pt"] = {"size": 1, "sha256": "0" * 64}
    (path / "metadata.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="metadata.json lists other files than the record"):
        verify_checkpoint(path, recorded)


def test_user_state_runs_no_code_when_it_is_loaded(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    path = write_checkpoint(tmp_path, {"user_state": {"x": _Payload(marker)}}, _metadata())
    with pytest.raises(CheckpointError, match=r"user_state.pt holds objects that load only by"):
        load_user_state(path)
    assert not marker.exists()


def test_user_state_keeps_plain_values_tensors_and_numpy_arrays(tmp_path: Path) -> None:
    import random
    from collections import OrderedDict

    import numpy as np

    state: dict[str, Any] = {
        "seen": 7,
        "names": ["a", "b"],
        "ordered": OrderedDict(b=2, a=1),
        "window": (1.5, None, True),
        "tensor": torch.arange(4),
        "generator": torch.Generator().manual_seed(3).get_state(),
        "python_rng": random.Random(5).getstate(),
        "numpy_rng": np.random.default_rng(4).bit_generator.state,
        "legacy_numpy_rng": np.random.RandomState(4).get_state(),
        "array": np.arange(6, dtype=np.float32).reshape(2, 3),
        "scalar": np.float64(0.25),
    }
    path = write_checkpoint(tmp_path, {"user_state": state}, _metadata())
    loaded = load_user_state(path)
    assert loaded.keys() == state.keys()
    assert loaded["ordered"] == state["ordered"]
    assert loaded["window"] == state["window"]
    assert torch.equal(loaded["generator"], state["generator"])
    assert loaded["python_rng"] == state["python_rng"]
    assert loaded["numpy_rng"] == state["numpy_rng"]
    assert np.array_equal(loaded["legacy_numpy_rng"][1], state["legacy_numpy_rng"][1])
    assert np.array_equal(loaded["array"], state["array"])
    assert loaded["scalar"] == 0.25


def test_a_trial_restored_against_the_record_continues_and_a_forged_one_is_refused(
    tmp_path: Path,
) -> None:
    """The Trial harness's own restore (`run_worker` with the master's record), as a slot
    on a cluster runs it: the same checkpoint restores, a forged copy of it does not."""
    from assay._worker import run_worker
    from assay.common.spec import WorkerSpec

    first = assay_run(regression_config(batches=8), tmp_path / "a", None)
    checkpoint = Path(str(first.checkpoint))
    assert (checkpoint / "user_state.pt").is_file()  # the fixture's Trial has user state
    recorded = _recorded(checkpoint)

    def resume() -> Any:
        spec = WorkerSpec(
            config=regression_config(batches=12),
            model_dir=str(REGRESSION_DIR),
            checkpoint_dir=str(tmp_path / "b"),
            resume_from=str(checkpoint),
            resume_sha256=recorded,
        )
        return run_worker(spec, env={})

    assert resume().total_batches == 12
    marker = tmp_path / "ran"
    _forge(checkpoint, "user_state.pt", {"seen": _Payload(marker)})
    with pytest.raises(CheckpointError, match=r"user_state.pt fails the recorded sha256"):
        resume()
    assert not marker.exists()


def assay_run(config: dict[str, Any], ckpt: Path, resume: str | None) -> Any:
    import assay

    return assay.run_local(
        config=config, model_dir=REGRESSION_DIR, checkpoint_dir=ckpt, resume_from=resume
    )
