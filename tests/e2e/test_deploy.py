"""`assay deploy local up/down`: daemons start in the background and stop without leftovers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from assay._rank_processes import free_port


def _assay(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "assay.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.slow
def test_up_then_down_leaves_nothing_running(tmp_path: Path) -> None:
    port = str(free_port())
    state = str(tmp_path / "local")
    up = _assay(
        "deploy",
        "local",
        "up",
        "--agents",
        "2",
        "--slots-per-agent",
        "1",
        "--port",
        port,
        "--http-port",
        "0",
        "--state-dir",
        state,
    )
    assert up.returncode == 0, up.stderr
    pids = json.loads((tmp_path / "local" / "pids.json").read_text())
    try:
        deadline = time.monotonic() + 60
        agents: list[object] = []
        while len(agents) < 2 and time.monotonic() < deadline:
            listed = _assay("-m", f"127.0.0.1:{port}", "agent", "list", "--json")
            if listed.returncode == 0:
                agents = json.loads(listed.stdout.strip().splitlines()[-1])
            time.sleep(0.5)
        assert len(agents) == 2
        again = _assay(
            "deploy", "local", "up", "--port", port, "--http-port", "0", "--state-dir", state
        )
        assert again.returncode == 1
        assert "already running" in again.stderr
    finally:
        down = _assay("deploy", "local", "down", "--state-dir", state)
    assert down.returncode == 0, down.stderr
    assert not any(_alive(pid) for pid in pids.values())
