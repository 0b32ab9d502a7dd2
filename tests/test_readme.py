"""The README's set-up commands are the ones CI and newcomers actually run, and the docs'
code runs as shown."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

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


def _installed_by(command: str) -> set[str]:
    """The distributions `pip install ... -e '.[EXTRAS]'` in `command` asks for by name:
    the ones it names, Assay's dependencies and those of the extras it names."""
    pip = command.split("pip install ", 1)[1].split(" && ")[0].split()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names: set[str] = {canonicalize_name(project["name"])}
    requirements = list(project["dependencies"])
    for word in pip:
        word = word.strip("'\"")
        if word.startswith(".["):
            for extra in word[2:-1].split(","):
                requirements += project["optional-dependencies"][extra.strip()]
        elif not word.startswith(("-", ".")):
            requirements.append(word)
    names |= {canonicalize_name(Requirement(r).name) for r in requirements}
    return names


def _examples_pointed_to() -> list[Path]:
    """The example folders the README names, and those named by the docs pages it links."""
    pages = [ROOT / "README.md"]
    readme = pages[0].read_text()
    pages += [ROOT / link for link in re.findall(r"\]\((docs/[\w/-]+\.md)", readme)]
    named = {m for page in pages for m in re.findall(r"examples/(\w+)", page.read_text())}
    return [ROOT / "examples" / name for name in sorted(named)]


def _imports(source: Path) -> set[str]:
    """The top-level modules a file imports (anywhere in it, absolute imports only)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_every_example_the_readme_points_to_runs_after_its_install_command() -> None:
    """An example whose imports the README's install does not bring fails at its first
    line (`No module named 'lightning'`): each module it imports must be the standard
    library's, its own folder's, or come from a distribution the command names."""
    installed = _installed_by(_first_command())
    providers = packages_distributions()
    examples = _examples_pointed_to()
    missing = []
    for folder in examples:
        local = {p.stem for p in folder.iterdir()}
        for source in sorted(folder.glob("*.py")):
            for module in sorted(_imports(source) - local - set(sys.stdlib_module_names)):
                dists = {canonicalize_name(d) for d in providers.get(module, [])}
                if not dists & installed:
                    missing.append(f"{source.relative_to(ROOT)}: {module} ({', '.join(dists)})")

    assert {e.name for e in examples} >= {"digits", "lightning", "core_api", "trainer_api"}
    assert missing == [], "not installed by the README's install command"


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
