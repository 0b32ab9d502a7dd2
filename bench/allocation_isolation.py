"""What a cgroup per allocation costs: at the start of a trial, and at its end.

Runs real allocations (`assay.agent.Allocation`, the agent's own class) of one rank on
this machine, as root, with and without a cgroup, and times:

- `start_ms`: from `Allocation.launch()` to the rank's first line of Python (its
  `time.monotonic()`, the same clock): the allocation's directory, its cgroup (made,
  limited), the exec wrapper joining it, Python's start.
- `end_ms`: from the moment every rank has exited to the end verified empty: the
  cgroup killed (`cgroup.kill`, or freeze and SIGKILL) and read back empty, or without
  a cgroup nothing (the rank's process group is killed, a daemon that left it lives on).
  With `--fork-loop` each rank leaves three daemons that fork and exit every millisecond.
- `lend_ms` (with `--uid`): lending a uid to an allocation (`Isolation.lend`): the
  machine's turn, the claim, the look for processes left under it and the kill sent as
  the uid; `give_back_ms`: the kill of whatever runs as it, verified.

Each figure is the median of `--runs` runs (they alternate, on and off, so both see the
same load). Needs root on Linux with cgroups (v1 or v2).

    sudo python bench/allocation_isolation.py [--runs 15] [--fork-loop] [--uid]

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tarfile
import tempfile
import threading
import time
import uuid
from pathlib import Path

from assay.agent._allocation import Allocation
from assay.agent._cgroups import Allowance, Cgroups
from assay.agent._isolation import Isolation
from assay.common.tls import ClientTls
from assay.proto import agent_pb2

WORKER = """
import os, sys, time
print("STARTED", time.monotonic(), flush=True)
LOOP = (
    "import os, time\\nwhile True:\\n    try:\\n        if os.fork():\\n            os._exit(0)\\n"
    "    except OSError:\\n        pass\\n    time.sleep(0.001)\\n"
)
for _ in range(int(sys.argv[1])):
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.execv(sys.executable, [sys.executable, "-c", LOOP])
        os._exit(0)
    os.wait()
time.sleep(0.2 if sys.argv[1] != "0" else 0)
"""


def _model() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        data = WORKER.encode()
        info = tarfile.TarInfo("worker.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _run_once(work: Path, cgroups: Cgroups | None, loops: int) -> tuple[float, float]:
    """One allocation: (start_ms, end_ms)."""
    allocation_id = f"bench-{uuid.uuid4().hex[:8]}"
    start = agent_pb2.StartAllocation(
        allocation_id=allocation_id,
        trial_id=1,
        run_id=1,
        experiment_id=1,
        slots=[0],
        ranks=[0],
        world_size=1,
        model_definition=_model(),
        config_json="{}",
    )
    started: list[float] = []
    exited = threading.Event()

    def send(message: agent_pb2.AgentMessage) -> None:
        if message.WhichOneof("message") == "logs":
            lines = message.logs.lines
            started.extend(float(x.message.split()[1]) for x in lines if "STARTED" in x.message)
        elif message.allocation_state.state == agent_pb2.ALLOCATION_STATE_EXITED:
            exited.set()

    allocation = Allocation(
        start,
        send,
        lambda _: None,
        work_dir=work,
        harness_command=[sys.executable, "worker.py", str(loops)],
        slot_kind="cpu",
        address="127.0.0.1",
        tls=ClientTls.of(None, None, ""),
        grace=5.0,
        cgroups=cgroups,
        allowance=Allowance(memory=4 << 30, pids_per_slot=4096),
    )
    ended: list[float] = []
    end_processes = allocation._end_processes

    def timed_end(*, persist: bool = True) -> None:
        began = time.monotonic()
        end_processes(persist=persist)
        ended.append(time.monotonic() - began)

    allocation._end_processes = timed_end  # type: ignore[method-assign]
    launched = time.monotonic()
    allocation.launch()
    if not exited.wait(60):
        raise RuntimeError("the allocation did not end")
    return (started[0] - launched) * 1000, ended[0] * 1000


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 2)


def _uid_figures(runs: int) -> dict[str, float]:
    lock_dir = Path(tempfile.mkdtemp(prefix="assay-bench-uids-")) / "uids"
    isolation = Isolation("uid", 1_960_000_000, 1000, lock_dir=lock_dir)
    lends, backs = [], []
    for i in range(runs):
        began = time.monotonic()
        identity = isolation.lend(f"bench-{i}", 1)
        lends.append((time.monotonic() - began) * 1000)
        began = time.monotonic()
        isolation.give_back(identity)
        backs.append((time.monotonic() - began) * 1000)
    return {"lend_ms": _median(lends), "give_back_ms": _median(backs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--fork-loop", action="store_true", help="each rank leaves 3 fork loops")
    parser.add_argument("--uid", action="store_true", help="also time lending a uid")
    args = parser.parse_args()
    loops = 3 if args.fork_loop else 0
    cgroups = Cgroups.open(f"bench-{uuid.uuid4().hex[:8]}")
    figures: dict[str, list[float]] = {
        k: [] for k in ("on_start", "on_end", "off_start", "off_end")
    }
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for _ in range(args.runs):
                for side, chosen in (("on", cgroups), ("off", None)):
                    if side == "off" and loops:
                        continue  # without a cgroup (or a uid) its loops would live on
                    start_ms, end_ms = _run_once(Path(tmp), chosen, loops)
                    figures[f"{side}_start"].append(start_ms)
                    figures[f"{side}_end"].append(end_ms)
        finally:
            cgroups.clean()
            cgroups.close()
    result: dict[str, object] = {
        "runs": args.runs,
        "fork_loops_per_rank": loops,
        "cgroups": cgroups.description,
        **{f"{k}_ms": _median(v) for k, v in figures.items() if v},
    }
    if args.uid:
        result.update(_uid_figures(args.runs))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
