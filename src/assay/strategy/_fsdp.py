"""FSDP2 (`torch.distributed.fsdp.fully_shard`): parameters, gradients and optimizer
state are sharded over the ranks; each unit gathers its parameters for its forward and
backward and reduce-scatters its gradients.

Units are the module classes named by `optimizations.fsdp.wrap` (or the submodules over
`min_num_params`), then the root. `hybrid_shard` shards within a machine and replicates
across machines (a 2-D mesh, replicate x shard).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from torch.distributed.tensor import DTensor

from assay._ranks import release_groups_at_exit
from assay.config import FSDPConfig, Precision
from assay.errors import TrainingError
from assay.strategy._base import Ranks, ReduceOp, Strategy, indices_to_names
from assay.strategy._ddp import all_reduce

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


class FSDPStrategy(Strategy):
    """Sharded data parallelism (FSDP2) over every rank of the trial."""

    name = "fsdp"
    forward_is_collective = True
    saves_partial_gradients = False  # a preemption waits for the accumulation's boundary
    shards_checkpoints = True  # every rank writes its own shards (DCP)

    def __init__(
        self,
        ranks: Ranks,
        device: torch.device,
        config: FSDPConfig | None = None,
        precision: Precision = "off",
    ) -> None:
        super().__init__(ranks, device)
        self.config = config or FSDPConfig()
        self.precision = precision
        self._mesh: DeviceMesh | None = None
        # id of each parameter before sharding -> (a weak reference to it, its model, its
        # name): lets an optimizer built before wrapping be pointed at the sharded
        # parameters. Weak, so the unsharded tensors are freed (and a reused id is told
        # apart from the parameter that had it).
        self._before: dict[int, tuple[weakref.ref[nn.Parameter], nn.Module, str]] = {}

    # --- wrapping ------------------------------------------------------------------------

    def mesh(self) -> DeviceMesh:
        if self._mesh is None:
            kind = self.device.type
            if self.config.sharding == "hybrid_shard":
                local, cross = self.ranks.local_size, self.ranks.cross_size
                if local * cross != self.ranks.size:
                    raise TrainingError(
                        f"fsdp sharding hybrid_shard needs the same number of slots on "
                        f"every machine: {self.ranks.size} slots are not {cross} machines x "
                        f"{local}; use full_shard"
                    )
                self._mesh = init_device_mesh(
                    kind, (cross, local), mesh_dim_names=("replicate", "shard")
                )
            else:
                self._mesh = init_device_mesh(kind, (self.ranks.size,))
            release_groups_at_exit()  # the mesh holds its groups into the teardown
        return self._mesh

    def wrap_model(self, model: nn.Module) -> nn.Module:
        if isinstance(model, FSDPModule):
            raise TrainingError("this model is already sharded: wrap each model once")
        model = model.to(self.device)
        for name, param in model.named_parameters():
            self._before[id(param)] = (weakref.ref(param), model, name)
        options: dict[str, Any] = {
            "mesh": self.mesh(),
            "reshard_after_forward": self._reshard(),
            "mp_policy": self._mixed_precision(),
            "offload_policy": self._offload(),
        }
        units = list(_units(model, self.config))
        if self.config.wrap and not units:
            present = sorted({type(m).__name__ for m in model.modules()})
            raise TrainingError(
                f"optimizations.fsdp.wrap names {list(self.config.wrap)}, but "
                f"{type(model).__name__} has no submodule of those classes; its classes: "
                f"{', '.join(present)}"
            )
        for unit in units:
            fully_shard(unit, **options)
        fully_shard(model, **options)
        self.models.append(model)
        return model

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Point `optimizer` at the sharded parameters (it may have been built from the
        model before wrapping, as with `setup(model, optimizer)`)."""
        current = {
            (id(model), name): p for model in self.models for name, p in model.named_parameters()
        }
        sharded = {id(p) for p in current.values()}
        stale = False
        for group in optimizer.param_groups:
            params = []
            for p in group["params"]:
                if id(p) in sharded:
                    params.append(p)
                    continue
                ref, model, name = self._before.get(id(p), (None, None, ""))
                if ref is None or ref() is not p or model is None:
                    raise TrainingError(
                        "under FSDP an optimizer may only step parameters of models wrapped "
                        "with wrap_model / setup"
                    )
                params.append(current[(id(model), name)])
                stale = True
            group["params"] = params
        if stale and optimizer.state:
            raise TrainingError(
                "under FSDP, wrap the optimizer before it has stepped (its state belongs to "
                "the unsharded parameters)"
            )
        return optimizer

    def no_sync(self) -> contextlib.AbstractContextManager[Any]:
        return _no_gradient_sync([m for m in self.models if isinstance(m, FSDPModule)])

    # --- the step ------------------------------------------------------------------------

    def clip_grad_norm(self, parameters: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
        # Over DTensor gradients, the norm is reduced over every shard (the global norm).
        norm = torch.nn.utils.clip_grad_norm_(list(parameters), max_norm)
        return norm.full_tensor() if isinstance(norm, DTensor) else norm

    def grad_scaler(self) -> torch.amp.GradScaler:
        # Each rank sees only its shards: the inf/NaN check must be agreed by every rank,
        # or one would skip a step the others take.
        return ShardedGradScaler(self.device.type)

    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp = "mean") -> torch.Tensor:
        return all_reduce(tensor, op, self.ranks.size)

    # --- state ---------------------------------------------------------------------------

    def _owner(self, optimizer: torch.optim.Optimizer) -> nn.Module:
        # A unit that keeps its parameters gathered after forward (shard_grad_op) has its
        # unsharded tensors registered until it reshards: reshard (as reading its state
        # does) so that the model's parameters are the sharded ones the optimizer steps.
        for model in self.models:
            for module in model.modules():
                if isinstance(module, FSDPModule):
                    module.reshard()
        return super()._owner(optimizer)

    def model_state_dict(self, model: nn.Module) -> dict[str, Any]:
        return dict(get_model_state_dict(model, options=_FULL))

    def load_model_state_dict(self, model: nn.Module, state: dict[str, Any]) -> None:
        set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True))

    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        model = self._owner(optimizer)
        return dict(get_optimizer_state_dict(model, optimizer, options=_FULL))

    def load_optimizer_state_dict(
        self, optimizer: torch.optim.Optimizer, state: dict[str, Any]
    ) -> None:
        if state.get("state") and not isinstance(next(iter(state["state"])), str):
            state = indices_to_names(state, self._names(optimizer))
        elif state.get("param_groups") and not state.get("state"):
            groups = state["param_groups"]
            if groups and groups[0]["params"] and isinstance(groups[0]["params"][0], int):
                state = indices_to_names(state, self._names(optimizer))
        model = self._owner(optimizer)
        set_optimizer_state_dict(
            model, optimizer, state, options=StateDictOptions(full_state_dict=True)
        )

    def local_gradients(self, models: Iterable[nn.Module]) -> list[list[torch.Tensor | None]]:
        raise TrainingError(
            "under FSDP a checkpoint cannot be taken in the middle of a gradient "
            "accumulation (the unreduced gradients live inside FSDP's units): make "
            "min_checkpoint_period, the searcher's lengths and scheduling_unit multiples of "
            "optimizations.aggregation_frequency"
        )

    def restore_local_gradients(
        self, models: Iterable[nn.Module], gradients: list[list[torch.Tensor | None]]
    ) -> None:
        raise TrainingError(
            "this checkpoint was taken in the middle of a gradient accumulation, which "
            "strategy fsdp cannot continue: restore it with strategy ddp"
        )

    # --- options -------------------------------------------------------------------------

    def _reshard(self) -> bool:
        if self.config.reshard_after_forward is not None:
            return self.config.reshard_after_forward
        return self.config.sharding != "shard_grad_op"

    def _mixed_precision(self) -> MixedPrecisionPolicy:
        dtype = _DTYPES.get(self.precision)
        if dtype is None:
            return MixedPrecisionPolicy()
        # Gradients are reduced in fp32: a sum over ranks in 16 bits loses precision.
        return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)

    def _offload(self) -> OffloadPolicy:
        if not self.config.cpu_offload:
            return OffloadPolicy()
        return CPUOffloadPolicy(pin_memory=self.device.type == "cuda")


def _units(model: nn.Module, config: FSDPConfig) -> Iterator[nn.Module]:
    """The submodules sharded as units of their own, innermost first (never the root)."""
    if config.wrap:
        names = set(config.wrap)
        for module in _post_order(model):
            if module is not model and type(module).__name__ in names:
                yield module
        return
    if config.min_num_params is None:
        return
    claimed: set[int] = set()
    for module in _post_order(model):
        if module is model:
            continue
        free = [p for p in module.parameters() if id(p) not in claimed]
        if sum(p.numel() for p in free) >= config.min_num_params:
            claimed.update(id(p) for p in free)
            yield module


def _post_order(module: nn.Module) -> Iterator[nn.Module]:
    for child in module.children():
        yield from _post_order(child)
    yield module


@contextlib.contextmanager
def _no_gradient_sync(models: list[FSDPModule]) -> Iterator[None]:
    for model in models:
        model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        for model in models:
            model.set_requires_gradient_sync(True)
