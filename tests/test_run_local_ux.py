"""What a person sees from a local run: a first line before torch loads, progress in a
Python session that configured no logging, and one line naming their frame on an error."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REGRESSION_DIR, regression_config

TIMEOUT = 180

BROKEN = """

class BrokenTrial(RegressionTrial):
    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        if batch_idx == 2:
            return {"loss": self.helper()}
        return super().train_batch(batch, epoch_idx, batch_idx)

    def helper(self) -> float:
        return 1 / 0  # the user's mistake
"""


@pytest.fixture
def model(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    shutil.copy(REGRESSION_DIR / "model_def.py", model / "model_def.py")
    with (model / "model_def.py").open("a") as f:
        f.write(BROKEN)
    return model


def _config(model: Path, **overrides: object) -> Path:
    config = {**regression_config(batches=8), "name": "ux", **overrides}
    path = model.parent / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _run_local(
    model: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    ckpt = ["--checkpoint-dir", str(model.parent / "checkpoints")]
    return subprocess.run(
        [sys.executable, "-m", "assay.cli.main", "trial", "run-local", *args, ".", *ckpt],
        cwd=model,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def _error_line() -> str:
    source = (REGRESSION_DIR / "model_def.py").read_text() + BROKEN
    lineno = source.splitlines().index("        return 1 / 0  # the user's mistake") + 1
    return f"helper (model_def.py:{lineno}) raised ZeroDivisionError: division by zero"


def test_the_first_line_comes_before_torch_is_imported(model: Path, tmp_path: Path) -> None:
    fake = tmp_path / "fake-site" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "import sys\nsys.stderr.write('importing torch\\n')\nraise ImportError('no torch')\n"
    )
    config = _config(model, hyperparameters={"global_batch_size": 16, "lr": 0.05, "n": 3})

    done = _run_local(model, str(config), env={"PYTHONPATH": str(fake.parent)})

    lines = done.stderr.splitlines()
    assert lines[0] == "run-local ux: 1 slot on cpu, 8 batches; global_batch_size=16 lr=0.05 n=3"
    assert "importing torch" in lines[1:], done.stderr


def test_an_error_in_the_users_code_ends_with_one_line_naming_their_frame(model: Path) -> None:
    config = _config(model, entrypoint="model_def:BrokenTrial")

    done = _run_local(model, str(config))

    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last == f"error: {_error_line()} (--verbose shows the traceback)"


def test_verbose_shows_the_whole_traceback_above_the_line(model: Path) -> None:
    config = _config(model, entrypoint="model_def:BrokenTrial")

    done = _run_local(model, str(config), "--verbose")

    assert done.returncode == 1
    assert "Traceback (most recent call last)" in done.stderr
    assert "assay/_controller.py" in done.stderr
    assert done.stderr.strip().splitlines()[-1] == f"error: {_error_line()}"


def test_on_several_slots_the_failing_rank_is_named_in_one_line(model: Path) -> None:
    config = _config(model, entrypoint="model_def:BrokenTrial")

    done = _run_local(model, str(config), "--slots", "2")

    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert re.fullmatch(rf"error: rank [01]: {re.escape(_error_line())}", last), done.stderr


@pytest.mark.parametrize("configured", [False, True], ids=["no-logging", "basicConfig"])
def test_run_local_from_python_shows_progress_once(model: Path, configured: bool) -> None:
    config = _config(model)
    setup = "import logging; logging.basicConfig(level=logging.INFO)\n" if configured else ""
    script = (
        f"{setup}import assay\n"
        f"r = assay.run_local(config={str(config)!r}, model_dir='.', checkpoint_dir='ck')\n"
        "print('trained', r.total_batches)\n"
    )

    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=model,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "trained 8"
    assert done.stderr.count("run-local ux: 1 slot on cpu, 8 batches") == 1, done.stderr
    assert done.stderr.count("batch 4 training: loss=") == 1, done.stderr
    assert done.stderr.count("batch 8 validation: ") == 1, done.stderr


def test_config_overrides_apply_as_for_experiment_create(model: Path) -> None:
    config = _config(model, hyperparameters={"global_batch_size": 16, "lr": 0.05, "n": 3})

    done = _run_local(
        model,
        str(config),
        "--config",
        "searcher.max_length.batches=4",
        "--config",
        "hyperparameters.lr=0.01",
        "--json",
    )
    typo = _run_local(model, str(config), "--config", "searcher.max_lenght.batches=4")
    not_pair = _run_local(model, str(config), "--config", "searcher")

    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[0] == (
        "run-local ux: 1 slot on cpu, 4 batches; global_batch_size=16 lr=0.01 n=3"
    )
    assert json.loads(done.stdout.splitlines()[-1])["total_batches"] == 4
    for refused in (typo, not_pair):
        assert refused.returncode == 1
        assert "Traceback" not in refused.stderr
    assert "max_lenght" in typo.stderr
    assert "is not KEY=VALUE" in not_pair.stderr


@pytest.mark.parametrize(("records", "warned"), [(100, True), (256, False), (250, False)])
def test_records_per_epoch_that_disagrees_with_the_loader_is_named(
    model: Path, records: int, warned: bool
) -> None:
    # 256 training records in batches of 16: 16 batches an epoch. A cluster converts a
    # length in epochs with records_per_epoch; run-local and periods count the loader's.
    config = _config(model, records_per_epoch=records)

    done = _run_local(model, str(config))

    assert done.returncode == 0, done.stderr
    said = f"records_per_epoch ({records}) makes an epoch" in done.stderr
    assert said is warned, done.stderr
    if warned:
        assert "7 batches of 16, but the training data loader gives 16" in done.stderr


MISMATCH = """\
import os, sys, time
if os.environ["RANK"] == "0":
    print("terminate called after throwing an instance of 'gloo::EnforceNotMet'", flush=True)
    print("  what():  [enforce fail at pair.cc:456] op.preamble.length <= op.nbytes. 4812 vs 4."
          " Received data size doesn't match expected size. Is there a distributed collective"
          " mismatch in your code?", flush=True)
    os.abort()
time.sleep(30)
"""


def test_a_rank_killed_by_a_collective_mismatch_gets_a_hint(tmp_path: Path) -> None:
    # `if rank == 0 and core.preempt.should_preempt()` pairs rank 0's vote with rank 1's
    # DDP all-reduce: Gloo aborts the process (-6) with its own words only.
    (tmp_path / "train.py").write_text(MISMATCH)
    config = tmp_path / "c.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "entrypoint": "python3 train.py",
                "searcher": {"name": "single", "metric": "x", "max_length": 10},
            }
        )
    )

    cli = [sys.executable, "-m", "assay.cli.main", "trial", "run-local"]
    done = subprocess.run(
        [*cli, str(config), ".", "--slots", "2"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )

    assert done.returncode == 1
    [line] = [x for x in done.stderr.splitlines() if x.startswith("error: ")]
    assert "exited with code -6; the ranks made different collective calls" in line
    assert "should_preempt()" in line
