"""The README's set-up commands are the ones CI and newcomers actually run, and the docs'
code runs as shown."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

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


def _first_command() -> str:
    return next(b for b in _bash_blocks() if b.startswith("python3.11"))


def test_the_first_command_runs_a_search_on_a_local_cluster() -> None:
    from assay.cli._deploy import DEMO_CONFIG, DEMO_MODEL_DIR

    first = _first_command()
    tail = first.split(" && ")[-1].split()
    assert tail[:4] == ["assay", "deploy", "local", "demo"]
    config, model_dir = tail[4:]
    assert (ROOT / config).is_file()
    assert (ROOT / model_dir).is_dir()
    assert "searcher:\n  name: adaptive_asha" in (ROOT / config).read_text()
    assert (Path(config), Path(model_dir)) == (DEMO_CONFIG, DEMO_MODEL_DIR)


def _python_block_after(heading: str, page: str) -> str:
    text = (ROOT / "docs" / page).read_text()
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return str(re.findall(r"```python\n(.*?)```", section, flags=re.S)[0])


@pytest.mark.slow
def test_use_a_trained_model_runs_as_shown(tmp_path: Path) -> None:
    """The docs' loading code, on a checkpoint of the digits example's const.yaml."""
    digits = ROOT / "examples" / "digits"
    run_local = [sys.executable, "-m", "assay.cli.main", "trial", "run-local", "const.yaml", "."]
    trained = subprocess.run(
        [*run_local, "--checkpoint-dir", str(tmp_path / "checkpoints"), "--json"],
        cwd=digits,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert trained.returncode == 0, trained.stderr
    checkpoint = json.loads(trained.stdout.strip().splitlines()[-1])["checkpoint"]
    code = _python_block_after("Use a trained model", "models.md")
    assert 'assay.load_checkpoint("UUID")' in code

    done = subprocess.run(
        [sys.executable, "-c", code.replace('"UUID"', repr(checkpoint))],
        cwd=digits,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    accuracy = float(done.stdout.strip().splitlines()[-1].removeprefix("accuracy "))
    assert accuracy >= 0.95  # the trained weights, not a fresh model's (about 0.1)
