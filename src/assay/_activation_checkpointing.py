"""Activation checkpointing: `optimizations.activation_checkpointing: [ModuleClass, ...]`.

Every submodule whose class is named there keeps no activations from its forward pass;
backward runs that forward again to rebuild them (`torch.utils.checkpoint`, non-reentrant).
Memory for activations falls to about one block's worth plus the blocks' inputs, for the
cost of a second forward through those blocks.

The module is patched in place (its instance's `forward`), not wrapped in another module:
its class, its attributes and its `state_dict` keys stay what the Trial defined, so
checkpoints load with or without the option, and a strategy that wraps the model
afterwards (DDP, FSDP's `fully_shard` on the same classes) sees the modules it expects.
"""

from __future__ import annotations

import types
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from assay.errors import InvalidConfigError

_MARK = "_assay_checkpointed_forward"


def apply_activation_checkpointing(model: nn.Module, class_names: Sequence[str]) -> int:
    """Checkpoint the activations of every submodule of `model` whose class name is in
    `class_names`; return how many were patched (0 when `class_names` is empty).

    A name that matches no module of `model` is an error naming the classes it has, so a
    typo does not silently train without the memory saving. Patching twice is harmless.
    """
    if not class_names:
        return 0
    present = {type(m).__name__ for m in model.modules()}
    missing = [name for name in class_names if name not in present]
    if missing:
        raise InvalidConfigError(
            [
                f"optimizations.activation_checkpointing: {', '.join(missing)} "
                f"{'is' if len(missing) == 1 else 'are'} not a module class of "
                f"{type(model).__name__}; its module classes are {', '.join(sorted(present))}"
            ]
        )
    wanted = set(class_names)
    patched = 0
    for module in model.modules():
        if type(module).__name__ in wanted and not getattr(module, _MARK, False):
            # A method bound to the module itself: `copy.deepcopy` rebinds it to the copy.
            module.forward = types.MethodType(_checkpointed_forward, module)
            setattr(module, _MARK, True)
            patched += 1
    return patched


def _checkpointed_forward(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    forward = type(module).forward.__get__(module)
    if not torch.is_grad_enabled():  # evaluation: nothing would be saved anyway
        return forward(*args, **kwargs)
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


__all__ = ["apply_activation_checkpointing"]
