"""A script's own FSDP ranks leave no process group to the interpreter's teardown.

Two processes run as torchrun starts them: each joins a Gloo group itself, shards a model
with `fully_shard` (torch's default mesh, which holds the group), trains a step and
destroys the group, as a Core API script does. With `assay.core`'s context over the two
ranks, the group's threads are gone by the time the interpreter tears down; without it,
they are still there, and their teardown could abort a finished rank (exit -6, "terminate
called without an active exception"; 2 runs in 20 before). This file is also the worker.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXIT_THREADS = Path(__file__).parents[1] / "fixtures" / "exit_threads"


def _worker(with_core: bool) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo")
    if with_core:
        from assay.core._distributed import DistributedContext

        DistributedContext.from_env()  # what `assay.core.init()` builds on a trial's ranks
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(4, 4)).sum().backward()
    optimizer.step()
    dist.barrier()
    dist.destroy_process_group()


def _threads_at_exit(with_core: bool) -> list[str]:
    """The native threads each rank had left when its interpreter began its teardown."""
    from tests.strategy.test_sharded import _free_port

    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(EXIT_THREADS), str(root)]),
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "OMP_NUM_THREADS": "1",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "core" if with_core else "plain"],
            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    left = []
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        lines = [line for line in err.splitlines() if line.startswith("THREADS AT EXIT ")]
        assert lines, f"exit {proc.returncode}:\n{err[-2000:]}"
        left.append(lines[-1].removeprefix("THREADS AT EXIT "))
    return left


@pytest.mark.slow
def test_a_core_api_scripts_fsdp_group_is_freed_before_the_teardown() -> None:
    for threads in _threads_at_exit(with_core=True):
        assert "gloo" not in threads, threads
    # the check sees the group when nothing frees it (the script alone, without assay.core)
    assert any("gloo" in threads for threads in _threads_at_exit(with_core=False))


if __name__ == "__main__":
    _worker(sys.argv[1] == "core")
