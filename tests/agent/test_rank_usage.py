"""Each heartbeat carries every running rank's utilisation: CPU time and resident memory
of the rank's processes (psutil) and, on a GPU slot, that GPU's use (NVML; a stand-in
here, the machine has no GPU)."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from assay.agent._devices import DeviceInfo
from assay.agent._usage import RankProcess, RankSampler
from tests.agent.conftest import FakeMaster, FakeNVML, start_message
from tests.agent.test_agent import RunAgent

# Busy for a while, with a child that holds 64 MiB.
HOLD = "b = b'x' * (64 * 2**20); import time; time.sleep(60)"
BUSY = f"""
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", {HOLD!r}])
end = time.time() + 60
while time.time() < end:
    pass
"""


def test_a_rank_counts_its_children_and_its_gpu() -> None:
    proc = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        sampler = RankSampler()
        gpu = DeviceInfo(1, "cuda", "H100", "GPU-1", 80 * 2**30, 0.5, memory_used_bytes=2**30)
        rank = RankProcess("a1", rank=3, slot=1, pid=proc.pid)
        time.sleep(0.5)  # started, and its child too
        [first] = sampler.sample([rank], [gpu])  # its average since it started
        time.sleep(1.0)

        [usage] = sampler.sample([rank], [gpu])

        assert (usage.allocation_id, usage.rank, usage.slot) == ("a1", 3, 1)
        # One busy core, less what a shared machine takes from it.
        assert 0.1 < usage.cpu_utilization < 2.0
        assert 0.1 < first.cpu_utilization < 2.0
        assert usage.memory_rss_bytes > 64 * 2**20  # the child's bytes count too
        assert usage.device_utilization == 0.5
        assert (usage.device_memory_used_bytes, usage.device_memory_bytes) == (2**30, 80 * 2**30)
        assert usage.time.seconds > 0
    finally:
        for child in psutil.Process(proc.pid).children(recursive=True):
            child.kill()
        proc.kill()
        proc.wait()


def test_a_rank_whose_process_is_gone_is_left_out() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()

    assert RankSampler().sample([RankProcess("a1", 0, 0, proc.pid)], []) == []


def test_heartbeats_carry_each_running_rank(master: FakeMaster, run_agent: RunAgent) -> None:
    run_agent(nvml=FakeNVML(), slot_type="cuda", slots=None)
    master.wait_for("register")
    master.send(start_message("gpu", {"mode": "trap"}, slots=(1, 0), ranks=(0, 1)))
    master.wait_ready("gpu", 2)

    beat = master.wait_for("heartbeat", lambda b: len(b.ranks) == 2)

    by_rank = {r.rank: r for r in beat.ranks}
    assert {r.allocation_id for r in beat.ranks} == {"gpu"}
    assert (by_rank[0].slot, by_rank[1].slot) == (1, 0)
    # FakeNVML: GPU i is 25 * (i + 1) % busy, 1 GiB of 80 in use.
    assert (by_rank[0].device_utilization, by_rank[1].device_utilization) == (0.5, 0.25)
    assert by_rank[0].device_memory_used_bytes == 2**30
    assert by_rank[0].device_memory_bytes == 80 * 2**30
    assert all(r.memory_rss_bytes > 2**20 for r in beat.ranks)
    assert not any(r.agent_id for r in beat.ranks)  # the master says whose it is
