"""What a trial's processes share however they train: their ranks from torchrun's
variables, Determined's rank accessors, and the Gloo group on the CPU that control votes
and object collectives run on.

Both the Core API's `DistributedContext` and a Trial's `context.distributed` stand on this.
torch is imported only when a group is made.
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


_KEPT: list[Any] = []  # the groups `leave_groups` destroyed, held until exit


def leave_groups() -> None:
    """`destroy_process_group()`, the groups' Python objects held until exit.

    A DDP model's reducer holds the default group. Had the reducer dropped the group's
    last reference (the model freed when the script's function returns), the group's
    destructor would join Gloo's worker threads with the GIL held, while a worker still
    freeing a finished collective's tensors waits for the GIL: a deadlock (one run in 12
    of two Trainer API ranks on a loaded machine hung after its work was done). A
    group's own Python object frees it with the GIL released, so that object keeps the
    last reference here until exit (`_release_groups`).
    """
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    world = getattr(distributed_c10d, "_world", None)
    groups = list(getattr(world, "pg_map", None) or ())
    if not groups and dist.group.WORLD is not None:
        groups = [dist.group.WORLD]
    _KEPT.extend(groups)
    release_groups_at_exit()
    dist.destroy_process_group()


def _release_groups() -> None:
    _CONTROL.clear()
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
    _KEPT.clear()  # the last references, if the models that held them are gone


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


_CONTROL: dict[int, Any] = {}  # id of the default group -> its control group


def control_group() -> Any:
    """A Gloo group on the CPU for control votes: no device sync, whatever the backend
    (None: the default group is Gloo already)."""
    import torch.distributed as dist

    key = id(dist.group.WORLD)
    if key not in _CONTROL:
        _CONTROL.clear()
        gloo = dist.get_backend() == "gloo"
        _CONTROL[key] = None if gloo else dist.new_group(backend="gloo")
    return _CONTROL[key]
