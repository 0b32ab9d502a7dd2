"""Scheduling cost of the master: submit-to-first-batch latency and bookkeeping throughput.

1. Latency. A warm local cluster -- an `assay-master` process and one `assay-agent`
   process with 1 CPU slot, started once, as tests/e2e/conftest.py starts them -- gets a
   tiny experiment (a Linear model on a 64-row TensorDataset, 4 batches of 8) through
   `Api.CreateExperiment`. Its `train_batch` writes a wall-clock timestamp file after the
   optimizer step of its first batch; the latency is that timestamp minus the time just
   before the model directory was packed and submitted. Against it, a bare process,
   `python -c "import torch; <Linear model, one SGD step on random data>; <timestamp>"`,
   measured the same way from just before `Popen`. One untimed warm-up run of each, then
   interleaved A/B repetitions (5; 3 with --quick); each side reports the median.
   ratio = assay / bare, target <= 1.5 (for context: Kubernetes' pod-startup SLO is 5 s
   at p99). Each Assay repetition waits for its experiment to end before the next, so the
   slot is free and nothing queues.

2. Bookkeeping throughput. A real `assay-master` process (SQLite store in a temp dir,
   its INFO log to a file) alone on its side: N simulated agents (1,000; 200 with
   --quick), each one `AgentService.Connect` stream over real gRPC with 1 CPU slot, live
   in a child process (grpc.aio, one channel per 100 agents). Every `StartAllocation` is
   answered at once with `AllocationStateChange(EXITED, exit_codes=[1])`. Then M = 2 N
   one-slot experiments (`max_restarts: 0`, a tiny tar.gz) go in through
   `Api.CreateExperiment` from another child process, 16 calls in flight at a time (as
   many users and CI jobs submit at once), as fast as the master takes them.
   allocations/s = placements (StartAllocation messages the agents received) / (last
   experiment's end_time - first submit). Target >= 1,000/s (Slurm claims 500 jobs/s;
   kube-scheduler's bar is 270 pods/s). The trials end in ERROR: each run fails, and
   `max_restarts: 0` ends it there -- the bookkeeping is the same as for a completed
   one (allocation terminated, trial and experiment closed), which is what is measured.
   Also reported: the master's CPU time (all its threads) per allocation over the same
   span, steadier than the rate on a machine other work shares.

   The baseline, run in the same invocation: a relay, a bare grpc.aio server in a child
   process of this script (`--relay-port`) serving the same generated services to the
   same fleet, submitters and request. It implements only what they call: Login (any
   credentials), GetMasterInfo (connected agents), CreateExperiment (a new id; a
   StartAllocation with the request's archive and config, one slot, rank 0 of 1, sent on
   a free agent's stream, or queued FIFO while none is free) and Connect (`Registered`
   for the registration, then the agent's queued messages; an EXITED state frees the
   agent for the next queued start). No store, no authentication, no checks, no
   scheduler, no trial or experiment state. Its allocations/s has the same definition,
   the wall time at which it read the last EXITED standing for the last end_time, and
   its CPU is measured over the same span. So it is the floor of this setup -- gRPC,
   protobuf and the Python of the fleet and the submitters, which share the machine
   with either side. Relay and master run interleaved (relay, master, ...: 3 pairs; 1
   with --quick); each side reports its median, throughput_ratio = master median /
   relay median allocations/s, and throughput_cpu_ratio the same for CPU ms per
   allocation. The pass bar stays the master's 1,000/s; the ratio tells the master's
   own cost from what the machine and this harness allowed during the same run.

   `--policy fair_share` runs this part with the master's one pool on the fair_share
   scheduler (every experiment a group of weight 1); `--policy both` runs the relay,
   priority, then fair_share, then all three once more, and reports each side's median,
   fair_share / priority (the issue's bar: within 10%) and priority / relay.

    python bench/scheduling.py [--quick] [--only latency|throughput] [--profile FILE]
                               [--policy priority|fair_share|both]

`--profile FILE` samples each master run (not the relay) with py-spy (`pip install
py-spy`) during the timed part of the throughput run and writes the collapsed stacks of
all of them, counts added (one `thread;frame;... count` a line), to FILE;
ASSAY_BENCH_PYSPY holds py-spy's sampling options (default `--nonblocking`; `--gil`
keeps only samples of the thread holding the GIL).

Human-readable lines first; the last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import grpc
import yaml

from assay._rank_processes import free_port
from assay.common.archive import pack_model_dir
from assay.master._aio import GenericOnly
from assay.proto import agent_pb2, agent_pb2_grpc, api_pb2, api_pb2_grpc, common_pb2

# The masters started here take their first admin's password and join token from these,
# and so do the fleet and the submitters (child processes inherit them).
ADMIN_PASSWORD = os.environ.setdefault("ASSAY_INITIAL_ADMIN_PASSWORD", secrets.token_urlsafe(12))
JOIN_METADATA = (
    ("x-assay-join-token", os.environ.setdefault("ASSAY_JOIN_TOKEN", secrets.token_hex(16))),
)
# Set once logged in: sent with every Api call.
AUTH: tuple[tuple[str, str], ...] = ()


def _login(api: api_pb2_grpc.ApiStub) -> tuple[tuple[str, str], ...]:
    request = api_pb2.LoginRequest(username="admin", password=ADMIN_PASSWORD)
    return (("authorization", f"Bearer {api.Login(request, timeout=30).token}"),)


ROOT = Path(__file__).resolve().parent.parent
LATENCY_TARGET = 1.5
ALLOCATIONS_TARGET = 1000.0
AGENTS_PER_CHANNEL = 100
SUBMITTERS = 16
TERMINAL = {"COMPLETED", "CANCELED", "ERROR"}


@dataclass(frozen=True)
class Settings:
    reps: int  # timed latency repetitions per side
    agents: int  # simulated agents, 1 slot each
    experiments: int  # one-slot experiments submitted for the throughput run
    deadline_s: float  # give up waiting for the throughput run after this long


FULL = Settings(reps=5, agents=1_000, experiments=2_000, deadline_s=300.0)
QUICK = Settings(reps=3, agents=200, experiments=400, deadline_s=60.0)


# --- 1. latency ----------------------------------------------------------------------------

MODEL_DEF = '''
"""A tiny trial that stamps the wall clock after its first optimizer step."""

import os
import time
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from assay import Trial, TrialContext


class Tiny(Trial):
    def __init__(self, context: TrialContext) -> None:
        self.context = context
        self.model = context.wrap_model(torch.nn.Linear(8, 1))
        self.optimizer = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.01))
        self.stamped = False

    def _data(self) -> TensorDataset:
        g = torch.Generator().manual_seed(0)
        return TensorDataset(torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g))

    def build_training_data_loader(self) -> DataLoader[Any]:
        return DataLoader(self._data(), batch_size=self.context.get_per_slot_batch_size())

    def build_validation_data_loader(self) -> DataLoader[Any]:
        return DataLoader(self._data(), batch_size=32)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        if not self.stamped:
            self.stamped = True
            path = self.context.get_hparam("stamp")
            with open(path + ".tmp", "w") as f:
                f.write(repr(time.time()))
            os.replace(path + ".tmp", path)
            print(f"first batch done, loss {loss.item():.4f}", flush=True)
        return {"loss": loss}

    def evaluate_batch(self, batch: Any) -> dict[str, Any]:
        x, y = batch
        return {"loss": torch.nn.functional.mse_loss(self.model(x), y)}
'''

BARE = """
import sys, time, os
import torch
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(8, 8), torch.randn(8, 1)
loss = torch.nn.functional.mse_loss(model(x), y)
opt.zero_grad()
loss.backward()
opt.step()
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(repr(time.time()))
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
"""


@dataclass
class Cluster:
    address: str
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    def dump_logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in self.logs if p.exists())


def _spawn(cmd: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)


def _stop_procs(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in reversed(procs):
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def local_cluster(tmp: Path) -> Iterator[tuple[Cluster, api_pb2_grpc.ApiStub]]:
    """`assay-master` + one `assay-agent` (1 CPU slot) as processes; stopped on exit."""
    port = free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    cluster = Cluster(address=f"127.0.0.1:{port}")
    master_cmd = [sys.executable, "-m", "assay.master.main", "--grpc-port", str(port)]
    master_cmd += ["--http-port", "0"]
    master_cmd += ["--host", "127.0.0.1", "--state-dir", str(tmp / "master")]
    agent_cmd = [sys.executable, "-m", "assay.agent.main", "--master", cluster.address]
    agent_cmd += ["--slots", "1", "--slot-type", "cpu", "--agent-id", "agent0"]
    agent_cmd += ["--work-dir", str(tmp / "agent0")]
    # The trial stamps its time into this run's own directory: it runs as the agent's user.
    agent_cmd += ["--isolation", "none"]
    channel = grpc.insecure_channel(cluster.address)
    try:
        for name, cmd in (("master", master_cmd), ("agent0", agent_cmd)):
            log = tmp / f"{name}.log"
            cluster.logs.append(log)
            cluster.procs.append(_spawn(cmd, log, env))
        api = api_pb2_grpc.ApiStub(channel)
        deadline = time.monotonic() + 60
        global AUTH
        while True:
            with contextlib.suppress(grpc.RpcError):
                AUTH = AUTH or _login(api)
                if api.ListAgents(api_pb2.ListAgentsRequest(), timeout=2, metadata=AUTH).agents:
                    break
            if time.monotonic() > deadline or any(p.poll() is not None for p in cluster.procs):
                raise RuntimeError(f"the local cluster did not come up:\n{cluster.dump_logs()}")
            time.sleep(0.2)
        yield cluster, api
    finally:
        channel.close()
        _stop_procs(cluster.procs)


def _wait_for_file(path: Path, timeout: float, alive: list[subprocess.Popen[bytes]]) -> float:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout:.0f} s")
        if any(p.poll() is not None for p in alive):
            raise RuntimeError("a cluster process died")
        time.sleep(0.002)
    return float(path.read_text())


def _experiment_state(api: api_pb2_grpc.ApiStub, experiment_id: int) -> str:
    request = api_pb2.GetExperimentRequest(id=experiment_id)
    got = api.GetExperiment(request, timeout=10, metadata=AUTH)
    return common_pb2.ExperimentState.Name(got.experiment.state).removeprefix("EXPERIMENT_STATE_")


def assay_once(cluster: Cluster, api: api_pb2_grpc.ApiStub, tmp: Path, i: int) -> float:
    model_dir = tmp / f"model{i}"
    model_dir.mkdir()
    (model_dir / "model_def.py").write_text(MODEL_DEF)
    stamp = tmp / f"assay-stamp-{i}"
    config = {
        "name": f"latency-{i}",
        "entrypoint": "model_def:Tiny",
        "hyperparameters": {"global_batch_size": 8, "stamp": str(stamp)},
        "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 4}},
        "max_restarts": 0,
    }
    config_yaml = yaml.safe_dump(config)
    t0 = time.time()
    archive = pack_model_dir(model_dir)
    created = api.CreateExperiment(
        api_pb2.CreateExperimentRequest(
            config_yaml=config_yaml, model_definition=archive, activate=True
        ),
        timeout=30,
        metadata=AUTH,
    )
    stamped = _wait_for_file(stamp, 120, cluster.procs)
    experiment_id = created.experiment.id
    deadline = time.monotonic() + 120
    while (state := _experiment_state(api, experiment_id)) not in TERMINAL:
        if time.monotonic() > deadline:
            raise TimeoutError(f"experiment {experiment_id} still {state}")
        time.sleep(0.05)
    if state != "COMPLETED":
        raise RuntimeError(f"latency experiment {experiment_id} ended {state}")
    return stamped - t0


def bare_once(tmp: Path, i: int) -> float:
    stamp = tmp / f"bare-stamp-{i}"
    t0 = time.time()
    proc = subprocess.Popen([sys.executable, "-c", BARE, str(stamp)], cwd=tmp)
    try:
        if proc.wait(timeout=120) != 0:
            raise RuntimeError(f"the bare torch process exited with {proc.returncode}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return float(stamp.read_text()) - t0


@dataclass
class LatencyResult:
    assay: list[float] = field(default_factory=list)
    bare: list[float] = field(default_factory=list)
    warmup_assay_s: float = 0.0
    warmup_bare_s: float = 0.0

    @property
    def assay_s(self) -> float:
        return statistics.median(self.assay)

    @property
    def bare_s(self) -> float:
        return statistics.median(self.bare)


def bench_latency(s: Settings) -> LatencyResult:
    result = LatencyResult()
    with (
        tempfile.TemporaryDirectory(prefix="assay-bench-sched-") as folder,
        local_cluster(Path(folder)) as (cluster, api),
    ):
        tmp = Path(folder)
        try:
            result.warmup_bare_s = bare_once(tmp, 0)
            result.warmup_assay_s = assay_once(cluster, api, tmp, 0)
            for i in range(1, s.reps + 1):
                if i % 2:
                    result.assay.append(assay_once(cluster, api, tmp, i))
                    result.bare.append(bare_once(tmp, i))
                else:
                    result.bare.append(bare_once(tmp, i))
                    result.assay.append(assay_once(cluster, api, tmp, i))
        except Exception:
            print(cluster.dump_logs(), file=sys.stderr)
            raise
    return result


# --- 2. throughput: the simulated fleet (a child process) -----------------------------------


async def _fleet(port: int, agents: int) -> None:
    """N one-slot agents; answers every StartAllocation with EXITED [0]; STOP on stdin."""
    channels = [
        grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        for _ in range((agents + AGENTS_PER_CHANNEL - 1) // AGENTS_PER_CHANNEL)
    ]
    starts = 0
    first: float | None = None
    last: float | None = None
    registered = 0
    all_registered = asyncio.Event()
    calls: list[Any] = []
    errors: list[str] = []

    async def agent(i: int) -> None:
        nonlocal starts, first, last, registered
        stub = agent_pb2_grpc.AgentServiceStub(channels[i // AGENTS_PER_CHANNEL])
        call: Any = stub.Connect(metadata=JOIN_METADATA)
        calls.append(call)
        device = common_pb2.Device(index=0, type=common_pb2.SLOT_TYPE_CPU, name="cpu")
        await call.write(
            agent_pb2.AgentMessage(
                register=agent_pb2.Register(
                    agent_id=f"sim{i:05d}",
                    slot_type=common_pb2.SLOT_TYPE_CPU,
                    devices=[device],
                    address="127.0.0.1",
                )
            )
        )
        reply = await call.read()
        if reply is grpc.aio.EOF or reply.WhichOneof("message") != "registered":
            raise RuntimeError(f"agent {i} was not registered: {reply}")
        registered += 1
        if registered == agents:
            all_registered.set()
        while True:
            message = await call.read()
            if message is grpc.aio.EOF:
                return
            if message.WhichOneof("message") != "start":
                continue
            now = time.time()
            starts += 1
            first = now if first is None else first
            last = now
            await call.write(
                agent_pb2.AgentMessage(
                    allocation_state=agent_pb2.AllocationStateChange(
                        allocation_id=message.start.allocation_id,
                        state=agent_pb2.ALLOCATION_STATE_EXITED,
                        exit_codes=[1],
                    )
                )
            )

    async def guarded(i: int) -> None:
        try:
            await agent(i)
        except asyncio.CancelledError:
            pass
        except Exception as e:
            errors.append(f"agent {i}: {type(e).__name__}: {e}")
            if len(errors) == 1:
                all_registered.set()

    tasks = [asyncio.create_task(guarded(i)) for i in range(agents)]
    await all_registered.wait()
    print(json.dumps({"ready": registered, "errors": errors[:5]}), flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line or line.strip() == "STOP":
            break
    report = {"starts": starts, "first": first, "last": last, "errors": errors[:5]}
    print(json.dumps(report), flush=True)
    for call in calls:
        call.cancel()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for channel in channels:
        await channel.close()


def fleet_main(port: int, agents: int) -> int:
    asyncio.run(_fleet(port, agents))
    return 0


async def _submit_all(port: int, count: int, request_file: Path) -> None:
    """`count` CreateExperiment calls, SUBMITTERS in flight at once; prints ids and times."""
    request = api_pb2.CreateExperimentRequest.FromString(request_file.read_bytes())
    ids: list[int] = []
    queue_left = iter(range(count))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        api = api_pb2_grpc.ApiStub(channel)
        login = api_pb2.LoginRequest(username="admin", password=ADMIN_PASSWORD)
        token = (await api.Login(login, timeout=30)).token
        auth = (("authorization", f"Bearer {token}"),)

        async def client() -> None:
            for _ in queue_left:
                reply = await api.CreateExperiment(request, timeout=120, metadata=auth)
                ids.append(reply.experiment.id)

        t0 = time.time()
        await asyncio.gather(*(client() for _ in range(SUBMITTERS)))
        t1 = time.time()
    print(json.dumps({"ids": ids, "t0": t0, "t1": t1}), flush=True)


def submit_main(port: int, count: int, request_file: Path) -> int:
    asyncio.run(_submit_all(port, count, request_file))
    return 0


# --- 2. throughput: the relay, the baseline (a child process) -------------------------------


class _Relay:
    """The relay's whole state: free agents (their outboxes) and a FIFO of the starts no
    agent was free for. One slot an agent, as the fleet has; no store, no checks."""

    def __init__(self, count: int) -> None:
        self.count = count  # the experiments the bench submits: done when they have ended
        self.agents = 0
        self.free: deque[asyncio.Queue[agent_pb2.MasterMessage]] = deque()
        self.queued: deque[agent_pb2.MasterMessage] = deque()
        self.next_id = 0
        self.placed = 0
        self.ended = 0
        self.last_end: float | None = None
        self.done = asyncio.Event()

    def place(self, start: agent_pb2.MasterMessage) -> None:
        if self.free:
            self.placed += 1
            self.free.popleft().put_nowait(start)
        else:
            self.queued.append(start)

    def exited(self, outbox: asyncio.Queue[agent_pb2.MasterMessage]) -> None:
        self.ended += 1
        self.last_end = time.time()
        if self.queued:
            self.placed += 1
            outbox.put_nowait(self.queued.popleft())
        else:
            self.free.append(outbox)
        if self.ended >= self.count:
            self.done.set()


class _RelayApi(api_pb2_grpc.ApiServicer):
    """The three Api calls the bench makes; any other answers UNIMPLEMENTED."""

    def __init__(self, relay: _Relay) -> None:
        self.relay = relay

    async def Login(  # noqa: N802
        self, request: api_pb2.LoginRequest, context: Any
    ) -> api_pb2.LoginResponse:
        return api_pb2.LoginResponse(token=secrets.token_hex(16))

    async def GetMasterInfo(  # noqa: N802
        self, request: api_pb2.GetMasterInfoRequest, context: Any
    ) -> api_pb2.MasterInfo:
        return api_pb2.MasterInfo(cluster_id="relay", agents=self.relay.agents)

    async def CreateExperiment(  # noqa: N802
        self, request: api_pb2.CreateExperimentRequest, context: Any
    ) -> api_pb2.CreateExperimentResponse:
        self.relay.next_id += 1
        n = self.relay.next_id
        # What the master's StartAllocation carries that the request can give without
        # parsing it: the archive, the config (as submitted), one slot, rank 0 of 1.
        start = agent_pb2.StartAllocation(
            allocation_id=f"{n}.1.1",
            trial_id=n,
            run_id=1,
            experiment_id=n,
            slots=[0],
            ranks=[0],
            world_size=1,
            model_definition=request.model_definition,
            config_json=request.config_yaml,
        )
        self.relay.place(agent_pb2.MasterMessage(start=start))
        return api_pb2.CreateExperimentResponse(experiment=common_pb2.Experiment(id=n))


class _RelayAgents(agent_pb2_grpc.AgentServiceServicer):
    """An agent's stream as the master serves it (see master/_servicers/_agent.py): the
    registration answered with `Registered`, then the agent's outbox relayed to it while
    a task reads its messages; an EXITED allocation frees the agent."""

    def __init__(self, relay: _Relay) -> None:
        self.relay = relay

    async def Connect(  # noqa: N802
        self, request_iterator: AsyncIterator[agent_pb2.AgentMessage], context: Any
    ) -> AsyncIterator[agent_pb2.MasterMessage]:
        messages = aiter(request_iterator)
        try:
            first = await anext(messages)
        except StopAsyncIteration:
            return
        if first.WhichOneof("message") != "register":
            return
        outbox: asyncio.Queue[agent_pb2.MasterMessage] = asyncio.Queue()
        reader = asyncio.create_task(self._read(messages, outbox))
        self.relay.agents += 1
        try:
            yield agent_pb2.MasterMessage(
                registered=agent_pb2.Registered(cluster_id="relay", heartbeat_interval_ms=30_000)
            )
            self.relay.free.append(outbox)
            while True:
                yield await outbox.get()
        finally:
            reader.cancel()
            self.relay.agents -= 1
            with contextlib.suppress(ValueError):
                self.relay.free.remove(outbox)

    async def _read(
        self,
        messages: AsyncIterator[agent_pb2.AgentMessage],
        outbox: asyncio.Queue[agent_pb2.MasterMessage],
    ) -> None:
        with contextlib.suppress(grpc.RpcError, asyncio.CancelledError):
            async for message in messages:
                if (
                    message.WhichOneof("message") == "allocation_state"
                    and message.allocation_state.state == agent_pb2.ALLOCATION_STATE_EXITED
                ):
                    self.relay.exited(outbox)


async def _serve_relay(port: int, count: int) -> None:
    """Serves until killed; prints one JSON line once `count` allocations have ended."""
    relay = _Relay(count)
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    # The stubs declare every Api call abstract; at run time the ones left out answer
    # UNIMPLEMENTED, which is what the relay wants.
    # Registered as the master registers its services (generic handlers only, see
    # GenericOnly): the accept loop's cost per call is the same on both sides.
    generic = GenericOnly(server)
    api_pb2_grpc.add_ApiServicer_to_server(_RelayApi(relay), generic)  # type: ignore[abstract]
    agent_pb2_grpc.add_AgentServiceServicer_to_server(_RelayAgents(relay), generic)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await relay.done.wait()
    report = {"ended": relay.ended, "placed": relay.placed, "last_end": relay.last_end}
    print(json.dumps(report), flush=True)
    await server.wait_for_termination()


def relay_main(port: int, count: int) -> int:
    asyncio.run(_serve_relay(port, count))
    return 0


def _read_line(out: IO[bytes], timeout: float) -> bytes:
    """A line of a child's stdout; b"" if none came within `timeout` seconds."""
    box: list[bytes] = []
    reader = threading.Thread(target=lambda: box.append(out.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return box[0] if box else b""


class Fleet:
    """The child process running the simulated agents."""

    def __init__(self, port: int, agents: int, log: Path) -> None:
        self._stderr = log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--fleet-port", str(port), "--agents", str(agents)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            cwd=ROOT,
        )
        self.log = log

    def _line(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = _read_line(self.proc.stdout, timeout)
        if not line:
            raise RuntimeError(f"the fleet did not answer:\n{self.log.read_text()[-3000:]}")
        parsed: dict[str, Any] = json.loads(line)
        return parsed

    def ready(self, timeout: float) -> int:
        got = self._line(timeout)
        if got["errors"]:
            raise RuntimeError(f"simulated agents failed: {got['errors']}")
        return int(got["ready"])

    def stop(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"STOP\n")
        self.proc.stdin.flush()
        return self._line(30)

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                if self.proc.stdin is not None:
                    self.proc.stdin.close()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._stderr.close()


# --- 2. throughput: the master and the submitters -------------------------------------------


@dataclass
class ThroughputResult:
    server: str = "priority"  # "relay", or the master's pool scheduler
    agents: int = 0
    experiments: int = 0
    placements: int = 0
    terminal: int = 0
    states: dict[str, int] = field(default_factory=dict)
    elapsed_s: float = 0.0
    submit_s: float = 0.0
    first_to_last_start_s: float = 0.0
    register_s: float = 0.0
    cpu_s: float = 0.0  # the server's CPU time (all threads) from first submit to end
    timed_out: bool = False
    errors: list[str] = field(default_factory=list)

    @property
    def allocations_per_s(self) -> float:
        return self.placements / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def cpu_ms_per_allocation(self) -> float:
        return 1000 * self.cpu_s / self.placements if self.placements else 0.0

    @property
    def submits_per_s(self) -> float:
        return self.experiments / self.submit_s if self.submit_s > 0 else 0.0

    @property
    def complete(self) -> bool:
        return (
            not self.timed_out
            and not self.errors
            and self.terminal == self.experiments
            and self.placements == self.experiments
        )


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (Linux; 0 elsewhere). Less
    sensitive to a busy machine than wall time: what the master spends, not waits."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _tiny_archive(tmp: Path) -> bytes:
    model_dir = tmp / "sim-model"
    model_dir.mkdir()
    (model_dir / "model_def.py").write_text("# never run: the simulated agents exit at once\n")
    return pack_model_dir(model_dir)


def _utc(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, dt.UTC)


def _count_terminal(store: Any, expected: int, deadline_s: float) -> bool:
    """Wait until `expected` experiments have ended; False if the deadline passed first."""
    deadline = time.monotonic() + deadline_s
    while store.list_experiments(states=sorted(TERMINAL), limit=1).total < expected:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


@contextlib.contextmanager
def _sampling(pid: int, output: Path | None) -> Iterator[None]:
    """With `output`: py-spy samples process `pid` (every thread, not idle waits) until the
    block ends, and writes its stacks there (`--format raw`: one collapsed stack a line)."""
    if output is None:
        yield
        return
    beside = Path(sys.executable).parent / "py-spy"  # pip install py-spy (in the venv)
    spy_exe = str(beside) if beside.exists() else "py-spy"
    cmd = [spy_exe, "record", "--pid", str(pid), "--format", "raw", "--function"]
    cmd += ["--threads", "--rate", "250", "--output", str(output)]
    # E.g. ASSAY_BENCH_PYSPY=--native (C frames too; py-spy then pauses the process).
    cmd += os.environ.get("ASSAY_BENCH_PYSPY", "--nonblocking").split()
    with output.with_suffix(".log").open("wb") as log:
        spy = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    time.sleep(0.5)  # attached before the timed part starts
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)  # py-spy writes its file on an interrupt
        try:
            spy.wait(timeout=30)
        except subprocess.TimeoutExpired:
            spy.kill()
            spy.wait()


def _start_server(tmp: Path, port: int, s: Settings, server: str) -> subprocess.Popen[bytes]:
    """An `assay-master` (SQLite store in `tmp`, its log there) with `server` its pool's
    scheduler, or with server "relay" this file's relay (its report on stdout)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    log = tmp / f"{server}.log"
    if server == "relay":
        cmd = [sys.executable, __file__, "--relay-port", str(port), "--count", str(s.experiments)]
        with log.open("wb") as err:
            return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=env, cwd=ROOT)
    if server != "priority":
        env["ASSAY_RESOURCE_POOLS"] = f"[{{name: default, scheduler: {server}}}]"
    cmd = [sys.executable, "-m", "assay.master.main", "--grpc-port", str(port)]
    cmd += ["--http-port", "0"]
    cmd += ["--host", "127.0.0.1", "--state-dir", str(tmp / "master")]
    return _spawn(cmd, log, env)


def _master_ends(store: Any, result: ThroughputResult) -> float | None:
    """Counts the experiments' states into `result`; the last one's end_time (epoch s)."""
    records: list[Any] = []
    while True:
        page = store.list_experiments(limit=1000, offset=len(records))
        records += page.items
        if not page.items or len(records) >= page.total:
            break
    ends: list[dt.datetime] = []
    for record in records:
        result.states[record.state] = result.states.get(record.state, 0) + 1
        if record.state in TERMINAL and record.end_time is not None:
            ends.append(record.end_time)
    result.terminal = len(ends)
    if not ends:
        return None
    return max(e if e.tzinfo else e.replace(tzinfo=dt.UTC) for e in ends).timestamp()


def bench_throughput(
    s: Settings, profile: Path | None = None, server: str = "priority"
) -> ThroughputResult:
    """One run: the fleet connects to `server` (an `assay-master` whose pool runs that
    scheduler, or "relay"), the submitters send the experiments, and the run ends when
    all of them have. `profile` samples a master with py-spy (never the relay)."""
    from assay.master.store import Store

    relay = server == "relay"
    result = ThroughputResult(server=server, agents=s.agents, experiments=s.experiments)
    config_yaml = yaml.safe_dump(
        {
            "name": "sched",
            "entrypoint": "model_def:T",
            "hyperparameters": {"global_batch_size": 8},
            "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 10}},
            "max_restarts": 0,
        }
    )
    with tempfile.TemporaryDirectory(prefix="assay-bench-sched-") as folder:
        tmp = Path(folder)
        port = free_port()
        proc = _start_server(tmp, port, s, server)
        fleet: Fleet | None = None
        store: Store | None = None
        try:
            channel = grpc.insecure_channel(f"127.0.0.1:{port}")
            api = api_pb2_grpc.ApiStub(channel)
            grpc.channel_ready_future(channel).result(timeout=60)
            request = api_pb2.CreateExperimentRequest(
                config_yaml=config_yaml, model_definition=_tiny_archive(tmp), activate=True
            )
            request_file = tmp / "request.bin"
            request_file.write_bytes(request.SerializeToString())
            t_reg = time.perf_counter()
            fleet = Fleet(port, s.agents, tmp / "fleet.log")
            fleet.ready(timeout=120)
            auth = _login(api)
            info = api.GetMasterInfo(api_pb2.GetMasterInfoRequest(), timeout=30, metadata=auth)
            if info.agents != s.agents:
                raise RuntimeError(f"{info.agents} of {s.agents} agents registered")
            result.register_s = time.perf_counter() - t_reg
            channel.close()
            submit_cmd = [sys.executable, __file__, "--submit-port", str(port)]
            submit_cmd += ["--count", str(s.experiments), "--request", str(request_file)]
            cpu0 = _cpu_s(proc.pid)
            relayed: dict[str, Any] = {}
            with _sampling(proc.pid, None if relay else profile):
                done = subprocess.run(
                    submit_cmd, capture_output=True, cwd=ROOT, timeout=s.deadline_s, check=False
                )
                if done.returncode != 0:
                    raise RuntimeError(f"the submitters failed:\n{done.stderr.decode()[-3000:]}")
                submitted = json.loads(done.stdout.decode().strip().splitlines()[-1])
                t0, ids = float(submitted["t0"]), list(submitted["ids"])
                result.submit_s = float(submitted["t1"]) - t0
                if relay:
                    assert proc.stdout is not None
                    line = _read_line(proc.stdout, s.deadline_s)
                    relayed = json.loads(line) if line else {}
                    result.timed_out = not relayed
                else:
                    store = Store.open(
                        f"sqlite:///{tmp / 'master' / 'assay.db'}", migrate_schema=False
                    )
                    result.timed_out = not _count_terminal(store, len(ids), s.deadline_s)
            result.cpu_s = _cpu_s(proc.pid) - cpu0
            t_end = time.time()
            last: float | None
            if relay:
                result.terminal = int(relayed.get("ended", 0))
                last = relayed.get("last_end")
            else:
                assert store is not None
                last = _master_ends(store, result)
            report = fleet.stop()
            result.placements = int(report["starts"])
            result.errors = list(report["errors"])
            if report["first"] is not None:
                result.first_to_last_start_s = float(report["last"]) - float(report["first"])
            if result.timed_out or last is None:
                result.elapsed_s = t_end - t0
            else:
                result.elapsed_s = float(last) - t0
        except Exception:
            print((tmp / f"{server}.log").read_text()[-3000:], file=sys.stderr)
            raise
        finally:
            if store is not None:
                store.close()
            if fleet is not None:
                fleet.close()
            _stop_procs([proc])
            if proc.stdout is not None:
                proc.stdout.close()
    return result


def _merge_profiles(parts: list[Path], output: Path) -> None:
    """py-spy's raw stacks of several runs as one file: the counts of a stack added."""
    counts: dict[str, int] = {}
    for part in parts:
        if not part.exists():
            continue
        for line in part.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if stack and count.isdigit():
                counts[stack] = counts.get(stack, 0) + int(count)
        part.unlink()
    output.write_text("".join(f"{stack} {count}\n" for stack, count in counts.items()))


# --- driver --------------------------------------------------------------------------------


def _median_run(runs: list[ThroughputResult]) -> ThroughputResult:
    """The run with the median rate (the lower middle one of an even count)."""
    return sorted(runs, key=lambda r: r.allocations_per_s)[(len(runs) - 1) // 2]


def _medians(runs: list[ThroughputResult]) -> tuple[float, float] | None:
    """Median allocations/s and median server CPU ms per allocation of `runs`."""
    if not runs:
        return None
    rate = statistics.median(r.allocations_per_s for r in runs)
    return rate, statistics.median(r.cpu_ms_per_allocation for r in runs)


def summary(
    lat: LatencyResult | None,
    masters: list[ThroughputResult],
    relays: list[ThroughputResult],
    quick: bool,
    wall_s: float,
) -> dict[str, Any]:
    """The JSON line. The throughput keys without a prefix are the master's (medians of
    its runs; counts and times from its median run); relay_* the relay's; the ratios are
    master median / relay median."""
    ratio = lat.assay_s / lat.bare_s if lat else None
    thr = _median_run(masters) if masters else None
    master, relay = _medians(masters), _medians(relays)
    out: dict[str, Any] = {
        "benchmark": "scheduling",
        "quick": quick,
        "ratio": round(ratio, 3) if ratio is not None else None,
        "target": LATENCY_TARGET,
        "latency_assay_s": round(lat.assay_s, 3) if lat else None,
        "latency_bare_s": round(lat.bare_s, 3) if lat else None,
        "latency_assay_runs_s": [round(v, 3) for v in lat.assay] if lat else None,
        "latency_bare_runs_s": [round(v, 3) for v in lat.bare] if lat else None,
        "allocations_per_s": round(master[0], 1) if master else None,
        "allocations_target": ALLOCATIONS_TARGET,
        "agents": thr.agents if thr else None,
        "experiments": thr.experiments if thr else None,
        "placements": thr.placements if thr else None,
        "terminal": thr.terminal if thr else None,
        "experiment_states": thr.states if thr else None,
        "throughput_elapsed_s": round(thr.elapsed_s, 2) if thr else None,
        "submits_per_s": round(thr.submits_per_s, 1) if thr else None,
        "register_s": round(thr.register_s, 2) if thr else None,
        "master_cpu_ms_per_allocation": round(master[1], 3) if master else None,
        "timed_out": any(r.timed_out for r in masters + relays) if thr else None,
        "relay_allocations_per_s": round(relay[0], 1) if relay else None,
        "relay_cpu_ms_per_allocation": round(relay[1], 3) if relay else None,
        "relay_allocations_per_s_runs": [round(r.allocations_per_s, 1) for r in relays],
        "relay_cpu_ms_per_allocation_runs": [round(r.cpu_ms_per_allocation, 3) for r in relays],
        "throughput_ratio": (
            round(master[0] / relay[0], 3) if master and relay and relay[0] > 0 else None
        ),
        "throughput_cpu_ratio": (
            round(master[1] / relay[1], 3) if master and relay and relay[1] > 0 else None
        ),
    }
    passed = True
    if ratio is not None:
        passed = passed and ratio <= LATENCY_TARGET
    if master is not None:
        complete = all(r.complete for r in masters + relays)
        out["throughput_complete"] = complete
        passed = passed and complete and master[0] >= ALLOCATIONS_TARGET
    out["wall_s"] = round(wall_s, 1)
    out["passed"] = passed
    return out


def _run_line(thr: ThroughputResult) -> str:
    side = "relay" if thr.server == "relay" else "master"
    return (
        f"[{thr.server}] "
        f"throughput: {thr.agents} agents, {thr.experiments} experiments: "
        f"{thr.placements} placements, {thr.terminal} terminal in {thr.elapsed_s:.2f} s "
        f"-> {thr.allocations_per_s:,.1f} allocations/s (target >= {ALLOCATIONS_TARGET:,.0f}); "
        f"submits {thr.submits_per_s:,.1f}/s over {thr.submit_s:.2f} s; "
        f"starts spread {thr.first_to_last_start_s:.2f} s; "
        + (f"states {thr.states}; " if thr.states else "")
        + f"{side} CPU {thr.cpu_ms_per_allocation:.2f} ms/allocation; "
        f"{thr.agents} agents registered in {thr.register_s:.2f} s"
        + (" TIMED OUT" if thr.timed_out else "")
        + (f"; agent errors {thr.errors}" if thr.errors else "")
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--quick", action="store_true", help="3 reps, 200 agents, 1 relay/master pair (< 1 min)"
    )
    parser.add_argument("--only", choices=("latency", "throughput"), help="run one part")
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="FILE",
        help="sample the throughput runs' masters with py-spy into FILE (collapsed stacks "
        "of all of them; slows the runs, so their numbers are not the benchmark's)",
    )
    parser.add_argument(
        "--policy",
        choices=("priority", "fair_share", "both"),
        default="priority",
        help="the scheduler of the throughput run's pool (both: compare them)",
    )
    parser.add_argument("--fleet-port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--agents", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--submit-port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--relay-port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--request", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.fleet_port is not None:
        return fleet_main(int(args.fleet_port), int(args.agents))
    if args.submit_port is not None:
        return submit_main(int(args.submit_port), int(args.count), Path(args.request))
    if args.relay_port is not None:
        return relay_main(int(args.relay_port), int(args.count))
    s = QUICK if args.quick else FULL
    t0 = time.perf_counter()
    lat: LatencyResult | None = None
    if args.only in (None, "latency"):
        lat = bench_latency(s)
        print(
            f"latency submit -> first trained batch: assay median {lat.assay_s:.3f} s "
            f"({', '.join(f'{v:.3f}' for v in lat.assay)}; warm-up {lat.warmup_assay_s:.3f}), "
            f"bare torch process median {lat.bare_s:.3f} s "
            f"({', '.join(f'{v:.3f}' for v in lat.bare)}; warm-up {lat.warmup_bare_s:.3f}); "
            f"ratio {lat.assay_s / lat.bare_s:.2f} (target <= {LATENCY_TARGET})",
            flush=True,
        )
    policies = ["priority", "fair_share"] if args.policy == "both" else [args.policy]
    rounds = 2 if args.policy == "both" else 1 if args.quick else 3
    runs: dict[str, list[ThroughputResult]] = {}
    relays: list[ThroughputResult] = []
    parts: list[Path] = []
    for _ in range(rounds) if args.only in (None, "throughput") else []:
        relays.append(bench_throughput(s, server="relay"))
        print(_run_line(relays[-1]), flush=True)
        for policy in policies:
            part = None
            if args.profile is not None:
                part = args.profile.with_name(f"{args.profile.name}.part{len(parts)}")
                parts.append(part)
            thr = bench_throughput(s, part, policy)
            runs.setdefault(policy, []).append(thr)
            print(_run_line(thr), flush=True)
    if args.profile is not None and parts:
        _merge_profiles(parts, args.profile)
    masters = runs.get("priority" if args.policy == "both" else args.policy, [])
    out = summary(lat, masters, relays, bool(args.quick), time.perf_counter() - t0)
    for policy, results in runs.items():
        out[f"{policy}_allocations_per_s"] = [round(r.allocations_per_s, 1) for r in results]
        out[f"{policy}_master_cpu_ms_per_allocation"] = [
            round(r.cpu_ms_per_allocation, 3) for r in results
        ]
    if masters and relays:
        print(
            f"throughput medians of {len(relays)} relay and {len(masters)} master runs: "
            f"relay {out['relay_allocations_per_s']:,.1f}/s, "
            f"{out['relay_cpu_ms_per_allocation']:.2f} ms CPU/allocation; "
            f"master [{masters[0].server}] {out['allocations_per_s']:,.1f}/s, "
            f"{out['master_cpu_ms_per_allocation']:.2f} ms CPU/allocation; "
            f"master / relay: throughput_ratio {out['throughput_ratio']}, "
            f"CPU {out['throughput_cpu_ratio']}",
            flush=True,
        )
    if len(runs) == 2:
        rate = {p: statistics.median(r.allocations_per_s for r in rs) for p, rs in runs.items()}
        out["fair_share_over_priority"] = round(rate["fair_share"] / rate["priority"], 3)
        print(
            f"fair_share / priority allocations/s (medians): "
            f"{rate['fair_share']:,.1f} / {rate['priority']:,.1f} = "
            f"{out['fair_share_over_priority']:.3f} (the bar: >= 0.9)",
            flush=True,
        )
    print(f"passed={out['passed']}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
