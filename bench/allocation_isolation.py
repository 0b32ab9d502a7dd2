"""What a cgroup (and a network) per allocation costs: at the start of a trial, at its
end, and on the way to the master.

Runs real allocations (`assay.agent.Allocation`, the agent's own class) of one rank on
this machine, as root, with and without a cgroup, and with a cgroup and a network
namespace of its own (`isolation_network: loopback`, `net_start_ms`), and times:

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

- `relay_rtt_us` and `direct_rtt_us`: a request-answer of 100 bytes to a server on the
  agent's side (the master's place), from inside an allocation's namespace through the
  agent's relay, and from the agent's own namespace straight to it, on one connection.

Each figure is the median of `--runs` runs (they alternate, on and off, so both see the
same load). Needs root on Linux with cgroups (v1 or v2). `ratio` is the start with a
cgroup and a network of its own over the start without either (target: at most 1.5,
against a trial start that imports torch for seconds).

    sudo python bench/allocation_isolation.py [--runs 15] [--quick] [--fork-loop] [--uid]

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


def _run_once(
    work: Path, cgroups: Cgroups | None, loops: int, network: str = "host"
) -> tuple[float, float]:
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
        trial_api="127.0.0.1:9",
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
        network=network,
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


_ECHO = """
import ctypes, socket, sys, time
fd, port, rounds = (int(a) for a in sys.argv[1:4])
if fd >= 0:
    assert ctypes.CDLL(None, use_errno=True).setns(fd, 0x40000000) == 0
with socket.create_connection(("127.0.0.1", port)) as s:
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    times = []
    for _ in range(rounds):
        began = time.perf_counter()
        s.sendall(b"x" * 100)
        got = 0
        while got < 100:
            got += len(s.recv(100 - got))
        times.append(time.perf_counter() - began)
times.sort()
print(times[len(times) // 2] * 1e6)
"""


def _rtt_figures(rounds: int) -> dict[str, float]:
    """Round trips to a server on the agent's side: through the relay, and straight."""
    import socket
    import subprocess

    from assay.agent._netns import LoopbackNetwork

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with conn:
                while data := conn.recv(4096):
                    conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    port = int(server.getsockname()[1])
    network = LoopbackNetwork(("127.0.0.1", port), name="bench")
    try:
        figures = {}
        for name, fd, target in (("relay", network.fd, network.port), ("direct", -1, port)):
            done = subprocess.run(
                [sys.executable, "-c", _ECHO, str(fd), str(target), str(rounds)],
                pass_fds=(network.fd,),
                capture_output=True,
                text=True,
                check=True,
            )
            figures[f"{name}_rtt_us"] = round(float(done.stdout), 1)
        return figures
    finally:
        network.close()
        server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--fork-loop", action="store_true", help="each rank leaves 3 fork loops")
    parser.add_argument("--uid", action="store_true", help="also time lending a uid")
    parser.add_argument("--quick", action="store_true", help="5 runs (well under a minute)")
    args = parser.parse_args()
    if args.quick:
        args.runs = 5
    loops = 3 if args.fork_loop else 0
    cgroups = Cgroups.open(f"bench-{uuid.uuid4().hex[:8]}")
    figures: dict[str, list[float]] = {
        k: [] for k in ("on_start", "on_end", "off_start", "off_end", "net_start", "net_end")
    }
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for _ in range(args.runs):
                for side, chosen in (("on", cgroups), ("off", None), ("net", cgroups)):
                    if side == "off" and loops:
                        continue  # without a cgroup (or a uid) its loops would live on
                    network = "loopback" if side == "net" else "host"
                    start_ms, end_ms = _run_once(Path(tmp), chosen, loops, network)
                    figures[f"{side}_start"].append(start_ms)
                    figures[f"{side}_end"].append(end_ms)
        finally:
            cgroups.clean()
            cgroups.close()
    medians = {f"{k}_ms": _median(v) for k, v in figures.items() if v}
    baseline = medians.get("off_start_ms")
    result: dict[str, object] = {
        "benchmark": "allocation_isolation",
        "ratio": round(medians["net_start_ms"] / baseline, 3) if baseline else None,
        "target": 1.5,
        "runs": args.runs,
        "fork_loops_per_rank": loops,
        "cgroups": cgroups.description,
        **medians,
        **_rtt_figures(200 if args.quick else 2000),
    }
    if args.uid:
        result.update(_uid_figures(args.runs))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
