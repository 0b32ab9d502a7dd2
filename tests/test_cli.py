"""`assay trial run-local` end to end, as a real subprocess on tiny model directories.

Good paths check the `--json` contract; bad paths check that a user mistake ends in one
`error:` line saying what to fix, a non-zero exit, and no Python traceback.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

TRACEBACK = "Traceback (most recent call last)"

# A linear regression on generated tensors: 256 training samples, 64 validation samples.
MODEL_DEF = """\
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from assay import Trial, TrialContext


def make_data(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1
    return TensorDataset(x, y)


class LinearTrial(Trial):
    def __init__(self, context: TrialContext) -> None:
        self.context = context
        self.model = context.wrap_model(nn.Linear(4, 1))
        self.optimizer = context.wrap_optimizer(
            torch.optim.SGD(self.model.parameters(), lr=context.get_hparam("lr"))
        )

    def build_training_data_loader(self) -> DataLoader[Any]:
        return DataLoader(
            make_data(256, 0),
            batch_size=self.context.get_per_slot_batch_size(),
            shuffle=True,
            drop_last=True,
        )

    def build_validation_data_loader(self) -> DataLoader[Any]:
        return DataLoader(make_data(64, 1), batch_size=16)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        x, y = batch
        loss = nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        return {"loss": loss}

    def evaluate_batch(self, batch: Any) -> dict[str, Any]:
        x, y = batch
        return {"validation_loss": nn.functional.mse_loss(self.model(x), y)}


def not_a_trial() -> None:
    pass
"""


def config_dict(**overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "name": "cli-test",
        "entrypoint": "model_def:LinearTrial",
        "hyperparameters": {"global_batch_size": 8, "lr": 0.05},
        "searcher": {
            "name": "single",
            "metric": "validation_loss",
            "max_length": {"batches": 20},
        },
        "scheduling_unit": 5,
        "reproducibility": {"experiment_seed": 3},
    }
    config.update(overrides)
    return config


def write_config(tmp_path: Path, name: str = "config.yaml", **overrides: Any) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config_dict(**overrides)))
    return path


def write_model(tmp_path: Path, source: str = MODEL_DEF, name: str = "model") -> Path:
    model_dir = tmp_path / name
    model_dir.mkdir()
    (model_dir / "model_def.py").write_text(source)
    return model_dir


def run_cli(cwd: Path, *args: str | Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """Run `assay ARGS` as a fresh interpreter in `cwd` (so ./checkpoints lands there)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.setdefault("OMP_NUM_THREADS", "2")
    return subprocess.run(
        [sys.executable, "-m", "assay.cli.main", *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def run_local(
    tmp_path: Path, config: Path, model_dir: Path, *extra: str | Path
) -> subprocess.CompletedProcess[str]:
    return run_cli(tmp_path, "trial", "run-local", config, model_dir, *extra)


def json_result(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The JSON object on the last line of stdout of a successful `--json` run."""
    assert proc.returncode == 0, f"exit {proc.returncode}\nstderr:\n{proc.stderr}"
    assert TRACEBACK not in proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines, f"nothing on stdout; stderr:\n{proc.stderr}"
    result = json.loads(lines[-1])
    assert isinstance(result, dict)
    return result


def user_error(proc: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """Check a failed run reported one `error:` message (no traceback); return the message.

    The message is the `error:` line plus the indented lines after it (an invalid config
    lists one problem per line); every fragment must be in it.
    """
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, f"exit 0\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert TRACEBACK not in output, f"a traceback was printed:\n{output}"
    lines = proc.stderr.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("error:")]
    assert len(starts) == 1, f"expected one line starting with 'error:' in stderr:\n{proc.stderr}"
    block = [lines[starts[0]]]
    for line in lines[starts[0] + 1 :]:
        if not line.startswith("  "):
            break
        block.append(line)
    message = "\n".join(block)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in the error message:\n{message}"
    return message


# --- good paths ------------------------------------------------------------------------


def test_run_local_json(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    model_dir = write_model(tmp_path)
    ckpt_root = tmp_path / "ckpts"

    proc = run_local(tmp_path, config, model_dir, "--json", "--checkpoint-dir", ckpt_root)

    result = json_result(proc)
    assert result["total_batches"] == 20
    metrics = result["validation_metrics"]
    assert isinstance(metrics, dict)
    assert "validation_loss" in metrics
    assert math.isfinite(metrics["validation_loss"])
    checkpoint = Path(result["checkpoint"])
    assert checkpoint.is_dir()
    assert (checkpoint / "metadata.json").is_file()
    assert checkpoint.resolve().parent == ckpt_root.resolve()
    # stdout holds the result only; the training log goes to stderr.
    assert proc.stdout.strip().splitlines() == [proc.stdout.strip().splitlines()[-1]]
    assert "validation" in proc.stderr
    assert "20" in proc.stderr


def test_run_local_human_output_and_default_checkpoint_dir(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    model_dir = write_model(tmp_path)

    proc = run_local(tmp_path, config, model_dir)

    assert proc.returncode == 0, proc.stderr
    assert "trained 20 batches; validation: validation_loss=" in proc.stdout
    checkpoint_lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("checkpoint: ")]
    assert len(checkpoint_lines) == 1
    checkpoint = Path(checkpoint_lines[0].removeprefix("checkpoint: "))
    assert (checkpoint / "metadata.json").is_file()
    assert checkpoint.resolve().parent == (tmp_path / "checkpoints").resolve()


@pytest.mark.slow
def test_run_local_resume_continues_from_checkpoint(tmp_path: Path) -> None:
    model_dir = write_model(tmp_path)
    first = json_result(run_local(tmp_path, write_config(tmp_path, "a.yaml"), model_dir, "--json"))
    longer = config_dict()
    longer["searcher"]["max_length"] = {"batches": 32}
    config = tmp_path / "b.yaml"
    config.write_text(yaml.safe_dump(longer))

    second = json_result(
        run_local(tmp_path, config, model_dir, "--json", "--resume-from", first["checkpoint"])
    )

    assert second["total_batches"] == 32
    assert second["checkpoint"] != first["checkpoint"]
    assert (Path(second["checkpoint"]) / "metadata.json").is_file()


@pytest.mark.slow
def test_run_local_two_slots_matches_one_slot(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    model_dir = write_model(tmp_path)

    one = json_result(run_local(tmp_path, config, model_dir, "--json", "--checkpoint-dir", "one"))
    proc = run_local(
        tmp_path, config, model_dir, "--json", "--slots", "2", "--checkpoint-dir", "two"
    )
    two = json_result(proc)

    assert two["total_batches"] == 20
    assert (Path(two["checkpoint"]) / "metadata.json").is_file()
    # 2 slots x 4 samples see exactly the batches of 1 slot x 8 samples.
    assert two["validation_metrics"]["validation_loss"] == pytest.approx(
        one["validation_metrics"]["validation_loss"], rel=1e-4
    )
    assert "[rank 0]" in proc.stderr  # the launched workers log through the parent


# --- bad paths: the model directory ----------------------------------------------------


def test_trial_file_import_fails(tmp_path: Path) -> None:
    source = MODEL_DEF.replace("import torch\n", "import torch\nimport nonexistent_module_xyz\n")
    line = source.splitlines().index("import nonexistent_module_xyz") + 1
    model_dir = write_model(tmp_path, source)

    proc = run_local(tmp_path, write_config(tmp_path), model_dir)

    user_error(proc, "nonexistent_module_xyz", "model_def.py", f"line {line}")


def test_trial_file_syntax_error(tmp_path: Path) -> None:
    source = MODEL_DEF + "\ndef broken(:\n    pass\n"
    line = source.splitlines().index("def broken(:") + 1
    model_dir = write_model(tmp_path, source)

    proc = run_local(tmp_path, write_config(tmp_path), model_dir)

    user_error(proc, "SyntaxError", "model_def.py", f"line {line}")


def test_trial_file_syntax_error_names_the_location_once(tmp_path: Path) -> None:
    source = MODEL_DEF + "\ndef broken(:\n    pass\n"
    line = source.splitlines().index("def broken(:") + 1
    model_dir = write_model(tmp_path, source)

    proc = run_local(tmp_path, write_config(tmp_path), model_dir)

    message = user_error(proc, "SyntaxError")
    assert message.count(f"line {line}") == 1, message


def test_entrypoint_names_missing_class(tmp_path: Path) -> None:
    config = write_config(tmp_path, entrypoint="model_def:LinerTrial")
    model_dir = write_model(tmp_path)

    proc = run_local(tmp_path, config, model_dir)

    message = user_error(proc, "LinerTrial", "model_def", "LinearTrial")
    assert "Trial classes there" in message


def test_entrypoint_names_something_that_is_not_a_trial(tmp_path: Path) -> None:
    config = write_config(tmp_path, entrypoint="model_def:not_a_trial")
    model_dir = write_model(tmp_path)

    proc = run_local(tmp_path, config, model_dir)

    user_error(proc, "not_a_trial", "assay.Trial")


def test_entrypoint_module_does_not_exist(tmp_path: Path) -> None:
    config = write_config(tmp_path, entrypoint="modeldef:LinearTrial")
    model_dir = write_model(tmp_path)

    proc = run_local(tmp_path, config, model_dir)

    user_error(proc, "'modeldef'", str(model_dir), "model_def")


def test_model_dir_does_not_exist(tmp_path: Path) -> None:
    proc = run_local(tmp_path, write_config(tmp_path), tmp_path / "no_such_dir")

    user_error(proc, "no_such_dir", "does not exist")


def test_undefined_hyperparameter(tmp_path: Path) -> None:
    source = MODEL_DEF.replace('get_hparam("lr")', 'get_hparam("missing")')
    model_dir = write_model(tmp_path, source)

    proc = run_local(tmp_path, write_config(tmp_path), model_dir)

    user_error(proc, "'missing'", "global_batch_size, lr")


@pytest.mark.slow
def test_undefined_hyperparameter_on_two_slots(tmp_path: Path) -> None:
    source = MODEL_DEF.replace('get_hparam("lr")', 'get_hparam("missing")')
    model_dir = write_model(tmp_path, source)

    proc = run_local(tmp_path, write_config(tmp_path), model_dir, "--slots", "2")

    user_error(proc, "'missing'", "global_batch_size, lr")


def test_searcher_metric_not_returned_by_evaluate_batch(tmp_path: Path) -> None:
    config = config_dict()
    config["searcher"]["metric"] = "accuracy"
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    model_dir = write_model(tmp_path)

    proc = run_local(tmp_path, path, model_dir)

    user_error(proc, "searcher.metric", "'accuracy'", "validation_loss")


# --- bad paths: the config -------------------------------------------------------------


def test_global_batch_size_not_divisible_by_configured_slots(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        hyperparameters={"global_batch_size": 9, "lr": 0.05},
        resources={"slots_per_trial": 2},
    )
    model_dir = write_model(tmp_path)

    proc = run_local(tmp_path, config, model_dir)

    user_error(
        proc,
        "hyperparameters.global_batch_size",
        "not divisible by resources.slots_per_trial (2)",
    )


def test_global_batch_size_not_divisible_by_slots_option(tmp_path: Path) -> None:
    model_dir = write_model(tmp_path)

    proc = run_local(tmp_path, write_config(tmp_path), model_dir, "--slots", "3")

    user_error(
        proc, "hyperparameters.global_batch_size", "8", "--slots 3 (resources.slots_per_trial)"
    )


def test_invalid_config(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        searcher={"name": "single", "metric": "validation_loss", "max_length": {"batch": 4}},
        resources={"priority": 0},
        schedulng_unit=5,
    )
    model_dir = write_model(tmp_path)

    proc = run_local(tmp_path, config, model_dir)

    user_error(
        proc,
        "searcher.max_length: expected {batches: int} or {epochs: int}",
        "resources.priority",
        "schedulng_unit: unknown key; did you mean 'scheduling_unit'?",
    )
    assert not (tmp_path / "checkpoints").exists()


def test_invalid_yaml(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("entrypoint: model_def:LinearTrial\nsearcher: [unclosed\n")
    model_dir = write_model(tmp_path)

    proc = run_local(tmp_path, config, model_dir)

    user_error(proc, str(config), "not valid YAML")


def test_missing_config_file(tmp_path: Path) -> None:
    model_dir = write_model(tmp_path)

    proc = run_local(tmp_path, tmp_path / "nope.yaml", model_dir)

    user_error(proc, "nope.yaml")


def test_slots_option_must_be_positive(tmp_path: Path) -> None:
    model_dir = write_model(tmp_path)

    proc = run_local(tmp_path, write_config(tmp_path), model_dir, "--slots", "0")

    assert proc.returncode != 0
    assert TRACEBACK not in proc.stderr
    assert "--slots" in proc.stderr


def test_the_run_local_banner_names_the_length_or_says_there_is_none() -> None:
    """A script's config may give the searcher no max_length (Determined 0.38's Core API
    configs); the banner says so instead of printing the unbounded target's number."""
    from assay._banner import banner
    from assay.config import parse_config

    config = {"entrypoint": "python3 train.py", "searcher": {"name": "single", "metric": "x"}}
    assert "1 slot on cpu, no max_length;" in banner(parse_config(config), device="cpu")
    config["searcher"]["max_length"] = {"batches": 20}  # type: ignore[index]
    assert "1 slot on cpu, 20 batches;" in banner(parse_config(config), device="cpu")
