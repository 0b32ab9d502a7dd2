"""A real gRPC master stand-in on loopback, a fake NVML, and model tarballs for the agent."""

from __future__ import annotations

import io
import json
import queue
import sys
import tarfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from assay.agent import Agent, AgentSettings
from assay.proto import agent_pb2, agent_pb2_grpc

# The stand-in for `python -m assay._cluster`: run from the extracted model directory,
# it reports its environment, then behaves as `hparams["mode"]` says.
WORKER = """
import json, os, signal, sys, time
spec = json.load(open(os.environ["ASSAY_TRIAL_SPEC"]))
hp = spec["hparams"]
rank = int(os.environ["RANK"])
keys = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
        "ASSAY_TRIAL_SPEC", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "PYTHONUNBUFFERED",
        "ASSAY_JOIN_TOKEN", "ASSAY_PASSWORD", "ASSAY_INITIAL_ADMIN_PASSWORD"]
files = sorted(str(p) for p in __import__("pathlib").Path(".").rglob("*") if p.is_file())
report = {"pid": os.getpid(), "env": {k: os.environ.get(k) for k in keys}, "files": files,
          "spec": spec}
print("REPORT " + json.dumps(report))
print("INFO rank %d started" % rank)
print("WARNING rank %d writes to stderr" % rank, file=sys.stderr)
mode = hp.get("mode", "exit")
if mode == "exit":
    time.sleep(hp.get("delays", [0] * 8)[rank])
    sys.exit(hp.get("codes", [0] * 8)[rank])
if mode == "fail":
    if rank == hp["failing_rank"]:
        time.sleep(0.3)
        print("ERROR rank %d is failing" % rank, file=sys.stderr)
        sys.exit(3)
elif mode == "trap":
    def on_term(signum, frame):
        print("got SIGTERM")
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
elif mode == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready")
time.sleep(60)
"""

HARNESS = [sys.executable, "worker.py"]


def model_tarball(extra: dict[str, str] | None = None) -> bytes:
    files = {"worker.py": WORKER, "data/info.txt": "hello\n", **(extra or {})}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def start_message(
    allocation_id: str,
    hparams: dict[str, Any],
    *,
    slots: Sequence[int] = (0, 1),
    ranks: Sequence[int] | None = None,
    world_size: int | None = None,
    model: bytes | None = None,
) -> agent_pb2.MasterMessage:
    ranks = list(ranks) if ranks is not None else list(range(len(slots)))
    return agent_pb2.MasterMessage(
        start=agent_pb2.StartAllocation(
            allocation_id=allocation_id,
            trial_id=11,
            run_id=2,
            experiment_id=5,
            slots=list(slots),
            ranks=ranks,
            world_size=world_size or len(slots),
            master_addr="10.1.2.3",
            master_port=29555,
            model_definition=model_tarball() if model is None else model,
            config_json=json.dumps({"name": "agent-test"}),
            hparams_json=json.dumps(hparams),
            trial_seed=77,
            trial_api="127.0.0.1:9999",
            token="secret-token",
            checkpoint_root="/checkpoints",
            checkpoint_location="/checkpoints/abc",
        )
    )


def kill_message(allocation_id: str, graceful: bool, grace: int = 0) -> agent_pb2.MasterMessage:
    return agent_pb2.MasterMessage(
        kill=agent_pb2.KillAllocation(
            allocation_id=allocation_id, graceful=graceful, grace_seconds=grace
        )
    )


