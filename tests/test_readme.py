"""The README's set-up commands are the ones CI and newcomers actually run."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _bash_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", text, flags=re.S)]


def test_ci_runs_exactly_the_readme_test_command() -> None:
    test_command = next(b for b in _bash_blocks() if b.endswith("pytest"))
    ci_lines = [
        line
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.startswith(("#", "set ", "cd "))
    ]
    assert ci_lines == [test_command]


def test_readme_set_up_commands_install_the_cpu_torch_pin() -> None:
    setup = [b for b in _bash_blocks() if b.startswith("python3.11 -m venv")]
    assert len(setup) == 2
    for command in setup:
        assert "pip install torch==2.13.0 " in command


def test_example_command_names_files_that_exist() -> None:
    example = next(b for b in _bash_blocks() if "run-local" in b and b.startswith("python3.11"))
    config, model_dir = example.split("run-local ")[1].split()[:2]
    assert (ROOT / config).is_file()
    assert (ROOT / model_dir).is_dir()
