"""Run mypy over the `assay` package, then over the tests, examples, benchmarks and scripts.

    python scripts/typecheck.py [mypy options]

The package is checked strictly (pyproject's `[tool.mypy]`); the rest is checked in a
second run so that its looser code cannot hide an error of the package's.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    extra = [p for p in ("tests", "examples", "bench", "scripts") if (ROOT / p).exists()]
    status = 0
    for targets in (["-p", "assay"], extra):
        done = subprocess.run(
            [sys.executable, "-m", "mypy", *targets, *sys.argv[1:]], cwd=ROOT, check=False
        )
        status = status or done.returncode
    return status


if __name__ == "__main__":
    sys.exit(main())
