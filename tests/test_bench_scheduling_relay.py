"""bench/scheduling.py's throughput baseline, the relay: a bare grpc.aio server that places
each submitted experiment on a free simulated agent (FIFO when none is free), over real
gRPC, in its own process, as the bench runs it."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import select
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import grpc
import pytest

from assay._rank_processes import free_port
from assay.proto import agent_pb2, agent_pb2_grpc, api_pb2, api_pb2_grpc, common_pb2

BENCH = Path(__file__).resolve().parent.parent / "bench" / "scheduling.py"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_scheduling", BENCH)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _relay(port: int, count: int) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, str(BENCH), "--relay-port", str(port), "--count", str(count)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _stop(proc: subprocess.Popen[bytes]) -> bytes:
    proc.terminate()
    out, _ = proc.communicate(timeout=20)
    return out


def _report_line(proc: subprocess.Popen[bytes], timeout: float) -> bytes:
    """The relay's report, printed once its count of allocations has ended: the last exit
    may still be on its way when the agent's stream closes."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    return proc.stdout.readline() if ready else b""


async def _one_agent_three_experiments(port: int) -> tuple[list[str], list[str]]:
    """One agent, three experiments submitted at once: the relay must start them one at a
    time, in submission order, each only after the agent reported the previous one ended."""
    events: list[str] = []
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        api = api_pb2_grpc.ApiStub(channel)
        call = agent_pb2_grpc.AgentServiceStub(channel).Connect()
        await call.write(
            agent_pb2.AgentMessage(
                register=agent_pb2.Register(agent_id="a0", slot_type=common_pb2.SLOT_TYPE_CPU)
            )
        )
        first = await call.read()
        assert first.WhichOneof("message") == "registered"
        info = await api.GetMasterInfo(api_pb2.GetMasterInfoRequest(), timeout=10)
        assert info.agents == 1
        token = (await api.Login(api_pb2.LoginRequest(username="x", password="y"))).token
        assert token
        request = api_pb2.CreateExperimentRequest(config_yaml="name: x", model_definition=b"tgz")
        created = [await api.CreateExperiment(request, timeout=10) for _ in range(3)]
        ids = [str(c.experiment.id) for c in created]
        reading = asyncio.ensure_future(call.read())
        for _ in range(3):
            message = await asyncio.wait_for(reading, timeout=10)
            start = message.start
            assert message.WhichOneof("message") == "start"
            assert start.model_definition == b"tgz"
            assert start.world_size == 1
            events.append(str(start.experiment_id))
            # Nothing else may arrive while this allocation runs: the agent has one slot.
            reading = asyncio.ensure_future(call.read())
            arrived, _ = await asyncio.wait({reading}, timeout=0.3)
            assert not arrived, reading.result()
            await call.write(
                agent_pb2.AgentMessage(
                    allocation_state=agent_pb2.AllocationStateChange(
                        allocation_id=start.allocation_id,
                        state=agent_pb2.ALLOCATION_STATE_EXITED,
                        exit_codes=[1],
                    )
                )
            )
        reading.cancel()
        call.cancel()
    return ids, events


def test_relay_starts_queued_experiments_in_order_one_per_free_agent() -> None:
    port = free_port()
    proc = _relay(port, 3)
    try:
        grpc.channel_ready_future(grpc.insecure_channel(f"127.0.0.1:{port}")).result(timeout=30)
        ids, started = asyncio.run(_one_agent_three_experiments(port))
        line = _report_line(proc, timeout=20)
    finally:
        _stop(proc)
    assert started == ids
    assert len(set(ids)) == 3
    assert line, "the relay printed no report"
    report = json.loads(line)
    assert report["ended"] == 3
    assert report["placed"] == 3
    assert report["last_end"] > 0


def test_relay_run_of_the_bench_places_and_ends_every_experiment() -> None:
    bench = _bench()
    settings = bench.Settings(reps=1, agents=6, experiments=40, deadline_s=60.0)
    result = bench.bench_throughput(settings, server="relay")
    assert result.complete, result
    assert result.placements == 40
    assert result.terminal == 40
    assert result.allocations_per_s > 0
    assert result.elapsed_s > 0


@pytest.mark.slow
def test_quick_throughput_reports_relay_and_master_and_their_ratio() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--only", "throughput", "--quick"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["throughput_complete"] is True
    assert out["placements"] == out["experiments"] == 400
    assert len(out["relay_allocations_per_s_runs"]) == 1
    assert len(out["priority_allocations_per_s"]) == 1
    master, relay = out["allocations_per_s"], out["relay_allocations_per_s"]
    assert master > 0
    assert relay > 0
    assert out["throughput_ratio"] == pytest.approx(master / relay, rel=0.01)
    cpu = out["master_cpu_ms_per_allocation"] / out["relay_cpu_ms_per_allocation"]
    assert out["throughput_cpu_ratio"] == pytest.approx(cpu, rel=0.01)
    assert "relay" in done.stdout
    assert "throughput_ratio" in done.stdout
