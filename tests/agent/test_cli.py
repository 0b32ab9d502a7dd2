"""`assay-agent` as a real process: refusing cuda without GPUs, stopping on SIGTERM, and
taking its trials down with it when it dies."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.agent.conftest import HARNESS, FakeMaster, start_message
from tests.agent.test_agent import _alive, _reports

BROKEN_PYNVML = "def nvmlInit():\n    raise RuntimeError('NVML Shared Library Not Found')\n"


def _agent(master: FakeMaster, tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    output = (tmp_path / "agent.log").open("w")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "assay.agent",
            "--master",
            f"127.0.0.1:{master.port}",
            "--slot-type",
            "cpu",
            "--slots",
            "2",
            "--work-dir",
            str(tmp_path / "work"),
            "--harness-command",
            shlex.join(HARNESS),
            "--grace",
            "5",
            *args,
        ],
        stdout=output,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_cuda_without_gpus_exits_non_zero_with_one_line(tmp_path: Path) -> None:
    # A pynvml that cannot find the driver, ahead of the real one on the path.
    (tmp_path / "pynvml.py").write_text(BROKEN_PYNVML)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]))

    done = subprocess.run(
        [sys.executable, "-m", "assay.agent", "--master", "127.0.0.1:1", "--slot-type", "cuda"],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=False,
    )

    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "assay-agent: error: --slot-type cuda, but no GPU was found (NVML failed: NVML Shared "
        "Library Not Found); install the NVIDIA driver, or run with --slot-type cpu"
    ]


def test_a_bad_master_address_is_refused(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "assay.agent", "--master", "nohost", "--slot-type", "cpu"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.strip() == "assay-agent: error: master must be HOST:PORT, got 'nohost'"


@pytest.mark.slow
def test_sigterm_stops_the_allocations_and_exits_zero(master: FakeMaster, tmp_path: Path) -> None:
    agent = _agent(master, tmp_path)
    try:
        master.wait_for("register", timeout=20)
        master.send(start_message("trap", {"mode": "trap"}))
        master.wait_ready("trap", 2)

        agent.send_signal(signal.SIGTERM)

        exited = master.exited("trap")
        # Both processes exited 0 on the SIGTERM: stopped when the agent asked, so the
        # master hears "stopped at a checkpoint" (80) and requeues the trial.
        assert list(exited.exit_codes) == [80, 80]
        assert exited.message.startswith("the agent is shutting down (SIGTERM")
        assert agent.wait(timeout=15) == 0
    finally:
        agent.kill()
        agent.wait()
        print((tmp_path / "agent.log").read_text())
    assert "registered with master" in (tmp_path / "agent.log").read_text()


@pytest.mark.slow
def test_processes_die_with_a_killed_agent(master: FakeMaster, tmp_path: Path) -> None:
    agent = _agent(master, tmp_path)
    try:
        master.wait_for("register", timeout=20)
        master.send(start_message("orphan", {"mode": "exit-never"}, slots=[0]))
        master.wait_line("orphan", "ready")
        pid = _reports(master, "orphan")[0]["pid"]
        assert _alive(pid)
    finally:
        agent.kill()
        agent.wait()
        print((tmp_path / "agent.log").read_text())

    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)
