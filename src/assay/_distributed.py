"""Who this process is in the trial's process group, read from the standard torch env vars."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from assay._ranks import RankAccessors, control_group, ranks_from_env, release_groups_at_exit

T = TypeVar("T")


@dataclass(frozen=True)
class DistributedContext(RankAccessors):
    """Rank and size of this process among all slots of the trial (one process per slot).

    `rank`/`size` span every slot; `local_rank`/`local_size` the slots on this machine;
    `cross_rank`/`cross_size` the machines. Determined's `get_rank()`, `get_size()`, ...
    and the collectives of the Core API's context (`gather`, `allgather_local`, ...) are
    here too.
    """

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1
    cross_rank: int = 0
    cross_size: int = 1

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> DistributedContext:
        """Read `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE` (torchrun's names)."""
        return cls(*ranks_from_env(env))

    @property
    def is_distributed(self) -> bool:
        return self.size > 1

    def init_process_group(self, device: torch.device, timeout_s: float = 1800.0) -> None:
        """Join the trial's process group (NCCL on CUDA, Gloo on CPU) if there is one."""
        if not self.is_distributed or dist.is_initialized():
            return
        release_groups_at_exit()  # a script's (the Trainer API's) exit tears nothing down late
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(
            backend=backend,
            init_method="env://",
            rank=self.rank,
            world_size=self.size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        control_group()  # every rank creates it now, together

    def allgather(self, obj: T) -> list[T]:
        """Every rank's `obj`, in rank order (a picklable object; one collective)."""
        if not self.is_distributed:
            return [obj]
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: T) -> T:
        """Rank 0's `obj` on every rank."""
        if not self.is_distributed:
            return obj
        box: list[Any] = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]  # type: ignore[no-any-return]

    def barrier(self) -> None:
        if self.is_distributed:
            dist.barrier()

    def any(self, flag: bool) -> bool:
        """True on every rank if `flag` is True on any (one small CPU collective)."""
        if not self.is_distributed:
            return flag
        votes = torch.tensor([1 if flag else 0], dtype=torch.int32)
        dist.all_reduce(votes, op=dist.ReduceOp.MAX, group=control_group())
        return bool(votes.item())


def default_device(distributed: DistributedContext) -> torch.device:
    """The slot's device: `cuda:LOCAL_RANK` when CUDA is present, else the CPU."""
    if torch.cuda.is_available():
        index = distributed.local_rank % torch.cuda.device_count()
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")
