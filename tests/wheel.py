"""Build the checkout's wheel, one build at a time on this machine.

`pip wheel` of the checkout builds in its `build/` folder; two builds at once (two xdist
workers, each with its own session fixture) remove each other's files there. A lock file
beside that folder makes them take turns.
"""

from __future__ import annotations

import fcntl
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build_wheel(out: Path) -> subprocess.CompletedProcess[str]:
    """`pip wheel --no-deps` of the checkout into `out`, under the machine-wide lock."""
    lock = ROOT / "build" / ".wheel.lock"
    lock.parent.mkdir(exist_ok=True)
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        return subprocess.run(
            [*pip, "-w", str(out), str(ROOT)],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
