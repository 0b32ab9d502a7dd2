"""`DistributedContext`: who this process is among a trial's processes, and collectives
over plain Python objects.

Built from torchrun's variables (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`,
`GROUP_RANK`), which the agent, `assay trial run-local --slots N` and
`python -m assay.launch.torch_distributed` set for every process. torch is imported only
when a collective runs on more than one process: a one-process script never needs it.

The collectives run on torch.distributed, over a Gloo group on the CPU (no device sync,
whatever backend the training uses). If the script has not joined a process group by the
first collective, this joins one (`env://`: Gloo, plus NCCL for CUDA tensors when CUDA is
present); a script that calls `torch.distributed.init_process_group` itself should do so
before its first collective (or before `assay.core.init()` when it passes
`DistributedContext.from_torch_distributed()`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, TypeVar

from assay._ranks import (
    RankAccessors,
    control_group,
    leave_groups,
    ranks_from_env,
    release_groups_at_exit,
)
from assay.errors import AssayError

T = TypeVar("T")


class DistributedContext(RankAccessors):
    """Rank and size of this process among every process of the trial (one per slot).

    `rank`/`size` span every slot, `local_rank`/`local_size` the slots on this machine,
    `cross_rank`/`cross_size` the machines. Determined's `get_rank()`, `get_size()`, ...
    methods return the same numbers.
    """

    def __init__(
        self,
        *,
        rank: int = 0,
        size: int = 1,
        local_rank: int = 0,
        local_size: int = 1,
        cross_rank: int = 0,
        cross_size: int = 1,
        chief_ip: str | None = None,
    ) -> None:
        if not 0 <= rank < size:
            raise AssayError(f"rank {rank} is outside size {size}")
        self.rank = rank
        self.size = size
        self.local_rank = local_rank
        self.local_size = local_size
        self.cross_rank = cross_rank
        self.cross_size = cross_size
        self.chief_ip = chief_ip
        self._group: Any = None
        self._group_ready = False
        self._joined = False
        if size > 1:
            release_groups_at_exit()

    def __repr__(self) -> str:
        return (
            f"DistributedContext(rank={self.rank}, size={self.size}, "
            f"local_rank={self.local_rank}, local_size={self.local_size}, "
            f"cross_rank={self.cross_rank}, cross_size={self.cross_size})"
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> DistributedContext:
        """Read torchrun's variables (absent: one process)."""
        rank, size, local_rank, local_size, cross_rank, cross_size = ranks_from_env(env)
        return cls(
            rank=rank,
            size=size,
            local_rank=local_rank,
            local_size=local_size,
            cross_rank=cross_rank,
            cross_size=cross_size,
            chief_ip=(env or os.environ).get("MASTER_ADDR"),
        )

    @classmethod
    def from_torch_distributed(cls, chief_ip: str | None = None) -> DistributedContext:
        """The ranks of an initialised torch.distributed default group (the env otherwise).

        Joins the process group first if this process has not (as torchrun's scripts
        usually do themselves with `init_process_group`).
        """
        context = cls.from_env()
        context.chief_ip = chief_ip or context.chief_ip
        if context.size > 1:
            context._join()
            import torch.distributed as dist

            if dist.get_rank() != context.rank or dist.get_world_size() != context.size:
                raise AssayError(
                    f"torch.distributed says rank {dist.get_rank()} of "
                    f"{dist.get_world_size()}, the environment rank {context.rank} of "
                    f"{context.size}"
                )
        return context

    # --- collectives (every process must call them, in the same order) -----------------

    def allgather(self, obj: T) -> list[T]:
        """Every process's `obj`, in rank order."""
        if self.size == 1:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj, group=self._control())
        return out

    def broadcast(self, obj: T) -> T:
        """The chief's `obj`, on every process."""
        if self.size == 1:
            return obj
        import torch.distributed as dist

        box: list[Any] = [obj]
        dist.broadcast_object_list(box, src=0, group=self._control())
        return box[0]  # type: ignore[no-any-return]

    def any(self, flag: bool) -> bool:
        """True on every process if `flag` is True on any (one small CPU collective)."""
        if self.size == 1:
            return flag
        import torch
        import torch.distributed as dist

        votes = torch.tensor([1 if flag else 0], dtype=torch.int32)
        dist.all_reduce(votes, op=dist.ReduceOp.MAX, group=self._control())
        return bool(votes.item())

    def barrier(self) -> None:
        if self.size > 1:
            import torch.distributed as dist

            dist.barrier(group=self._control())

    def close(self, *, together: bool = True) -> None:
        """Leave the process group this context joined (not one the script joined).

        `together`: every process leaves at once (a barrier, then the group is destroyed):
        a Gloo group left to the interpreter's teardown can abort a process ("terminate
        called without an active exception") after its work is done. Otherwise (an error
        on its way out) this process leaves without waiting for the others.
        """
        if self._joined:
            import torch.distributed as dist

            if dist.is_initialized() and together:
                dist.barrier()
                leave_groups()
            self._joined = False
        self._group, self._group_ready = None, False

    # --- the process group ----------------------------------------------------------------

    def _join(self) -> None:
        import torch
        import torch.distributed as dist

        if dist.is_initialized():
            return
        backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
        if torch.cuda.is_available():
            torch.cuda.set_device(self.local_rank % torch.cuda.device_count())
        dist.init_process_group(backend=backend, rank=self.rank, world_size=self.size)
        self._joined = True

    def _control(self) -> Any:
        """A Gloo group on the CPU for object collectives and votes."""
        if not self._group_ready:
            self._join()
            self._group, self._group_ready = control_group(), True
        return self._group


__all__ = ["DistributedContext"]
