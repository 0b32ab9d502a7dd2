"""Activation checkpointing against the same model without it: equal gradients, fewer bytes
kept for backward; under DDP and FSDP2 on two gloo ranks; the config key and its errors."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from assay._activation_checkpointing import apply_activation_checkpointing
from assay._ranks import release_groups_at_exit
from assay.config import parse_config
from assay.errors import InvalidConfigError

TOL = 1e-6
WIDTH = 64
DEPTH = 12


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.down(torch.nn.functional.gelu(self.up(x)))
        return out


class DeepMLP(nn.Module):
    def __init__(self, width: int = WIDTH, depth: int = DEPTH) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        out: torch.Tensor = self.head(x)
        return out


def batch(seed: int = 0, rows: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, WIDTH, generator=g), torch.randn(rows, 1, generator=g)


def gradients(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()  # type: ignore[no-untyped-call]
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def saved_bytes(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> int:
    """Bytes of the tensors autograd keeps from the forward pass for backward."""
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()  # type: ignore[no-untyped-call]
    return total


def test_gradients_equal_and_saved_memory_falls() -> None:
    torch.manual_seed(0)
    plain = DeepMLP()
    checkpointed = copy.deepcopy(plain)
    assert apply_activation_checkpointing(checkpointed, ["Block"]) == DEPTH
    x, y = batch()
    assert max_diff(gradients(plain, x, y), gradients(checkpointed, x, y)) <= TOL
    before, after = saved_bytes(plain, x, y), saved_bytes(checkpointed, x, y)
    # Only each block's input (and the head's) is kept: about a fifth of the activations.
    assert after < 0.3 * before, (before, after)


def test_the_model_keeps_its_classes_keys_and_deepcopies() -> None:
    model = DeepMLP(depth=2)
    keys = list(model.state_dict())
    apply_activation_checkpointing(model, ["Block"])
    assert type(model.blocks[0]) is Block
    assert list(model.state_dict()) == keys
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for p in twin.parameters():
            p.zero_()
    x, _ = batch()
    # The copy's forward runs the copy's weights, not the original's.
    assert float(twin(x).detach().abs().max()) == 0.0
    assert float(model(x).detach().abs().max()) > 0.0
    # Patching again changes nothing; evaluation under no_grad runs the plain forward.
    assert apply_activation_checkpointing(model, ["Block"]) == 0
    with torch.no_grad():
        assert model(x).shape == (32, 1)


def test_a_class_that_is_not_there_names_the_models_classes() -> None:
    with pytest.raises(InvalidConfigError) as e:
        apply_activation_checkpointing(DeepMLP(depth=1), ["Block", "TransformerBlock"])
    message = str(e.value)
    assert "optimizations.activation_checkpointing: TransformerBlock is not" in message
    assert "Block, DeepMLP, Linear, ModuleList" in message


def test_config_key() -> None:
    base = {
        "name": "x",
        "entrypoint": "m:T",
        "hyperparameters": {"global_batch_size": 8},
        "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 1}},
    }
    config = parse_config({**base, "optimizations": {"activation_checkpointing": ["Block"]}})
    assert config.optimizations.activation_checkpointing == ("Block",)
    assert parse_config(base).optimizations.activation_checkpointing == ()
    for bad, says in [("Block", "expected a list of strings"), (["a.b"], "not a Python class")]:
        with pytest.raises(InvalidConfigError, match=says):
            parse_config({**base, "optimizations": {"activation_checkpointing": bad}})


# --- two gloo ranks: DDP and FSDP2 ------------------------------------------------------


def _rank(rank: int, init_file: str, strategy: str, out: str) -> None:
    torch.distributed.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=2
    )
    release_groups_at_exit()  # as `assay.core` does for a script's ranks
    try:
        grads = {}
        for checkpointed in (False, True):
            torch.manual_seed(0)
            model = DeepMLP(depth=4)
            if checkpointed:
                apply_activation_checkpointing(model, ["Block"])
            wrapped: nn.Module
            if strategy == "ddp":
                wrapped = nn.parallel.DistributedDataParallel(model)
            else:
                from torch.distributed.fsdp import fully_shard

                for block in model.blocks:
                    fully_shard(block)
                wrapped = fully_shard(model)  # type: ignore[assignment]
            x, y = batch(seed=rank)
            got = gradients(wrapped, x, y)
            grads[checkpointed] = {k: _full(v) for k, v in got.items()}
        torch.save(max_diff(grads[False], grads[True]), f"{out}.{rank}")
    finally:
        torch.distributed.destroy_process_group()


def _full(t: torch.Tensor) -> torch.Tensor:
    full = getattr(t, "full_tensor", None)  # an FSDP2 gradient is a sharded DTensor
    result: torch.Tensor = full() if full is not None else t
    return result


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_under_two_ranks_gradients_are_unchanged(tmp_path: Path, strategy: str) -> None:
    out = str(tmp_path / strategy)
    args = (str(tmp_path / "init"), strategy, out)
    mp.spawn(_rank, args=args, nprocs=2)  # type: ignore[attr-defined,no-untyped-call]
    assert max(float(torch.load(f"{out}.{r}")) for r in range(2)) <= TOL
