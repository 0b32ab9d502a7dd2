"""Local multi-slot launches: no worker outlives its launcher; failures name the rank."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import REGRESSION_DIR, regression_config

ROOT = Path(__file__).resolve().parent.parent


def _interruptible() -> None:
    """In the launcher's process: SIGINT as a terminal sends it (a test runner started in
    the background without job control ignores SIGINT, and its children would too)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _workers_of(pid: int) -> list[int]:
    """Child processes of `pid` running an Assay worker (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == pid and b"assay._worker" in cmdline:
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL])
def test_workers_stop_when_the_launcher_stops(tmp_path: Path, how: signal.Signals) -> None:
    config = regression_config(batches=100_000, slots=2, scheduling_unit=1000)
    script = textwrap.dedent(
        """
        import faulthandler, json, signal, sys
        faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test asks on a hang
        import assay
        config, model_dir, ckpt = json.loads(sys.argv[1])
        assay.run_local(config=config, model_dir=model_dir, checkpoint_dir=ckpt)
        """
    )
    args = json.dumps([config, str(REGRESSION_DIR), str(tmp_path)])
    errors = tmp_path / "launcher-stderr.txt"
    with errors.open("wb") as stderr:
        launcher = subprocess.Popen(
            [sys.executable, "-c", script, args],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            preexec_fn=_interruptible,
        )
    try:
        deadline = time.monotonic() + 60
        workers: list[int] = []
        while len(workers) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
            workers = _workers_of(launcher.pid)
        assert len(workers) == 2, "the launcher did not start two workers"
        time.sleep(2)  # let them get into training
        os.kill(launcher.pid, how)
        try:
            launcher.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.kill(launcher.pid, signal.SIGUSR1)  # where each of its threads is
            time.sleep(2)
            raise AssertionError(
                f"the launcher outlived its {how.name} by 60 s:\n{errors.read_text()[-6000:]}"
            ) from None
        deadline = time.monotonic() + 20
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_alive(w) for w in workers), "a worker outlived its launcher"
    finally:
        launcher.kill()
        launcher.wait()
