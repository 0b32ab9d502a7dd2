"""A trial's ranks launched on this machine as processes (`assay trial run-local --slots N`,
a script's ranks): a free port for their rendezvous, each rank's output prefixed, and the
first failure stopping the others, as torchrun does.
"""

from __future__ import annotations

import socket
import subprocess
import time
from typing import IO


def free_port() -> int:
    """A TCP port free on the loopback interface now (for a rendezvous, a test master)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pump_output(stream: IO[bytes], prefix: str, sink: IO[str], tail: list[str]) -> None:
    """Copy a rank's output to `sink`, each line prefixed; keep its last 40 lines in `tail`."""
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        tail.append(line)
        del tail[:-40]
        sink.write(f"{prefix}{line}\n")
        sink.flush()


def wait_all(
    procs: list[subprocess.Popen[bytes]], early: list[int] | None = None
) -> tuple[int, int] | None:
    """Wait for every process; on the first failure stop the others and return it, with
    the ranks that had exited 0 by then in `early`."""
    while True:
        codes = [p.poll() for p in procs]
        for rank, code in enumerate(codes):
            if code not in (None, 0):
                if early is not None:
                    early.extend(r for r, c in enumerate(codes) if c == 0)
                stop_all(procs)
                return rank, code
        if all(code == 0 for code in codes):
            return None
        time.sleep(0.05)


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM what still runs, then SIGKILL what has not exited 10 s later."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + 10
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
