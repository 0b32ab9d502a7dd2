"""Run mypy over the `assay` namespace as it is installed.

The repository keeps each component in its own top-level folder (harness/, master/, cli/,
...) and pyproject maps them onto one import package, `assay`. mypy cannot follow that
mapping, so this script lays out a copy shaped like the installed package under
`build/typecheck/`, checks it together with the tests, examples and benchmarks, and
prints every error with the path of the file in the repository.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / "build" / "typecheck"


def build_tree() -> dict[str, str]:
    """Copy each package's files into TREE; return copy-prefix -> repository-prefix."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    package_dir: dict[str, str] = pyproject["tool"]["setuptools"]["package-dir"]
    shutil.rmtree(TREE, ignore_errors=True)
    prefixes: dict[str, str] = {}
    for package, folder in sorted(package_dir.items()):
        target = TREE.joinpath(*package.split("."))
        origin = ROOT / folder
        for source in origin.rglob("*"):
            if source.is_file() and source.suffix in {".py", ".pyi", ".typed"}:
                if "__pycache__" in source.parts:
                    continue
                copy = target / source.relative_to(origin)
                copy.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, copy)
        prefixes[str(target.relative_to(ROOT)) + os.sep] = folder.rstrip("/") + os.sep
    return prefixes


def main() -> int:
    prefixes = build_tree()
    env = dict(os.environ, MYPYPATH=str(TREE))
    extra = [p for p in ("tests", "examples", "bench", "scripts") if (ROOT / p).exists()]
    status = 0
    for targets in ([str(TREE.relative_to(ROOT) / "assay")], extra):
        done = subprocess.run(
            [sys.executable, "-m", "mypy", *targets, *sys.argv[1:]],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        output = done.stdout + done.stderr
        # Longest prefix first, so assay/config/ maps before assay/.
        for copy, original in sorted(prefixes.items(), key=lambda kv: -len(kv[0])):
            output = output.replace(copy, original)
        sys.stdout.write(output)
        status = status or done.returncode
    return status


if __name__ == "__main__":
    sys.exit(main())
