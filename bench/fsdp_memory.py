"""Per-rank model-state memory under FSDP2 against DDP, two gloo ranks on CPU.

The same stack of residual MLP blocks (width W, 4W hidden) is trained for a few steps with
Adam on 2 processes: (a) wrapped in `DistributedDataParallel`, every rank holding the whole
model, its gradients and Adam's two moments; (b) with `torch.distributed.fsdp.fully_shard`
on every block and on the root (FSDP2, full sharding), as `optimizations.strategy: fsdp`
does. After the last step each rank counts the bytes of what it holds for training: its
parameters, their gradients and the optimizer's state (a sharded tensor counts its local
shard only). Activations are not counted: they are the same under both, and activation
checkpointing, not sharding, is what reduces them.

Rounds are interleaved A/B (the order flips every round); a round's ratio is FSDP's
largest per-rank byte count over DDP's, and the headline `ratio` is the median over rounds
(the counts are deterministic, so every round agrees; the step times are reported beside
them). Target: <= 0.6 (two ranks halve the sharded state; the rest is what stays whole).

Correctness guard: after the steps, FSDP's gathered weights equal DDP's (<= 1e-5).

    python bench/fsdp_memory.py [--quick] [--rounds N] [--steps N]

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp
from torch import nn

TARGET = 0.6
WEIGHT_TOLERANCE = 1e-5
WORLD = 2
SEED = 0
BATCH = 16


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.down(torch.relu(self.up(self.norm(x))))
        return out


class Stack(nn.Module):
    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        out: torch.Tensor = self.head(x)
        return out


def local_bytes(t: torch.Tensor) -> int:
    """Bytes this rank holds for `t`: a DTensor's local shard, else the whole tensor."""
    local = t.to_local() if hasattr(t, "to_local") else t
    return int(local.numel() * local.element_size())


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    params = sum(local_bytes(p) for p in model.parameters())
    grads = sum(local_bytes(p.grad) for p in model.parameters() if p.grad is not None)
    moments = sum(
        local_bytes(v)
        for state in optimizer.state.values()
        for v in state.values()
        if isinstance(v, torch.Tensor) and v.dim() > 0  # Adam's step counter is a scalar
    )
    return {"params": params, "grads": grads, "optimizer": moments}


def full_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    out = {}
    for name, p in model.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        out[name.removeprefix("module.")] = full.detach().clone()
    return out


def train(kind: str, rank: int, width: int, depth: int, steps: int) -> dict[str, Any]:
    torch.manual_seed(SEED)
    model = Stack(width, depth)
    wrapped: nn.Module
    if kind == "ddp":
        wrapped = nn.parallel.DistributedDataParallel(model)
    else:
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        wrapped = model
    optimizer = torch.optim.Adam(wrapped.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(SEED + rank)
    times = []
    for _ in range(steps):
        x, y = torch.randn(BATCH, width, generator=g), torch.randn(BATCH, 1, generator=g)
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=False)
        torch.nn.functional.mse_loss(wrapped(x), y).backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        times.append(time.perf_counter() - started)
    return {
        "bytes": state_bytes(wrapped, optimizer),
        "step_s": statistics.median(times[1:] or times),
        "weights": full_weights(wrapped),
    }


def worker(rank: int, init: str, out: str, width: int, depth: int, steps: int, rounds: int) -> None:
    torch.set_num_threads(1)
    torch.distributed.init_process_group(
        "gloo", init_method=f"file://{init}", rank=rank, world_size=WORLD
    )
    try:
        results: list[dict[str, Any]] = []
        max_diff = 0.0
        for r in range(rounds):
            order = ["ddp", "fsdp"] if r % 2 == 0 else ["fsdp", "ddp"]
            got = {kind: train(kind, rank, width, depth, steps) for kind in order}
            if r == 0:
                a, b = got["ddp"]["weights"], got["fsdp"]["weights"]
                max_diff = max(float((a[k] - b[k]).abs().max()) for k in a)
            results.append(
                {k: {"bytes": v["bytes"], "step_s": v["step_s"]} for k, v in got.items()}
            )
        torch.save({"rounds": results, "max_diff": max_diff}, f"{out}.{rank}")
    finally:
        torch.distributed.destroy_process_group()


