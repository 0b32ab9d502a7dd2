"""A cluster trial's process exits 78 for a failure every run would repeat, and only then.

Each case runs the harness as an agent does (`python -m assay._cluster` with a trial spec)
against a master address where nothing listens: these failures come before any call to
the master, and a failure that may pass (an OSError at import) must not be called
permanent. The master's side is `tests/lifecycle/test_run_outcome.py`; the whole path,
agent and master included, is `tests/e2e/test_fail_fast.py`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from assay._rank_processes import free_port
from assay.common.spec import ClusterSpec
from assay.errors import PERMANENT_ERROR_EXIT_CODE
from tests.conftest import REGRESSION_DIR, regression_config

TIMEOUT = 120


def _model(tmp_path: Path, extra: str = "") -> Path:
    model = tmp_path / "model"
    model.mkdir()
    shutil.copy(REGRESSION_DIR / "model_def.py", model / "model_def.py")
    if extra:
        with (model / "model_def.py").open("a") as f:
            f.write(extra)
    return model


def _run_slot(
    tmp_path: Path, model: Path, config: dict[str, Any], hparams: dict[str, Any] | None = None
) -> subprocess.CompletedProcess[str]:
    spec = ClusterSpec(
        config=config,
        hparams=hparams if hparams is not None else dict(config["hyperparameters"]),
        trial_seed=1,
        trial_id=1,
        run_id=1,
        experiment_id=1,
        allocation_id="a.1",
        checkpoint_root=str(tmp_path / "checkpoints"),
        restore_from=None,
        trial_api=f"127.0.0.1:{free_port()}",  # nothing listens: no call may be needed
        token="t",
    )
    path = tmp_path / "trial.json"
    spec.write(path)
    env = dict(
        os.environ,
        ASSAY_TRIAL_SPEC=str(path),
        ASSAY_MASTER_RETRY_S="0",
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_RANK="0",
        LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        PYTHONUNBUFFERED="1",
    )
    return subprocess.run(
        [sys.executable, "-m", "assay._cluster"],
        cwd=model,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def _last_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.strip().splitlines()
    assert lines, done.stdout
    return lines[-1]


def _config(**overrides: Any) -> dict[str, Any]:
    return {**regression_config(batches=8), **overrides}


def test_a_class_the_module_lacks_exits_78_naming_the_classes_there(tmp_path: Path) -> None:
    done = _run_slot(tmp_path, _model(tmp_path), _config(entrypoint="model_def:Nope"))
    assert done.returncode == PERMANENT_ERROR_EXIT_CODE, done.stderr
    last = _last_line(done)
    assert last.startswith("error: entrypoint 'model_def:Nope'"), last
    assert "RegressionTrial" in last


def test_an_import_error_in_the_model_definition_exits_78(tmp_path: Path) -> None:
    model = _model(tmp_path, "\nimport a_package_nobody_installed\n")
    done = _run_slot(tmp_path, model, _config())
    assert done.returncode == PERMANENT_ERROR_EXIT_CODE, done.stderr
    assert "No module named 'a_package_nobody_installed'" in _last_line(done)


def test_a_hyperparameter_of_the_wrong_type_exits_78_naming_the_users_frame(
    tmp_path: Path,
) -> None:
    config = _config()
    done = _run_slot(tmp_path, _model(tmp_path), config, {**config["hyperparameters"], "lr": "x"})
    assert done.returncode == PERMANENT_ERROR_EXIT_CODE, done.stderr
    last = _last_line(done)
    assert "constructing RegressionTrial failed" in last, last
    assert "make_optimizer (model_def.py:" in last
    assert "raised TypeError" in last
    # The logs keep the whole traceback, above the line.
    assert "Traceback (most recent call last)" in done.stderr


def test_a_script_that_does_not_compile_exits_78(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "train.py").write_text("def f(:\n")
    done = _run_slot(tmp_path, model, _config(entrypoint="python3 train.py"))
    assert done.returncode == PERMANENT_ERROR_EXIT_CODE, done.stderr
    assert "train.py does not compile" in _last_line(done)


@pytest.mark.parametrize(
    ("extra", "code"),
    [
        # It may pass on the next run (a file not there yet, a full disk): restarted.
        ("\nopen('/nonexistent/dataset.bin')\n", 2),
        # A script's own failure is its own: exit 1, restarted as before.
        (None, 1),
    ],
    ids=["oserror-at-import", "script-raises"],
)
def test_failures_that_may_pass_are_not_permanent(
    tmp_path: Path, extra: str | None, code: int
) -> None:
    if extra is None:
        model = tmp_path / "model"
        model.mkdir()
        (model / "train.py").write_text("raise RuntimeError('flaky')\n")
        config = _config(entrypoint="python3 train.py")
    else:
        model, config = _model(tmp_path, extra), _config()
    done = _run_slot(tmp_path, model, config)
    assert done.returncode == code, done.stderr
