"""Each rank's utilisation, sampled for the heartbeat: what a trial's page shows per rank.

A rank is the process the agent started for one slot and every process under it (data
loader workers, the isolation wrapper's child): their CPU time per second since the last
heartbeat and their resident memory, from psutil. A rank on a GPU slot also reports that
GPU's utilisation and memory in use, from the devices sampled for the same heartbeat.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import psutil

from assay.agent._devices import DeviceInfo
from assay.proto import common_pb2


@dataclass(frozen=True)
class RankProcess:
    """One rank of a running allocation: its slot and the process started for it."""

    allocation_id: str
    rank: int
    slot: int
    pid: int


class RankSampler:
    """Keeps psutil's handle of every process it has seen, so that each sample measures
    CPU time since the previous one (psutil's first reading of a process is 0)."""

    def __init__(self) -> None:
        self._seen: dict[int, psutil.Process] = {}

    def sample(
        self, ranks: Iterable[RankProcess], devices: Sequence[DeviceInfo]
    ) -> list[common_pb2.RankUsage]:
        """One `RankUsage` per rank whose process is still there."""
        by_slot = {d.index: d for d in devices if d.kind == "cuda"}
        alive: dict[int, psutil.Process] = {}
        out = []
        for rank in ranks:
            processes = self._tree(rank.pid, alive)
            if not processes:
                continue
            cpu, rss = 0.0, 0
            for process in processes:
                with contextlib.suppress(psutil.Error):
                    cpu += self._cpu(process)
                    rss += process.memory_info().rss
            usage = common_pb2.RankUsage(
                allocation_id=rank.allocation_id,
                rank=rank.rank,
                slot=rank.slot,
                cpu_utilization=cpu,
                memory_rss_bytes=rss,
            )
            device = by_slot.get(rank.slot)
            if device is not None:
                usage.device_utilization = device.utilization
                usage.device_memory_used_bytes = device.memory_used_bytes
                usage.device_memory_bytes = device.memory_bytes
            usage.time.GetCurrentTime()
            out.append(usage)
        self._seen = alive  # processes gone since are forgotten
        return out

    def _cpu(self, process: psutil.Process) -> float:
        """CPUs busy since the last sample; for a process not seen before (psutil's first
        reading is 0), its average since it started."""
        since_last = float(process.cpu_percent(interval=None)) / 100.0
        if process.pid in self._seen:
            return since_last
        times = process.cpu_times()
        alive_s = time.time() - process.create_time()
        return float(times.user + times.system) / alive_s if alive_s > 0 else 0.0

    def _tree(self, pid: int, alive: dict[int, psutil.Process]) -> list[psutil.Process]:
        """The rank's process and its descendants, as handles kept across samples."""
        try:
            root = self._handle(pid)
            found = [root, *root.children(recursive=True)]
        except psutil.Error:
            return []
        kept = []
        for process in found:
            try:
                handle = self._seen.get(process.pid) or process
                # A pid reused by another process is another process.
                if handle.create_time() != process.create_time():
                    handle = process
            except psutil.Error:
                continue
            alive[process.pid] = handle
            kept.append(handle)
        return kept

    def _handle(self, pid: int) -> psutil.Process:
        known = self._seen.get(pid)
        return known if known is not None else psutil.Process(pid)


__all__ = ["RankProcess", "RankSampler"]
