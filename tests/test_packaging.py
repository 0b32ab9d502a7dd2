"""The built wheel holds every module of the tree, and the `assay` command starts light.

An editable install finds subpackages that pyproject does not list; a built wheel silently
drops them. So the wheel is built for real and compared with the folders on disk.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path, PurePosixPath

import pytest

from tests.wheel import build_wheel

ROOT = Path(__file__).resolve().parent.parent


SRC = ROOT / "src"


def expected_wheel_paths() -> dict[str, Path]:
    """Wheel path -> source file, for every .py under src/ (recursively)."""
    expected: dict[str, Path] = {}
    for source in (SRC / "assay").rglob("*.py"):
        relative = source.relative_to(SRC)
        if "__pycache__" in relative.parts:
            continue
        expected[str(PurePosixPath(*relative.parts))] = source
    return expected


def assay_command() -> list[str]:
    """The installed `assay` script next to this interpreter, else the module."""
    script = Path(sys.executable).parent / "assay"
    if script.exists():
        return [str(script)]
    found = shutil.which("assay")
    return [found] if found else [sys.executable, "-m", "assay.cli.main"]


def test_every_folder_of_code_is_a_package() -> None:
    """setuptools finds a package by its `__init__.py`; a folder of code without one would
    work in a checkout and be missing from the wheel."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "package-dir" not in pyproject["tool"]["setuptools"], "folders are import paths"
    for source in (SRC / "assay").rglob("*.py"):
        folder = source.parent
        if "__pycache__" in folder.parts or "migrations" in folder.relative_to(SRC).parts:
            continue
        assert (folder / "__init__.py").is_file(), f"{folder.relative_to(ROOT)} has no __init__.py"


@pytest.mark.slow
def test_wheel_contains_every_module(tmp_path: Path) -> None:
    done = build_wheel(tmp_path)
    assert done.returncode == 0, f"pip wheel failed:\n{done.stdout}\n{done.stderr}"
    wheels = list(tmp_path.glob("assay-*.whl"))
    assert len(wheels) == 1, wheels

    with zipfile.ZipFile(wheels[0]) as wheel:
        names = set(wheel.namelist())
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        scripts = wheel.read(entry_points).decode()

    expected = expected_wheel_paths()
    assert "assay/__init__.py" in expected
    missing = sorted(
        f"{path} (from {source.relative_to(ROOT)})"
        for path, source in expected.items()
        if path not in names
    )
    assert not missing, "modules left out of the wheel:\n" + "\n".join(missing)
    assert "assay/py.typed" in names
    assert "assay = assay.cli.main:main" in scripts
    # The web UI's build travels in the wheel, so an installed master serves it.
    built = SRC / "assay" / "master" / "webui_dist"
    assert (built / "index.html").is_file(), "build the web UI first: cd webui && npm run build"
    ui_files = {
        str(PurePosixPath("assay", "master", "webui_dist", *f.relative_to(built).parts))
        for f in built.rglob("*")
        if f.is_file()
    }
    assert ui_files <= names, sorted(ui_files - names)


def _files(root: Path) -> dict[str, bytes]:
    return {f.relative_to(root).as_posix(): f.read_bytes() for f in root.rglob("*") if f.is_file()}


@pytest.mark.slow
def test_committed_web_ui_is_the_build_of_its_sources(tmp_path: Path) -> None:
    """src/assay/master/webui_dist is committed so that a clone serves the UI without Node.js.

    It must be what `cd webui && npm run build` makes of webui/src now: built again here
    and compared byte for byte, and (in a git checkout) equal to what is committed, since
    the test command itself rebuilds it in place before pytest runs.
    """
    webui, built = ROOT / "webui", SRC / "assay" / "master" / "webui_dist"
    vite = webui / "node_modules" / ".bin" / "vite"
    assert vite.is_file(), "install the web UI's tools first: cd webui && npm ci"
    fresh = tmp_path / "dist"

    done = subprocess.run(
        [str(vite), "build", "--outDir", str(fresh), "--emptyOutDir", "--logLevel", "warn"],
        cwd=webui,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )

    assert done.returncode == 0, f"vite build failed:\n{done.stdout}\n{done.stderr}"
    want, have = _files(fresh), _files(built)
    differing = sorted(
        name for name in want.keys() | have.keys() if want.get(name) != have.get(name)
    )
    rebuild = (
        "rebuild and commit it: cd webui && npm run build; git add -A src/assay/master/webui_dist"
    )
    assert not differing, f"src/assay/master/webui_dist is stale ({differing}); {rebuild}"
    if (ROOT / ".git").exists():
        status = subprocess.run(
            ["git", "status", "--porcelain", "--", "src/assay/master/webui_dist"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert status.stdout == "", f"the committed web UI differs from its build; {rebuild}"


HEAVY = ("torch", "grpc", "assay.proto")


def test_cli_does_not_import_torch_at_start() -> None:
    code = (
        "import sys, assay.cli.main\n"
        f"heavy = [m for m in sys.modules if m.split('.')[0] in {HEAVY!r} or m in {HEAVY!r}]\n"
        "assert not heavy, heavy\n"
    )

    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )

    assert done.returncode == 0, done.stderr


def test_help_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "from assay.cli.main import cli\n"
        "try:\n"
        "    cli(['trial', 'run-local', '--help'], prog_name='assay')\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        "assert 'torch' not in sys.modules, 'torch imported by --help'\n"
    )

    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )

    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["experiment", "--help"],
        ["e", "create", "--help"],
        ["t", "logs", "--help"],
        ["a", "--help"],
        ["s", "list", "--help"],
        ["c", "download", "--help"],
        ["master", "info", "--help"],
    ],
)
def test_cluster_command_help_imports_neither_torch_nor_grpc(args: list[str]) -> None:
    code = (
        "import sys\n"
        "from assay.cli.main import cli\n"
        "try:\n"
        f"    cli({args!r}, prog_name='assay')\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        f"heavy = [m for m in sys.modules if m.split('.')[0] in {HEAVY!r} or m in {HEAVY!r}]\n"
        "assert not heavy, heavy\n"
    )

    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )

    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--help"], "trial"),
        (["trial", "--help"], "run-local"),
        (["trial", "run-local", "--help"], "--checkpoint-dir"),
        (["e", "--help"], "list-trials"),
        (["t", "--help"], "metrics"),
        (["--version"], "0.1.0"),
    ],
)
def test_help_exits_zero(args: list[str], expected: str) -> None:
    done = subprocess.run(
        [*assay_command(), *args], capture_output=True, text=True, timeout=60, check=False
    )

    assert done.returncode == 0, done.stderr
    assert expected in done.stdout
    assert "Traceback" not in done.stderr
