"""FSDP (FSDP2 over gloo, real processes) against the single-process PyTorch loop.

Each test trains the regression fixture through `assay.run_local` with
`optimizations.strategy: fsdp` and compares the final weights with a hand-written loop:
2 ranks of batch b equal one process of batch 2b; accumulation of k equals a batch k
times larger; clipping uses the global norm over every rank's shards. fp32 on CPU.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import assay
from tests.conftest import REGRESSION_DIR, regression_config

sys.path.insert(0, str(REGRESSION_DIR))
from model_def import make_data, make_model, make_optimizer, reference_train

TOL = 1e-5


def fsdp_run(
    tmp_path: Path,
    *,
    fsdp: dict[str, Any] | None = None,
    strategy: str = "fsdp",
    resume_from: str | None = None,
    **kwargs: Any,
) -> assay.LocalResult:
    config = regression_config(**kwargs)
    config["optimizations"]["strategy"] = strategy
    if fsdp is not None:
        config["optimizations"]["fsdp"] = fsdp
    return assay.run_local(
        config=config,
        model_dir=REGRESSION_DIR,
        checkpoint_dir=tmp_path / "ckpt",
        resume_from=resume_from,
    )


def weights(result: assay.LocalResult) -> dict[str, torch.Tensor]:
    """The model's full weights in the run's last checkpoint (gathered from its shards
    when it is sharded, as an FSDP run on several slots writes it)."""
    assert result.checkpoint is not None
    return dict(assay.load_checkpoint(result.checkpoint).models[0])


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def clipped_reference(*, batch_size: int, batches: int, clip: float) -> dict[str, torch.Tensor]:
    """`reference_train` with every step's gradients clipped to a global norm of `clip`."""
    torch.manual_seed(3)
    model = make_model(0.0)
    optimizer = make_optimizer(model, 0.05)
    loader = DataLoader(make_data(256, seed=1), batch_size=batch_size, shuffle=False)
    done = 0
    while done < batches:
        for x, y in loader:
            nn.functional.mse_loss(model(x), y).backward()  # type: ignore[no-untyped-call]
            torch.nn.utils.clip_grad_norm_(list(model.parameters()), clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            done += 1
            if done == batches:
                break
    return dict(model.state_dict())


@pytest.mark.slow
def test_two_ranks_of_b_equal_one_process_of_2b(tmp_path: Path) -> None:
    result = fsdp_run(
        tmp_path, fsdp={"wrap": ["Linear"]}, batches=20, global_batch_size=16, slots=2
    )
    expected = reference_train(seed=3, lr=0.05, batch_size=16, batches=20).state_dict()
    assert result.total_batches == 20
    assert max_abs_diff(weights(result), expected) <= TOL


@pytest.mark.slow
def test_accumulation_of_k_equals_a_batch_k_times_larger(tmp_path: Path) -> None:
    # shard_grad_op: parameters stay gathered from forward to backward.
    result = fsdp_run(
        tmp_path,
        fsdp={"sharding": "shard_grad_op"},
        batches=40,
        global_batch_size=4,
        slots=2,
        aggregation=4,
    )
    expected = reference_train(seed=3, lr=0.05, batch_size=16, batches=10).state_dict()
    assert max_abs_diff(weights(result), expected) <= TOL


@pytest.mark.slow
def test_clipping_uses_the_global_norm_of_the_sharded_gradients(tmp_path: Path) -> None:
    result = fsdp_run(
        tmp_path,
        fsdp={"min_num_params": 100},
        batches=20,
        global_batch_size=16,
        slots=2,
        clip=0.05,
    )
    expected = clipped_reference(batch_size=16, batches=20, clip=0.05)
    unclipped = reference_train(seed=3, lr=0.05, batch_size=16, batches=20).state_dict()
    assert max_abs_diff(expected, unclipped) > 1e-2  # the clip engages
    assert max_abs_diff(weights(result), expected) <= TOL


@pytest.mark.slow
def test_hybrid_shard_trains_the_same_model(tmp_path: Path) -> None:
    # A 2-D mesh (replicate x shard): here 1 machine x 2 slots.
    fsdp = {"sharding": "hybrid_shard", "wrap": ["Linear"]}
    result = fsdp_run(tmp_path, fsdp=fsdp, batches=8, global_batch_size=16, slots=2)
    expected = reference_train(seed=3, lr=0.05, batch_size=16, batches=8).state_dict()
    assert max_abs_diff(weights(result), expected) <= TOL


def test_one_slot_needs_no_wrapper(tmp_path: Path) -> None:
    result = fsdp_run(tmp_path, fsdp={"wrap": ["Linear"]}, batches=6, global_batch_size=16)
    expected = reference_train(seed=3, lr=0.05, batch_size=16, batches=6).state_dict()
    assert max_abs_diff(weights(result), expected) <= 1e-6


@pytest.mark.slow
def test_an_fsdp_checkpoint_continues_on_one_slot_and_under_ddp(tmp_path: Path) -> None:
    # SGD with momentum: the optimizer's state must come back too.
    first = fsdp_run(tmp_path / "a", batches=10, global_batch_size=16, slots=2)
    assert first.checkpoint is not None
    expected = reference_train(seed=3, lr=0.05, batch_size=16, batches=20).state_dict()
    one = fsdp_run(tmp_path / "b", batches=20, global_batch_size=16, resume_from=first.checkpoint)
    assert one.total_batches == 20
    assert max_abs_diff(weights(one), expected) <= TOL
    ddp = fsdp_run(
        tmp_path / "c",
        strategy="ddp",
        batches=20,
        global_batch_size=16,
        slots=2,
        resume_from=first.checkpoint,
    )
    assert max_abs_diff(weights(ddp), expected) <= TOL


@pytest.mark.slow
def test_a_ddp_checkpoint_continues_under_fsdp(tmp_path: Path) -> None:
    first = fsdp_run(tmp_path / "a", strategy="ddp", batches=10, global_batch_size=16, slots=2)
    assert first.checkpoint is not None
    resumed = fsdp_run(
        tmp_path / "b", batches=20, global_batch_size=16, slots=2, resume_from=first.checkpoint
    )
    expected = reference_train(seed=3, lr=0.05, batch_size=16, batches=20).state_dict()
    assert max_abs_diff(weights(resumed), expected) <= TOL


@pytest.mark.slow
def test_fp16_skips_a_step_with_inf_gradients_on_every_rank(tmp_path: Path) -> None:
    # Each rank sees inf in its own gradient shards only; ShardedGradScaler's check is
    # agreed across ranks, so both skip the step and the weights stay as initialised.
    result = fsdp_run(
        tmp_path, batches=1, global_batch_size=16, slots=2, precision="fp16", plant_inf_at=0
    )
    torch.manual_seed(3)
    initial = make_model(0.0).state_dict()
    assert max_abs_diff(weights(result), initial) == 0.0
    assert result.checkpoint is not None
    precision = torch.load(Path(result.checkpoint) / "precision.pt", weights_only=True)
    assert float(precision["scaler"]["scale"]) == 2.0**15


@pytest.mark.slow
def test_bf16_with_cpu_offload_trains_close_to_fp32(tmp_path: Path) -> None:
    result = fsdp_run(
        tmp_path,
        fsdp={"wrap": ["Linear"], "cpu_offload": True},
        batches=8,
        global_batch_size=16,
        slots=2,
        precision="bf16",
    )
    expected = reference_train(seed=3, lr=0.05, batch_size=16, batches=8).state_dict()
    got = weights(result)
    assert all(v.dtype == torch.float32 for v in got.values())  # the sharded masters stay fp32
    assert max_abs_diff(got, expected) <= 5e-2
