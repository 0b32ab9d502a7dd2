"""Run the unit tier on every supported Python found on this machine.

    python scripts/pythons.py [--python PATH ...] [--only VERSION ...] [-- PYTEST ARGS]

The interpreters are Debian's (`/usr/bin/python3.X`), pyenv's versions and `python3.X` on
PATH, one per release: Debian's 3.11.2 and a current 3.11 are two. For each, a venv under
`build/pythons/<version>` gets the project (editable) and its dev extras. A stamp holds a
hash of pyproject.toml, of the torch wheel and of this recipe: a venv whose stamp matches
is used as it is, without pip; one whose stamp differs gets pip's install again, into the
same venv (seconds when little changed). Then `pytest -m unit -p no:cacheprovider -q`
runs there, and one line per Python sums it up at the end. The exit status is non-zero
when any Python failed.

torch is installed from a CPU wheel built for the interpreter (`torch-*-cpXY-*.whl` in
`ASSAY_TORCH_WHEELS`, by default /opt/wheels). PyPI's Linux torch is a CUDA build of
several GB, so where no such wheel exists torch is not installed at all (a constraint
stops anything from pulling it in), nor is lightning, which needs it; the tests that
import either are then skipped, each with the reason that names the missing wheel (this
file is also that pytest plugin).
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import importlib.abc
import importlib.machinery
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
import types
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENVS = ROOT / "build" / "pythons"
SUPPORTED = ((3, 11), (3, 12), (3, 13))
WHEELS = Path(os.environ.get("ASSAY_TORCH_WHEELS", "/opt/wheels"))
NEEDS_TORCH = frozenset({"torch", "lightning", "lightning_fabric", "pytorch_lightning"})
"""Distributions (and their import names) that are left out with torch."""
RECIPE = 1
"""Bumped when the way a venv is made changes, so that every venv is made again."""
PROJECT_CODE = tuple(str(ROOT / folder) + os.sep for folder in ("src", "tests", "examples"))
PYTEST = ["-m", "unit", "-p", "no:cacheprovider", "-q"]
MISSING_ENV = "ASSAY_TORCH_MISSING"
"""Set for pytest when torch is left out: the reason every torch test is skipped with."""


@dataclass(frozen=True)
class Python:
    path: Path
    version: str  # "3.11.2"

    @property
    def tag(self) -> str:
        major, minor = self.version.split(".")[:2]
        return f"cp{major}{minor}"


@dataclass(frozen=True)
class Outcome:
    python: Python
    summary: str
    ok: bool
    venv: str  # reused, updated or made
    setup_s: float
    test_s: float
    torch: str


def candidates() -> list[Path]:
    """Every interpreter path worth asking, the most specific first."""
    found: list[Path] = []
    for major, minor in SUPPORTED:
        found.append(Path(f"/usr/bin/python{major}.{minor}"))
        which = shutil.which(f"python{major}.{minor}")
        if which and f"{os.sep}shims{os.sep}" not in which:  # pyenv's are found below
            found.append(Path(which))
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found += sorted(Path(p) for p in glob.glob(str(pyenv / "*" / "bin" / "python")))
    return [*found, Path(sys.executable)]  # a venv's interpreter last


def probe(path: Path) -> Python | None:
    """The interpreter at `path` if it is a CPython of a supported release."""
    if not os.access(path, os.X_OK):
        return None
    code = "import sys, platform; print(platform.python_implementation(), *sys.version_info[:3])"
    try:
        out = subprocess.run(
            [str(path), "-c", code], capture_output=True, text=True, timeout=30, check=True
        ).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    if len(out) != 4 or out[0] != "CPython" or (int(out[1]), int(out[2])) not in SUPPORTED:
        return None
    return Python(path, ".".join(out[1:]))


def discover(extra: Sequence[Path], only: Sequence[str]) -> list[Python]:
    """One interpreter per release, in version order; `only`: versions or prefixes kept."""
    by_version: dict[str, Python] = {}
    for path in [*extra, *candidates()]:
        python = probe(path)
        if python and python.version not in by_version:
            by_version[python.version] = python
    kept = [
        p
        for p in by_version.values()
        if not only or any(p.version == o or p.version.startswith(o + ".") for o in only)
    ]
    return sorted(kept, key=lambda p: tuple(int(n) for n in p.version.split(".")))


def torch_wheel(python: Python) -> Path | None:
    """The local CPU torch wheel for `python`'s tag, the newest if several."""
    wheels = sorted(WHEELS.glob(f"torch-*-{python.tag}-{python.tag}-*linux*x86_64.whl"))
    return wheels[-1] if wheels else None


def _name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9._-]+", requirement)
    return (match.group(0) if match else requirement).lower().replace("-", "_")


