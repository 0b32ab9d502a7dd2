"""Ranks that leave their process group exit, though their DDP model outlives it.

Two ranks wrap a model in DDP, start a broadcast that nobody waits for (as the object
collectives leave a finished collective's tensors for Gloo's worker thread to free), leave
the group as `assay.core` and the Trainer API do, and drop the model. The group's last
reference must not be the reducer's: its destructor joins Gloo's worker threads with the
GIL held, and a worker freeing those tensors waits for the GIL (a Trainer API rank hung
so, once in 12 runs of two ranks on a loaded machine). This file is also the worker.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from assay._rank_processes import free_port


def _worker(mode: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from assay._ranks import leave_groups

    dist.init_process_group("gloo")
    model = DistributedDataParallel(torch.nn.Linear(4, 2))
    model(torch.randn(3, 4)).sum().backward()
    dist.barrier()
    payload = torch.arange(1 << 16, dtype=torch.float32)
    if dist.get_rank() == 1:
        time.sleep(1)  # rank 0's broadcast finishes while rank 0 drops its model
    dist.broadcast(payload, src=0, async_op=True)  # its handle dropped at once
    if mode == "assay":
        leave_groups()
    else:
        dist.destroy_process_group()
    del model  # the reducer's reference to the default group goes
    gc.collect()
    print("LEFT", payload.shape, flush=True)  # the tensor's Python object lives on


def _run(mode: str) -> list[tuple[int | None, str]]:
    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root / "src"), str(root)]),
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "OMP_NUM_THREADS": "1",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, mode],
            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    out: list[tuple[int | None, str]] = []
    for proc in procs:
        try:
            text, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            text, _ = proc.communicate()
            out.append((None, text))
            continue
        out.append((proc.returncode, text))
    return out


@pytest.mark.slow
def test_ranks_that_leave_their_group_exit_though_their_ddp_model_outlives_it() -> None:
    for code, text in _run("assay"):
        assert code == 0, f"exit {code} (None: hung):\n{text[-2000:]}"
        assert "LEFT" in text, text[-2000:]


if __name__ == "__main__":
    _worker(sys.argv[1])
