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

import atexit
import gc
import os
import sys
from collections.abc import Mapping
from typing import Any, TypeVar

from assay.errors import AssayError

T = TypeVar("T")

_RELEASING = False  # whether `release_groups_at_exit` has registered its handler


def release_groups_at_exit() -> None:
    """Free, at exit while the interpreter is whole, the process groups that only
    Python objects still hold (once per process; no torch import).

    A device mesh keeps its groups (`_pg_registry`), and FSDP's hooks and torch's
    sharding caches keep the mesh and the model in reference cycles; the CPU control group
    is held here. So a group outlived `destroy_process_group` into the interpreter's
    teardown, where its Gloo threads could abort a process whose work was done
    ("terminate called without an active exception", exit status -6: 2 runs in 20 of two
    FSDP ranks, 0 in 40 with this). A group still in use (never destroyed) stays held by
    torch.distributed itself: this only drops what outlived it.
    """
    global _RELEASING
    if not _RELEASING:
        _RELEASING = True
        atexit.register(_release_groups)


def _release_groups() -> None:
    control = sys.modules.get("assay._distributed")
    if control is not None:
        control._CONTROL.clear()
    mesh_module = sys.modules.get("torch.distributed.device_mesh")
    if mesh_module is not None:
        mesh = mesh_module.DeviceMesh
        for obj in gc.get_objects():
            # not isinstance: DeviceMesh's metaclass probes every object it is asked about
            # (and warns on some of torch's own)
            if issubclass(type(obj), mesh):
                registry = getattr(obj, "_pg_registry", None)
                if isinstance(registry, dict):
                    registry.clear()
    gc.collect()


class DistributedEnvError(AssayError, ValueError):
    """torch.distributed's variables are malformed or contradict each other."""


def ranks_from_env(env: Mapping[str, str] | None = None) -> tuple[int, int, int, int, int, int]:
    """(rank, size, local_rank, local_size, cross_rank, cross_size) from torchrun's variables."""
    env = os.environ if env is None else env
    try:
        size = int(env.get("WORLD_SIZE", "1"))
        rank = int(env.get("RANK", "0"))
        local_rank = int(env.get("LOCAL_RANK", str(rank)))
        local_size = int(env.get("LOCAL_WORLD_SIZE", str(size)))
        cross_size = int(env.get("GROUP_WORLD_SIZE", str(max(1, size // max(1, local_size)))))
        cross_rank = int(env.get("GROUP_RANK", str(rank // max(1, local_size))))
    except ValueError as e:
        raise DistributedEnvError(f"a torch.distributed variable is not an integer: {e}") from None
    if not 0 <= rank < size:
        raise DistributedEnvError(f"RANK={rank} is outside WORLD_SIZE={size}")
    return rank, size, local_rank, local_size, cross_rank, cross_size


def torchrun_env(
    *,
    rank: int,
    world_size: int,
    local_rank: int,
    local_world_size: int,
    master_addr: str,
    master_port: int,
    run_id: str,
) -> dict[str, str]:
    """The variables torchrun gives each process, so that Lightning, Accelerate and
    `init_process_group("env://")` see a torchrun launch (`TORCHELASTIC_RUN_ID` included).
    The group (machine) rank is `rank // local_world_size`, as `ranks_from_env` reads it.
    """
    local = max(1, local_world_size)
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(local_world_size),
        "GROUP_RANK": str(rank // local),
        "GROUP_WORLD_SIZE": str(max(1, world_size // local)),
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world_size),
        "ROLE_NAME": "default",
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RUN_ID": run_id,
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
    }


class RankAccessors:
    """Determined's accessors and the collectives built on `allgather`, shared by the Core
    API's context and a Trial's `context.distributed` (each has the six numbers and
    `allgather`)."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int

    def allgather(self, obj: T) -> list[T]:
        raise NotImplementedError

    def get_rank(self) -> int:
        return self.rank

    def get_size(self) -> int:
        return self.size

    def get_local_rank(self) -> int:
        return self.local_rank

    def get_local_size(self) -> int:
        return self.local_size

    def get_cross_rank(self) -> int:
        return self.cross_rank

    def get_cross_size(self) -> int:
        return self.cross_size

    @property
    def is_chief(self) -> bool:
        return self.rank == 0

    @property
    def is_local_chief(self) -> bool:
        return self.local_rank == 0

    def gather(self, obj: T) -> list[T] | None:
        """Every process's `obj` in rank order on the chief; None on the others."""
        everyone = self.allgather(obj)
        return everyone if self.rank == 0 else None

    def allgather_local(self, obj: T) -> list[T]:
        """The `obj` of every process on this machine, in local-rank order."""
        everyone = self.allgather((self.cross_rank, self.local_rank, obj))
        mine = sorted((lr, o) for cr, lr, o in everyone if cr == self.cross_rank)
        return [o for _, o in mine]

    def gather_local(self, obj: T) -> list[T] | None:
        """`allgather_local` on this machine's local chief; None on the others."""
        local = self.allgather_local(obj)
        return local if self.local_rank == 0 else None

    def broadcast_local(self, obj: T | None = None) -> T:
        """The `obj` of this machine's local chief, on every process of this machine."""
        return self.allgather_local(obj)[0]  # type: ignore[return-value]


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
                dist.destroy_process_group()
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
            from assay._distributed import _control_group

            self._group, self._group_ready = _control_group(), True
        return self._group


__all__ = ["DistributedContext", "ranks_from_env", "torchrun_env"]