class FakeMaster(agent_pb2_grpc.AgentServiceServicer):
    """Records every AgentMessage; `send` pushes MasterMessages down the open stream."""

    def __init__(self, heartbeat_ms: int = 100) -> None:
        self.heartbeat_ms = heartbeat_ms
        self.messages: list[agent_pb2.AgentMessage] = []
        self._cond = threading.Condition()
        self._to_agent: queue.Queue[agent_pb2.MasterMessage] = queue.Queue()
        self.server: grpc.Server | None = None
        self.port = 0

    def start(self, port: int = 0) -> None:
        self.server = grpc.server(ThreadPoolExecutor(max_workers=16))
        agent_pb2_grpc.add_AgentServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        self.server.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(grace=0).wait()
            self.server = None

    def send(self, message: agent_pb2.MasterMessage) -> None:
        self._to_agent.put(message)

    def _record(self, message: agent_pb2.AgentMessage) -> None:
        with self._cond:
            self.messages.append(message)
            self._cond.notify_all()

    def Connect(self, request_iterator: Any, context: Any) -> Iterator[agent_pb2.MasterMessage]:  # noqa: N802
        self._record(next(request_iterator))
        yield agent_pb2.MasterMessage(
            registered=agent_pb2.Registered(
                cluster_id="test", heartbeat_interval_ms=self.heartbeat_ms
            )
        )
        done = threading.Event()

        def read() -> None:
            try:
                for message in request_iterator:
                    self._record(message)
            except grpc.RpcError:
                pass
            finally:
                done.set()

        threading.Thread(target=read, daemon=True).start()
        while context.is_active() and not done.is_set():
            try:
                message = self._to_agent.get(timeout=0.05)
            except queue.Empty:
                continue
            yield message

    def of(self, kind: str) -> list[Any]:
        with self._cond:
            return [getattr(m, kind) for m in self.messages if m.WhichOneof("message") == kind]

    def wait_for(
        self, kind: str, predicate: Callable[[Any], bool] = lambda _: True, timeout: float = 10
    ) -> Any:
        """The first message of `kind` matching `predicate`, waiting up to `timeout`."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for m in self.messages:
                    if m.WhichOneof("message") == kind and predicate(getattr(m, kind)):
                        return getattr(m, kind)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no matching {kind} message within {timeout}s")
                self._cond.wait(left)

    def exited(self, allocation_id: str, timeout: float = 15) -> agent_pb2.AllocationStateChange:
        change: agent_pb2.AllocationStateChange = self.wait_for(
            "allocation_state",
            lambda c: (
                c.allocation_id == allocation_id and c.state == agent_pb2.ALLOCATION_STATE_EXITED
            ),
            timeout,
        )
        return change

    def lines(self, allocation_id: str) -> list[Any]:
        return [
            line for b in self.of("logs") if b.allocation_id == allocation_id for line in b.lines
        ]

    def wait_ready(self, allocation_id: str, ranks: int, timeout: float = 10) -> None:
        """Until `ranks` processes have printed "ready" (their signal handlers are set)."""

        def all_ready(_: object) -> bool:
            lines = self.lines(allocation_id)
            return len({x.rank for x in lines if x.message == "ready"}) >= ranks

        self.wait_for("logs", all_ready, timeout)

    def wait_line(self, allocation_id: str, text: str, timeout: float = 10) -> Any:
        batch = self.wait_for(
            "logs",
            lambda b: b.allocation_id == allocation_id and any(text in x.message for x in b.lines),
            timeout,
        )
        return next(x for x in batch.lines if text in x.message)


class FakeNVML(SimpleNamespace):
    """pynvml's surface as the agent uses it, reporting two H100s (this machine has none)."""

    def __init__(self, count: int = 2) -> None:
        super().__init__()
        self.count = count
        self.shut_down = False

    def nvmlInit(self) -> None:  # noqa: N802
        pass

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.shut_down = True

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return self.count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        if not 0 <= index < self.count:
            raise RuntimeError("Invalid Argument")
        return index

    def nvmlDeviceGetName(self, handle: int) -> str:  # noqa: N802
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUUID(self, handle: int) -> bytes:  # noqa: N802
        return f"GPU-0000000{handle}-aaaa".encode()  # old bindings return bytes

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(total=80 * 2**30, used=2**30, free=79 * 2**30)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(gpu=25 * (handle + 1), memory=10)


class BrokenNVML(FakeNVML):
    def nvmlInit(self) -> None:  # noqa: N802
        raise RuntimeError("Driver Not Loaded")


@pytest.fixture
def master() -> Iterator[FakeMaster]:
    fake = FakeMaster()
    fake.start()
    yield fake
    fake.stop()


@pytest.fixture
def run_agent(master: FakeMaster, tmp_path: Path) -> Iterator[Callable[..., Agent]]:
    """Start an Agent on a thread (CPU slots by default); every one is stopped afterwards."""
    started: list[tuple[Agent, threading.Thread]] = []

    def start(nvml: Any = None, **overrides: Any) -> Agent:
        options: dict[str, Any] = {
            "master": f"127.0.0.1:{master.port}",
            "agent_id": "test-agent",
            "slot_type": "cpu",
            "slots": 2,
            "work_dir": tmp_path / "work",
            "grace": 5.0,
            "address": "127.0.0.1",
            "isolation": "none",  # the test's directories are root's (see test_isolation.py)
        }
        options.update(overrides)
        agent = Agent(AgentSettings(**options), harness_command=HARNESS, nvml=nvml)
        thread = threading.Thread(target=agent.run, daemon=True)
        thread.start()
        started.append((agent, thread))
        return agent

    yield start
    for agent, thread in started:
        agent.stop()
        thread.join(20)
        assert not thread.is_alive(), "the agent did not stop"