def mb(n: float) -> float:
    return round(n / 2**20, 2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small model, few rounds (< 1 min)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved A/B rounds")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per run")
    args = parser.parse_args(argv)
    rounds: int = args.rounds or (2 if args.quick else 5)
    steps: int = args.steps or (2 if args.quick else 6)
    width, depth = (256, 4) if args.quick else (512, 8)
    if rounds < 1 or steps < 1:
        parser.error("--rounds and --steps must be positive")
    started = time.perf_counter()
    params = sum(p.numel() for p in Stack(width, depth).parameters())
    print(
        f"fsdp_memory: {depth} blocks of width {width} ({params / 1e6:.1f}M parameters), Adam, "
        f"{WORLD} gloo ranks, torch {torch.__version__}; {rounds} rounds x {steps} steps"
    )
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "result")
        mp.spawn(  # type: ignore[attr-defined,no-untyped-call]
            worker,
            args=(str(Path(tmp) / "init"), out, width, depth, steps, rounds),
            nprocs=WORLD,
        )
        per_rank = [torch.load(f"{out}.{r}") for r in range(WORLD)]

    ratios: list[float] = []
    step_ratio: list[float] = []
    totals: dict[str, list[int]] = {"ddp": [], "fsdp": []}
    for r in range(rounds):
        worst = {
            kind: max(sum(p["rounds"][r][kind]["bytes"].values()) for p in per_rank)
            for kind in ("ddp", "fsdp")
        }
        slowest = {
            kind: max(p["rounds"][r][kind]["step_s"] for p in per_rank) for kind in ("ddp", "fsdp")
        }
        ratios.append(worst["fsdp"] / worst["ddp"])
        step_ratio.append(slowest["fsdp"] / slowest["ddp"])
        for kind in ("ddp", "fsdp"):
            totals[kind].append(worst[kind])
        print(
            f"round {r + 1}/{rounds}: per rank DDP {mb(worst['ddp'])} MB, FSDP "
            f"{mb(worst['fsdp'])} MB ({ratios[-1]:.3f}); step DDP "
            f"{slowest['ddp'] * 1e3:.1f} ms, FSDP {slowest['fsdp'] * 1e3:.1f} ms"
        )
    breakdown = {
        kind: {
            part: mb(per_rank[0]["rounds"][0][kind]["bytes"][part])
            for part in ("params", "grads", "optimizer")
        }
        for kind in ("ddp", "fsdp")
    }
    max_diff = max(float(p["max_diff"]) for p in per_rank)
    weights_ok = max_diff <= WEIGHT_TOLERANCE
    ratio = statistics.median(ratios)
    wall = time.perf_counter() - started
    print(
        f"rank 0, MB (params / grads / optimizer): DDP {breakdown['ddp']}, FSDP {breakdown['fsdp']}"
    )
    print(
        f"weights after {steps} steps, max |DDP - FSDP|: {max_diff:.3g} "
        f"({'ok' if weights_ok else 'MISMATCH'}, tolerance {WEIGHT_TOLERANCE:g})"
    )
    verdict = "meets" if ratio <= TARGET else "MISSES"
    print(f"ratio {ratio:.3f} {verdict} the target {TARGET}; wall {wall:.1f} s")
    result: dict[str, Any] = {
        "benchmark": "fsdp_memory",
        "ratio": round(ratio, 4),
        "target": TARGET,
        "passed": ratio <= TARGET and weights_ok,
        "round_ratios": [round(x, 4) for x in ratios],
        "ddp_mb_per_rank": mb(statistics.median(totals["ddp"])),
        "fsdp_mb_per_rank": mb(statistics.median(totals["fsdp"])),
        "breakdown_mb_rank0": breakdown,
        "step_time_ratio_fsdp_over_ddp": round(statistics.median(step_ratio), 3),
        "parameters": params,
        "width": width,
        "depth": depth,
        "ranks": WORLD,
        "rounds": rounds,
        "steps": steps,
        "weights_max_abs_diff": max_diff,
        "weights_ok": weights_ok,
        "quick": bool(args.quick),
        "wall_s": round(wall, 1),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
