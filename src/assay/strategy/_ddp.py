"""DistributedDataParallel: every rank holds the whole model; gradients are all-reduced."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from assay.strategy._base import ReduceOp, Strategy

_OPS = {"sum": "SUM", "mean": "SUM", "max": "MAX", "min": "MIN"}


class DDPStrategy(Strategy):
    """Replicated models; `no_sync` skips the all-reduce off accumulation boundaries."""

    name = "ddp"

    def wrap_model(self, model: nn.Module) -> nn.Module:
        model = model.to(self.device)
        ids = [self.device.index] if self.device.type == "cuda" else None
        wrapped = DistributedDataParallel(model, device_ids=ids)
        self.models.append(wrapped)
        return wrapped

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model.module if isinstance(model, DistributedDataParallel) else model

    def no_sync(self) -> contextlib.AbstractContextManager[Any]:
        stack = contextlib.ExitStack()
        for model in self.models:
            if isinstance(model, DistributedDataParallel):
                stack.enter_context(model.no_sync())
        return stack

    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp = "mean") -> torch.Tensor:
        return all_reduce(tensor, op, self.ranks.size)


def all_reduce(tensor: torch.Tensor, op: ReduceOp, size: int) -> torch.Tensor:
    """`tensor` reduced over the default process group (a copy)."""
    out = tensor.detach().clone()
    dist.all_reduce(out, op=getattr(dist.ReduceOp, _OPS[op]))
    if op == "mean":
        out = out / size
    return out
