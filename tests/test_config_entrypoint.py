"""A script's entrypoint written wrong gets one message, about the entrypoint: not the
rules of a Trial (`global_batch_size`, `hyperparameters` required) on top of it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from assay._rank_processes import free_port
from assay.config import parse_config
from assay.errors import InvalidConfigError

# The config a new user wrote for a Core API script (tests/sweep's noexe.yaml).
NO_INTERPRETER: dict[str, Any] = {
    "name": "det-core-const",
    "entrypoint": "train.py",
    "hyperparameters": {"lr": 0.05, "hidden": 64, "batch_size": 32},
    "searcher": {
        "name": "single",
        "metric": "validation_loss",
        "smaller_is_better": True,
        "max_length": {"batches": 200},
    },
    "max_restarts": 0,
}


def problems_of(data: Any, *, limits: bool = False) -> list[str]:
    with pytest.raises(InvalidConfigError) as info:
        parse_config(data, limits=limits)
    return info.value.problems


@pytest.mark.parametrize("limits", [False, True], ids=["local", "master"])
def test_a_script_named_without_an_interpreter_gets_one_message(limits: bool) -> None:
    problems = problems_of(NO_INTERPRETER, limits=limits)

    assert problems == ["entrypoint: 'train.py' is a file, not a command: write 'python3 train.py'"]


@pytest.mark.parametrize(
    ("entrypoint", "fragment"),
    [
        ("train.py", "write 'python3 train.py'"),
        ("./train.py", "write 'python3 ./train.py'"),
        (["train.py"], "write 'python3 train.py'"),
        ([], "non-empty strings"),
        (["python3", ""], "non-empty strings"),
        ("python3 'train.py", "cannot split"),
    ],
)
def test_a_wrong_command_is_judged_by_a_scripts_rules(entrypoint: Any, fragment: str) -> None:
    # No hyperparameters at all, as a script may have: only the entrypoint is wrong.
    data = {"entrypoint": entrypoint, "searcher": {"name": "single", "metric": "loss"}}

    problems = problems_of(data)

    assert len(problems) == 1, problems
    assert problems[0].startswith("entrypoint: ")
    assert fragment in problems[0]


def test_a_wrong_command_keeps_the_configs_other_problems() -> None:
    data = dict(NO_INTERPRETER, searcher={"name": "single"}, max_restarts=-1)

    problems = problems_of(data)

    assert problems[0].startswith("entrypoint: 'train.py' is a file")
    assert any(p.startswith("searcher.metric: ") for p in problems), problems
    assert any(p.startswith("max_restarts: ") for p in problems), problems
    assert not any("global_batch_size" in p for p in problems), problems


@pytest.mark.parametrize("entrypoint", ["model_def", "model_def.MyTrial", "model_def:"])
def test_a_wrong_trial_entrypoint_still_gets_a_trials_rules(entrypoint: str) -> None:
    data = dict(NO_INTERPRETER, entrypoint=entrypoint)

    problems = problems_of(data)

    assert problems[0].startswith("entrypoint: expected 'module:ClassName'")
    assert any(p.startswith("hyperparameters.global_batch_size: is required") for p in problems)


def test_the_fixed_entrypoint_is_accepted() -> None:
    config = parse_config(dict(NO_INTERPRETER, entrypoint="python3 train.py"))

    assert config.command == ("python3", "train.py")


@pytest.mark.parametrize(
    "command",
    [("trial", "run-local"), ("experiment", "create")],
    ids=["run-local", "create"],
)
def test_the_cli_prints_one_message(tmp_path: Path, command: tuple[str, ...]) -> None:
    config = tmp_path / "noexe.yaml"
    config.write_text(yaml.safe_dump(NO_INTERPRETER))
    (tmp_path / "train.py").write_text("print('never run')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASSAY_MASTER")}
    # No master answers there: the config is refused before any call to one.
    master = ["-m", f"127.0.0.1:{free_port()}"]

    done = subprocess.run(
        [sys.executable, "-m", "assay.cli.main", *master, *command, str(config), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )

    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        "error: invalid experiment config:",
        "  - entrypoint: 'train.py' is a file, not a command: write 'python3 train.py'",
    ]
    assert "never run" not in done.stdout