def requirements(without_torch: bool) -> list[str]:
    """The project's dependencies and dev extras, less the torch stack when asked."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["dev"]]
    if without_torch:
        wanted = [r for r in wanted if _name(r) not in NEEDS_TORCH]
    return wanted


def stamp(python: Python, wheel: Path | None) -> str:
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes())
    digest.update(f"{RECIPE} {python.version} {wheel.name if wheel else '-'}".encode())
    return digest.hexdigest()


def _pip(venv: Path, *args: str) -> None:
    """pip install into `venv`; its chatter goes to `venv/pip.log`, shown on a failure."""
    command = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *args]
    done = subprocess.run(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False
    )
    with (venv / "pip.log").open("a") as log:
        log.write(f"$ {' '.join(command)}\n{done.stdout}")
    if done.returncode != 0:
        sys.stdout.write(done.stdout)
        raise subprocess.CalledProcessError(done.returncode, command)


def make_venv(python: Python, wheel: Path | None) -> str:
    """Make `python`'s venv, or bring the one there up to date: "reused" (its stamp
    matches: no pip at all), "updated" or "made"."""
    venv = VENVS / python.version
    marker = venv / "assay-stamp"
    wanted = stamp(python, wheel)
    if marker.is_file() and marker.read_text() == wanted:
        return "reused"
    made = not (venv / "bin" / "python").exists()
    if made:
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([str(python.path), "-m", "venv", str(venv)], check=True)
    marker.unlink(missing_ok=True)  # until pip has succeeded
    if wheel is not None:
        _pip(venv, str(wheel), "-e", ".[dev]")
    else:
        constraints = venv / "no-torch.txt"
        # No release has this version: anything that requires torch fails to install.
        constraints.write_text("torch==0+absent\n")
        _pip(venv, "--no-deps", "-e", ".")
        _pip(venv, "-c", str(constraints), *requirements(without_torch=True))
    marker.write_text(wanted)
    return "made" if made else "updated"


def _summary(output: str) -> str:
    """pytest's closing counts ("3 failed, 120 passed, 4 skipped in 9.1s")."""
    for line in reversed(output.splitlines()):
        line = line.strip("= ").strip()
        if re.search(r"\b(passed|failed|error|errors|skipped|deselected)\b", line) and " in " in (
            line
        ):
            return line
    return "no summary (pytest did not finish)"


def run_unit(python: Python, pytest_args: Sequence[str]) -> Outcome:
    started = time.monotonic()
    wheel = torch_wheel(python)
    torch = f"torch {wheel.name.split('-')[1]}" if wheel else "no torch"
    venv = VENVS / python.version
    try:
        state = make_venv(python, wheel)
    except subprocess.CalledProcessError:
        summary = f"its venv could not be made (see {venv / 'pip.log'})"
        return Outcome(python, summary, False, "failed", time.monotonic() - started, 0.0, torch)
    setup_s = time.monotonic() - started
    env = dict(os.environ)
    args = [*PYTEST, f"--junitxml={venv / 'junit.xml'}", *pytest_args]
    if wheel is None:
        env[MISSING_ENV] = (
            f"no CPU wheel of torch for {python.tag} in {WHEELS}, and PyPI's is a multi-GB "
            "CUDA build: torch is not installed"
        )
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(ROOT / "scripts"), env.get("PYTHONPATH", "")) if p
        )
        args = ["-p", "pythons", *args]
    print(f"--- Python {python.version} ({python.path}), {torch}", flush=True)
    started = time.monotonic()
    lines: list[str] = []
    with subprocess.Popen(
        [str(venv / "bin" / "python"), "-m", "pytest", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as pytest:
        assert pytest.stdout is not None
        for line in pytest.stdout:
            sys.stdout.write(line)
            lines.append(line)
    output = "".join(lines)
    return Outcome(
        python,
        _summary(output),
        pytest.returncode == 0,
        state,
        setup_s,
        time.monotonic() - started,
        torch,
    )


# --- the pytest plugin, loaded with `-p pythons` where torch is left out ------------------


class _TorchIsMissing(importlib.abc.MetaPathFinder):
    """Turns an import of the torch stack from the tests or from `assay` into a skip."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] not in NEEDS_TORCH:
            return None
        importer = _project_importer()
        if importer is None:
            return None  # a library probing for torch gets its ModuleNotFoundError
        import pytest

        pytest.skip(f"{importer} imports {fullname}: {self.reason}", allow_module_level=True)


def _project_importer() -> str | None:
    """The file of this repository's code (its tests, the package, the examples) that makes
    the import being made; None when a library installed in the venv makes it."""
    frame = sys._getframe(2)
    while frame is not None and (
        frame.f_code.co_filename.startswith("<frozen importlib")
        or f"{os.sep}importlib{os.sep}" in frame.f_code.co_filename
    ):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None or not frame.f_code.co_filename.startswith(PROJECT_CODE):
        return None
    return os.path.relpath(frame.f_code.co_filename, ROOT)


def pytest_configure(config: object) -> None:
    reason = os.environ.get(MISSING_ENV)
    if reason and not any(isinstance(f, _TorchIsMissing) for f in sys.meta_path):
        sys.meta_path.append(_TorchIsMissing(reason))


# --- the command ------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", action="append", type=Path, default=[], help="add one")
    parser.add_argument("--only", action="append", default=[], help="3.12, 3.11.2, ...")
    parser.add_argument("pytest_args", nargs="*", help="after --: passed on to pytest")
    options = parser.parse_args(argv)
    pythons = discover(options.python, options.only)
    if not pythons:
        print("no supported Python found", file=sys.stderr)
        return 2
    outcomes = [run_unit(python, options.pytest_args) for python in pythons]
    print("\n=== the unit tier on every Python")
    for o in outcomes:
        print(
            f"{'ok  ' if o.ok else 'FAIL'} {o.python.version:8} {o.torch:14} {o.summary} "
            f"(pytest {o.test_s:.0f} s; venv {o.venv} in {o.setup_s:.0f} s)"
        )
    return 0 if all(o.ok for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
