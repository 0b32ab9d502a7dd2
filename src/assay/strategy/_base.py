"""The interface every way of distributing a model implements.

A strategy wraps the model (and re-points the optimizer where wrapping replaces the
parameters), suspends gradient synchronisation off accumulation boundaries, clips by the
global gradient norm, gives and loads full state dicts, and reduces tensors across ranks.
`TrialContext`, the trial controller and `setup` only delegate to it.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any, ClassVar, Literal, Protocol

import torch
from torch import nn

from assay.errors import TrainingError

ReduceOp = Literal["sum", "mean", "max", "min"]


class Ranks(Protocol):
    """Who this process is: the harness's and the Core API's distributed contexts both fit."""

    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def local_size(self) -> int: ...
    @property
    def cross_size(self) -> int: ...


class Strategy(ABC):
    """One way of distributing a model over the trial's processes (one per slot)."""

    name: ClassVar[str]
    # Whether every forward is a collective (FSDP gathers parameters in it): then every
    # rank must run as many forwards as the others, in validation too.
    forward_is_collective: ClassVar[bool] = False
    # Whether `local_gradients` can save a partial accumulation for a checkpoint.
    saves_partial_gradients: ClassVar[bool] = True
    # Whether a Trial's checkpoint holds the models and optimizers as every rank's shards
    # (`assay.strategy._sharded`) rather than full state dicts gathered on rank 0.
    shards_checkpoints: ClassVar[bool] = False

    def __init__(self, ranks: Ranks, device: torch.device) -> None:
        self.ranks = ranks
        self.device = device
        self.models: list[nn.Module] = []

    # --- wrapping ------------------------------------------------------------------------

    @abstractmethod
    def wrap_model(self, model: nn.Module) -> nn.Module:
        """Place `model` on this slot's device and wrap it; returns what to train."""

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Make `optimizer` step the wrapped model's parameters (by default they are)."""
        return optimizer

    def unwrap(self, model: nn.Module) -> nn.Module:
        """The user's module inside a wrapper (its state dict has the user's key names)."""
        return model

    def no_sync(self) -> contextlib.AbstractContextManager[Any]:
        """A context in which backward leaves gradients local (off accumulation boundaries)."""
        return contextlib.nullcontext()

    # --- the step ------------------------------------------------------------------------

    def clip_grad_norm(self, parameters: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
        """Scale gradients so that their norm over every parameter of every rank is at most
        `max_norm`; returns that norm before clipping (a plain tensor)."""
        return torch.nn.utils.clip_grad_norm_(list(parameters), max_norm)

    def grad_scaler(self) -> torch.amp.GradScaler | None:
        """An fp16 loss scaler for this strategy's gradients, if the plain
        `torch.amp.GradScaler` does not fit them (None: it does)."""
        return None

    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp = "mean") -> torch.Tensor:
        """`tensor` reduced over every rank (a new tensor; the input is left as it was)."""
        return tensor.clone()

    # --- state ---------------------------------------------------------------------------

    def model_state_dict(self, model: nn.Module) -> dict[str, Any]:
        """The full (unsharded) state dict of `model`, keyed as the user's module names it.
        A collective under sharding strategies: every rank calls it; rank 0 gets it whole."""
        return dict(self.unwrap(model).state_dict())

    def load_model_state_dict(self, model: nn.Module, state: dict[str, Any]) -> None:
        """Load a full state dict (as `model_state_dict` gives) into `model` on every rank."""
        self.unwrap(model).load_state_dict(state)

    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The optimizer's full state dict (a collective under sharding strategies)."""
        return dict(optimizer.state_dict())

    def load_optimizer_state_dict(
        self, optimizer: torch.optim.Optimizer, state: dict[str, Any]
    ) -> None:
        """Load a full optimizer state dict; one keyed by parameter names (as a sharded
        strategy writes it) or by parameter index (as `optimizer.state_dict()`) both fit."""
        if _keyed_by_name(state):
            state = _names_to_indices(state, self._names(optimizer))
        optimizer.load_state_dict(state)

    def local_gradients(self, models: Iterable[nn.Module]) -> list[list[torch.Tensor | None]]:
        """This rank's gradients in the middle of an accumulation, to checkpoint them."""
        return [
            [None if p.grad is None else p.grad.detach().cpu() for p in self.unwrap(m).parameters()]
            for m in models
        ]

    def restore_local_gradients(
        self, models: Iterable[nn.Module], gradients: list[list[torch.Tensor | None]]
    ) -> None:
        """Put back what `local_gradients` saved (the same world size)."""
        for model, grads in zip(models, gradients, strict=True):
            for param, grad in zip(self.unwrap(model).parameters(), grads, strict=True):
                param.grad = None if grad is None else grad.to(param.device)

    # --- helpers -------------------------------------------------------------------------

    def _owner(self, optimizer: torch.optim.Optimizer) -> nn.Module:
        """The wrapped model whose parameters `optimizer` steps."""
        params = {id(p) for group in optimizer.param_groups for p in group["params"]}
        for model in self.models:
            if params <= {id(p) for p in model.parameters()}:
                return model
        raise TrainingError(
            "an optimizer's parameters must all belong to one model wrapped with wrap_model "
            "(build it from model.parameters() after wrapping)"
        )

    def _names(self, optimizer: torch.optim.Optimizer) -> list[str]:
        """The user's parameter names, in the optimizer's order."""
        names = {id(p): n for n, p in self.unwrap(self._owner(optimizer)).named_parameters()}
        return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def _keyed_by_name(state: dict[str, Any]) -> bool:
    groups = state.get("param_groups", [])
    return any(isinstance(p, str) for group in groups for p in group.get("params", []))


def _names_to_indices(state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """A name-keyed optimizer state dict in `optimizer.state_dict()`'s index form."""
    index = {name: i for i, name in enumerate(names)}
    missing = [p for g in state["param_groups"] for p in g["params"] if p not in index]
    if missing:
        raise TrainingError(f"the optimizer state names parameters the model lacks: {missing}")
    return {
        "state": {index[name]: value for name, value in state.get("state", {}).items()},
        "param_groups": [
            {**group, "params": [index[p] for p in group["params"]]}
            for group in state["param_groups"]
        ],
    }


def indices_to_names(state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """An index-keyed optimizer state dict (`optimizer.state_dict()`) keyed by `names`."""
    try:
        return {
            "state": {names[i]: value for i, value in state.get("state", {}).items()},
            "param_groups": [
                {**group, "params": [names[i] for i in group["params"]]}
                for group in state["param_groups"]
            ],
        }
    except IndexError:
        raise TrainingError(
            f"the optimizer state holds more parameters than the model's {len(names)}"
        ) from None
