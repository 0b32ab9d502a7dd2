"""GPU islands from NVML topology (a fake NVML: this machine has no GPU): NVLink groups,
else NUMA nodes; an NVML that cannot tell puts every GPU in island 0; the island reaches
the master and `agent list --json`."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from typing import Any
from unittest import mock

from assay.agent import Agent
from assay.agent._devices import detect_devices
from assay.agent._topology import gpu_islands
from assay.master.fleet import Fleet
from assay.master.scheduler import Pools, Request
from assay.master.wire import device_message, devices, registration
from tests.agent.conftest import FakeMaster, FakeNVML, start_message


class TopologyNVML(FakeNVML):
    """`count` GPUs; `nvlink` lists the linked pairs; `numa[i]` is GPU i's NUMA node."""

    NVML_P2P_CAPS_INDEX_NVLINK = 2
    NVML_P2P_STATUS_OK = 0
    NVML_TOPOLOGY_NODE = 40
    NVML_TOPOLOGY_SYSTEM = 50

    def __init__(
        self, count: int, nvlink: list[tuple[int, int]] | None = None, numa: list[int] | None = None
    ) -> None:
        super().__init__(count)
        self.nvlink = {frozenset(p) for p in nvlink or []}
        self.numa = numa or [0] * count

    def nvmlDeviceGetP2PStatus(self, a: int, b: int, index: int) -> int:  # noqa: N802
        assert index == self.NVML_P2P_CAPS_INDEX_NVLINK
        return 0 if frozenset((a, b)) in self.nvlink else 4  # 4: NOT_SUPPORTED

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:  # noqa: N802
        return (
            self.NVML_TOPOLOGY_NODE if self.numa[a] == self.numa[b] else self.NVML_TOPOLOGY_SYSTEM
        )


def test_nvlink_pairs_make_islands() -> None:
    # Two NVLink quads (as on a 2-board machine), whatever the NUMA nodes say.
    quads = [(0, 1), (1, 2), (2, 3), (4, 5), (5, 6), (6, 7)]
    nvml = TopologyNVML(8, nvlink=quads, numa=[0, 1, 0, 1, 0, 1, 0, 1])
    assert gpu_islands(nvml, list(range(8))) == {i: 0 if i < 4 else 1 for i in range(8)}


def test_without_nvlink_numa_nodes_are_the_islands() -> None:
    nvml = TopologyNVML(4, numa=[1, 1, 0, 0])
    assert gpu_islands(nvml, [0, 1, 2, 3]) == {0: 0, 1: 0, 2: 1, 3: 1}


def test_an_nvml_without_topology_puts_every_gpu_in_island_0() -> None:
    assert gpu_islands(FakeNVML(3), [0, 1, 2]) == {0: 0, 1: 0, 2: 0}


def test_the_island_goes_from_detection_to_the_masters_view() -> None:
    monitor = detect_devices(nvml=TopologyNVML(4, numa=[0, 0, 1, 1]))
    assert [d.island for d in monitor.devices] == [0, 0, 1, 1]
    sampled = monitor.sample()
    assert [d.island for d in sampled] == [0, 0, 1, 1]  # heartbeats keep it
    wire = [d.to_proto() for d in sampled]
    seen: Any = devices(wire)
    assert [d.island for d in seen] == [0, 0, 1, 1]
    assert [device_message(d, "cuda").island for d in seen] == [0, 0, 1, 1]


def test_a_two_slot_trial_runs_on_gpus_of_one_island(
    master: FakeMaster, run_agent: Callable[..., Agent]
) -> None:
    # Islands interleave (GPUs 0 and 2 on NUMA node 0, 1 and 3 on node 1), so the two
    # lowest GPUs would straddle them: the master's scheduler, fed the agent's own
    # Register message, picks a pair of one island, and the agent runs on exactly those.
    run_agent(nvml=TopologyNVML(4, numa=[0, 1, 0, 1]), slot_type="cuda", slots=None)
    register = master.wait_for("register")
    assert [d.island for d in register.devices] == [0, 1, 0, 1]
    fleet = Fleet(Pools(), mock.MagicMock, lambda f: f(), kill_grace_s=5)
    now = dt.datetime.now(dt.UTC)
    fleet.register(registration(register, "127.0.0.1"), "127.0.0.1", mock.MagicMock(), now)
    decision = fleet.scheduler.schedule([Request("trial", 2, "cuda")])
    [(agent_id, slots)] = decision.assignments[0].placement
    assert (agent_id, slots) == ("test-agent", (0, 2))

    master.send(start_message("a1", {"mode": "exit"}, slots=slots))
    assert list(master.exited("a1").exit_codes) == [0, 0]
    seen = set()
    for line in master.lines("a1"):
        if line.message.startswith("REPORT "):
            seen.add(
                json.loads(line.message.removeprefix("REPORT "))["env"]["CUDA_VISIBLE_DEVICES"]
            )
    assert seen == {"0", "2"}
    assert {register.devices[int(d)].island for d in seen} == {0}
