"""Each rank's peak memory and time per batch, reported as the `system` metric group.

With every training report (each `scheduling_unit` batches) every rank measures:
- `memory_peak_mb/rank_N`: on a GPU, the peak of `torch.cuda.max_memory_allocated` since
  the previous report (the tensors PyTorch allocated: parameters, gradients, optimizer
  state, activations); on CPU, the process's peak resident memory since it started
  (`ru_maxrss`), which includes the Python interpreter and libraries.
- `step_time_ms/rank_N`: wall-clock milliseconds per batch since the previous report,
  data loading included (no device synchronisation is added to measure it).

They go to the `system` group, not `training`, so training curves stay comparable between
runs. The chief reports them for every rank; they show the effect of FSDP and activation
checkpointing on each rank, and a straggler.
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Sequence

import torch

GROUP = "system"


class RankMeter:
    """This rank's measurements since the last `sample()`."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._since = time.perf_counter()
        self._batches = 0

    def batch_done(self) -> None:
        self._batches += 1

    def sample(self) -> tuple[float, float]:
        """(peak memory in MB, ms per batch) since the previous sample; starts a new window."""
        now = time.perf_counter()
        per_batch = (now - self._since) * 1e3 / self._batches if self._batches else 0.0
        self._since, self._batches = now, 0
        return peak_memory_mb(self.device), per_batch


def peak_memory_mb(device: torch.device) -> float:
    """Peak allocated memory on a CUDA device since the last call (the peak is reset), or
    the process's peak resident memory on CPU."""
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        return peak / 2**20
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return float(maxrss) / 2**20 if sys.platform == "darwin" else float(maxrss) / 2**10


def rank_metrics(samples: Sequence[tuple[float, float]]) -> dict[str, float]:
    """Every rank's sample (in rank order) as the `system` group's metrics."""
    out: dict[str, float] = {}
    for rank, (memory, step) in enumerate(samples):
        out[f"memory_peak_mb/rank_{rank}"] = round(memory, 3)
        out[f"step_time_ms/rank_{rank}"] = round(step, 3)
    return out


__all__ = ["GROUP", "RankMeter", "peak_memory_mb", "rank_metrics"]
