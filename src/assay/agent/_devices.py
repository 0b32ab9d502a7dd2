"""What this machine offers the master: its GPUs (through NVML) or a number of CPU slots.

NVML is reached through a module object (`pynvml` from nvidia-ml-py by default) that callers
may replace: tests pass a stand-in that reports GPUs a machine without one does not have.
"""

from __future__ import annotations

import importlib
import logging
import os
import platform
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import psutil

from assay.agent._topology import gpu_islands
from assay.errors import AssayError
from assay.proto import common_pb2

log = logging.getLogger("assay.agent")

SlotKind = Literal["cpu", "cuda"]

_PROTO_TYPES = {"cpu": common_pb2.SLOT_TYPE_CPU, "cuda": common_pb2.SLOT_TYPE_CUDA}


class NoGPUError(AssayError):
    """`--slot-type cuda` was asked for on a machine where NVML finds no GPU."""


@dataclass(frozen=True)
class DeviceInfo:
    """One slot: a GPU, or a share of the CPUs. `utilization` is a fraction (0-1)."""

    index: int
    kind: SlotKind
    name: str
    uuid: str
    memory_bytes: int
    utilization: float = 0.0
    memory_used_bytes: int = 0  # a GPU's, last sample (0 for CPU slots)
    # GPUs joined by NVLink (else on one NUMA node) share a number; see `_topology`.
    island: int = 0

    def to_proto(self) -> common_pb2.Device:
        return common_pb2.Device(
            index=self.index,
            type=_PROTO_TYPES[self.kind],
            name=self.name,
            uuid=self.uuid,
            memory_bytes=self.memory_bytes,
            utilization=self.utilization,
            island=self.island,
        )


def slot_type_proto(kind: SlotKind) -> common_pb2.SlotType.ValueType:
    return _PROTO_TYPES[kind]


def load_nvml() -> Any | None:
    """The `pynvml` module, or None when nvidia-ml-py is not installed."""
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        return None


def cpu_model_name() -> str:
    """The CPU's marketing name ("AMD EPYC 7763 64-Core Processor"), or a generic one."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Hardware", "cpu model") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _text(value: Any) -> str:
    """NVML strings are bytes in old bindings and str in new ones."""
    return value.decode() if isinstance(value, bytes) else str(value)


class DeviceMonitor:
    """The agent's slots, sampled again for utilisation on every heartbeat."""

    def __init__(self, kind: SlotKind, devices: list[DeviceInfo], nvml: Any | None = None):
        self.kind: SlotKind = kind
        self.devices = devices
        self._nvml = nvml

    def sample(self, cpu_busy: float | None = None) -> list[DeviceInfo]:
        """The devices with fresh utilisation (NVML for GPUs, psutil for CPU slots).

        `cpu_busy` is a CPU fraction the caller has just measured: psutil measures since
        its previous call, so two calls in a row would report an idle machine.
        """
        if self.kind == "cpu":
            busy = psutil.cpu_percent(interval=None) / 100.0 if cpu_busy is None else cpu_busy
            return [replace(d, utilization=busy) for d in self.devices]
        assert self._nvml is not None
        sampled = []
        for device in self.devices:
            try:
                handle = self._nvml.nvmlDeviceGetHandleByIndex(device.index)
                rates = self._nvml.nvmlDeviceGetUtilizationRates(handle)
                used = int(self._nvml.nvmlDeviceGetMemoryInfo(handle).used)
                sampled.append(
                    replace(device, utilization=float(rates.gpu) / 100.0, memory_used_bytes=used)
                )
            except Exception as e:  # a GPU fallen off the bus must not stop heartbeats
                log.warning("cannot sample GPU %d: %s", device.index, e)
                sampled.append(device)
        return sampled

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception as e:
                log.debug("nvmlShutdown failed: %s", e)
            self._nvml = None


def _gpus(nvml: Any) -> list[DeviceInfo]:
    nvml.nvmlInit()
    devices = []
    for index in range(int(nvml.nvmlDeviceGetCount())):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        rates = nvml.nvmlDeviceGetUtilizationRates(handle)
        devices.append(
            DeviceInfo(
                index=index,
                kind="cuda",
                name=_text(nvml.nvmlDeviceGetName(handle)),
                uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                memory_bytes=int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
                utilization=float(rates.gpu) / 100.0,
            )
        )
    islands = gpu_islands(nvml, [d.index for d in devices])
    return [replace(d, island=islands[d.index]) for d in devices]


def cpu_devices(slots: int | None = None) -> list[DeviceInfo]:
    """`slots` CPU slots (default: one per CPU); each reports its share of the memory."""
    count = slots if slots is not None else (os.cpu_count() or 1)
    if count < 1:
        raise ValueError(f"slots must be at least 1, got {count}")
    name = cpu_model_name()
    share = psutil.virtual_memory().total // count
    return [
        DeviceInfo(index=i, kind="cpu", name=name, uuid="", memory_bytes=share)
        for i in range(count)
    ]


def detect_devices(
    slot_type: SlotKind | None = None,
    slots: int | None = None,
    nvml: Any | None = None,
) -> DeviceMonitor:
    """Find the slots to offer.

    GPUs come first: with `slot_type` unset or "cuda", every GPU NVML reports becomes a
    slot (`slots` caps their number). Without NVML or GPUs, or with `slot_type="cpu"`,
    the agent offers `slots` CPU slots (default: one per CPU). `nvml` replaces the
    `pynvml` module (tests); None imports it.
    """
    if slot_type != "cpu":
        module = nvml if nvml is not None else load_nvml()
        reason = "nvidia-ml-py is not installed"
        gpus: list[DeviceInfo] = []
        if module is not None:
            try:
                gpus = _gpus(module)
                reason = "NVML reports no GPU"
                if not gpus:
                    module.nvmlShutdown()
            except Exception as e:  # NVMLError: no driver, no libnvidia-ml.so, ...
                reason = f"NVML failed: {_text(e) or type(e).__name__}"
        if gpus:
            if slots is not None:
                gpus = gpus[:slots]
            return DeviceMonitor("cuda", gpus, module)
        if slot_type == "cuda":
            raise NoGPUError(
                f"--slot-type cuda, but no GPU was found ({reason}); install the NVIDIA "
                "driver, or run with --slot-type cpu"
            )
        log.info("no GPU found (%s); offering CPU slots", reason)
    return DeviceMonitor("cpu", cpu_devices(slots))


__all__ = [
    "DeviceInfo",
    "DeviceMonitor",
    "NoGPUError",
    "SlotKind",
    "cpu_devices",
    "cpu_model_name",
    "detect_devices",
    "load_nvml",
    "slot_type_proto",
]
