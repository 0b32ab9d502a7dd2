"""One short run on a GPU machine: precision, FSDP against DDP, harness overhead, NVML.

    python bench/gpu.py            # on a machine with NVIDIA GPUs (under 5 minutes)
    python bench/gpu.py --cpu      # its CPU parts only (what CI runs, with --quick)

Parts, each printed as it finishes:
1. precision: a ~100M-parameter transformer (12 layers, width 768, vocabulary 32,768)
   trains a few steps under fp32, bf16 autocast and fp16 autocast with a GradScaler;
   tokens per second of each, and bf16 over fp32 (target >= 2x on a GPU with tensor cores).
   With --cpu a small transformer runs fp32 and bf16 only (fp16 autocast is a GPU feature).
2. fsdp_vs_ddp: the same stack of blocks under DDP and under FSDP2 (`fully_shard`) on every
   GPU present (NCCL, one process per GPU) or on 2 gloo ranks with --cpu: per-rank bytes of
   parameters, gradients and Adam state, peak allocated memory, and step time.
3. harness_overhead: bench/harness_overhead.py's interleaved A/B comparison of the harness
   against a plain loop (target <= 1.01 here).
4. nvml: the devices the agent would offer, from the agent's own detection code.

Imports are torch, assay and (for part 4, when installed) pynvml only, so that it runs on a
bare machine with PyTorch's CUDA build and `pip install --no-deps -e .` of this repository
plus the few dependencies the harness needs. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fsdp_memory

BF16_TARGET = 2.0
OVERHEAD_TARGET = 1.01


# --- 1. precision ------------------------------------------------------------------------


class Transformer(nn.Module):
    def __init__(self, vocab: int, width: int, layers: int, heads: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        layer = nn.TransformerEncoderLayer(
            width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True
        )
        self.layers = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied, as GPT-2 does

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1], tokens.device)
        out: torch.Tensor = self.head(self.layers(self.embed(tokens), mask=mask, is_causal=True))
        return out


def precision_part(device: torch.device, quick: bool) -> dict[str, Any]:
    if device.type == "cuda":
        vocab, width, layers, heads, batch, seq = 32768, 768, 12, 12, 16, 512
        modes = ["fp32", "bf16", "fp16"]
        steps = 6 if quick else 15
    else:
        vocab, width, layers, heads, batch, seq = 1024, 128, 2, 4, 8, 64
        modes = ["fp32", "bf16"]
        steps = 3 if quick else 8
    torch.manual_seed(0)
    params = sum(p.numel() for p in Transformer(vocab, width, layers, heads).parameters())
    out: dict[str, Any] = {"parameters": params, "tokens_per_step": batch * seq}
    for mode in modes:
        torch.manual_seed(0)
        model = Transformer(vocab, width, layers, heads).to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
        scaler = torch.amp.GradScaler(device.type, enabled=mode == "fp16")
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mode)
        tokens = torch.randint(0, vocab, (batch, seq + 1), device=device)
        times = []
        for _ in range(steps):
            started = time.perf_counter()
            autocast = (
                torch.autocast(device.type, dtype=dtype)
                if dtype is not None
                else contextlib.nullcontext()
            )
            with autocast:
                logits = model(tokens[:, :-1])
                loss = nn.functional.cross_entropy(
                    logits.float().reshape(-1, vocab), tokens[:, 1:].reshape(-1)
                )
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()  # type: ignore[no-untyped-call]
            scaler.step(optimizer)
            scaler.update()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - started)
        step = statistics.median(times[2:] if len(times) > 3 else times)
        out[f"{mode}_tokens_per_s"] = round(batch * seq / step, 1)
        out[f"{mode}_step_ms"] = round(step * 1e3, 2)
        print(f"precision {mode}: {step * 1e3:.1f} ms/step, {batch * seq / step:,.0f} tokens/s")
        del model, optimizer
        if device.type == "cuda":
            torch.cuda.empty_cache()
    out["bf16_over_fp32"] = round(out["bf16_tokens_per_s"] / out["fp32_tokens_per_s"], 3)
    if "fp16_tokens_per_s" in out:
        out["fp16_over_fp32"] = round(out["fp16_tokens_per_s"] / out["fp32_tokens_per_s"], 3)
    return out


# --- 2. FSDP against DDP -----------------------------------------------------------------


def _rank(rank: int, world: int, init: str, out: str, cuda: bool, quick: bool) -> None:
    if cuda:
        torch.cuda.set_device(rank)
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    torch.distributed.init_process_group(
        "nccl" if cuda else "gloo", init_method=f"file://{init}", rank=rank, world_size=world
    )
    width, depth = ((2048, 8) if not quick else (1024, 4)) if cuda else (256, 2)
    results: dict[str, Any] = {}
    try:
        for kind in ("ddp", "fsdp"):
            torch.manual_seed(0)
            model = fsdp_memory.Stack(width, depth).to(device)
            if cuda:
                torch.cuda.reset_peak_memory_stats(device)
            wrapped: nn.Module
            if kind == "ddp":
                ids = [rank] if cuda else None
                wrapped = nn.parallel.DistributedDataParallel(model, device_ids=ids)
            else:
                from torch.distributed.fsdp import fully_shard

                for block in model.blocks:
                    fully_shard(block)
                fully_shard(model)
                wrapped = model
            optimizer = torch.optim.Adam(wrapped.parameters(), lr=1e-3)
            times = []
            for _ in range(3 if quick else 8):
                x = torch.randn(32, width, device=device)
                started = time.perf_counter()
                optimizer.zero_grad(set_to_none=False)
                wrapped(x).square().mean().backward()
                optimizer.step()
                if cuda:
                    torch.cuda.synchronize(device)
                times.append(time.perf_counter() - started)
            held = fsdp_memory.state_bytes(wrapped, optimizer)
            results[kind] = {
                "state_mb": round(sum(held.values()) / 2**20, 2),
                "peak_allocated_mb": (
                    round(torch.cuda.max_memory_allocated(device) / 2**20, 2) if cuda else None
                ),
                "step_ms": round(statistics.median(times[1:]) * 1e3, 2),
            }
            del wrapped, model, optimizer
        torch.save(results, f"{out}.{rank}")
    finally:
        torch.distributed.destroy_process_group()


def fsdp_part(cuda: bool, quick: bool) -> dict[str, Any]:
    world = torch.cuda.device_count() if cuda else 2
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "rank")
        mp.spawn(  # type: ignore[attr-defined,no-untyped-call]
            _rank, args=(world, str(Path(tmp) / "init"), out, cuda, quick), nprocs=world
        )
        ranks = [torch.load(f"{out}.{r}") for r in range(world)]
    worst = {kind: max(r[kind]["state_mb"] for r in ranks) for kind in ("ddp", "fsdp")}
    result = {
        "ranks": world,
        "backend": "nccl" if cuda else "gloo",
        "per_rank": ranks,
        "state_ratio_fsdp_over_ddp": round(worst["fsdp"] / worst["ddp"], 3),
    }
    print(
        f"fsdp_vs_ddp on {world} {'GPU' if cuda else 'gloo rank'}(s): state per rank DDP "
        f"{worst['ddp']} MB, FSDP {worst['fsdp']} MB; step DDP {ranks[0]['ddp']['step_ms']} ms, "
        f"FSDP {ranks[0]['fsdp']['step_ms']} ms"
    )
    return result


# --- 3. harness overhead -----------------------------------------------------------------


def overhead_part(quick: bool) -> dict[str, Any]:
    """bench/harness_overhead.py in a process of its own that sees no GPU: it compares
    both sides on one CPU thread, and the harness would otherwise pick the GPU."""
    argv = ["--quick", "--rounds", "2", "--batches", "32"] if quick else ["--rounds", "6"]
    script = Path(__file__).resolve().parent / "harness_overhead.py"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [sys.executable, str(script), *argv], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"harness_overhead.py failed:\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    ratio = float(result["ratio"])
    print(f"harness_overhead: ratio {ratio:.4f} (target {OVERHEAD_TARGET})")
    return {
        "ratio": ratio,
        "target": OVERHEAD_TARGET,
        "passed": ratio <= OVERHEAD_TARGET,
        "weights_ok": result["weights_ok"],
        "plain_median_ms_agg1": result["plain_median_ms_agg1"],
        "harness_median_ms_agg1": result["harness_median_ms_agg1"],
    }


# --- 4. NVML as the agent sees it --------------------------------------------------------


def nvml_part() -> dict[str, Any]:
    from assay.agent._devices import detect_devices

    monitor = detect_devices()
    try:
        devices = [
            {
                "index": d.index,
                "kind": d.kind,
                "name": d.name,
                "memory_gb": round(d.memory_bytes / 2**30, 1),
            }
            for d in monitor.devices
        ]
    finally:
        monitor.close()
    print(f"nvml: the agent offers {len(devices)} {monitor.kind} slot(s): {devices[0]['name']}")
    return {"slot_type": monitor.kind, "devices": devices}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--cpu", action="store_true", help="run the CPU parts only")
    parser.add_argument("--quick", action="store_true", help="fewer steps and rounds")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    cuda = not args.cpu and torch.cuda.is_available()
    if not args.cpu and not cuda:
        parser.error("no CUDA device: run with --cpu for the CPU parts")
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    print(f"gpu bench: torch {torch.__version__} on {name}; cuda={cuda}, quick={args.quick}")
    parts: dict[str, Any] = {}
    parts["nvml"] = nvml_part()
    parts["precision"] = precision_part(device, args.quick)
    parts["fsdp_vs_ddp"] = fsdp_part(cuda, args.quick)
    parts["harness_overhead"] = overhead_part(args.quick)
    ratio = parts["precision"]["bf16_over_fp32"]
    wall = time.perf_counter() - started
    passed = parts["harness_overhead"]["weights_ok"] and (
        not cuda or (ratio >= BF16_TARGET and parts["harness_overhead"]["passed"])
    )
    print(f"bf16/fp32 {ratio:.3f} (target >= {BF16_TARGET} on a GPU); wall {wall:.1f} s")
    result: dict[str, Any] = {
        "benchmark": "gpu",
        "ratio": ratio,
        "target": BF16_TARGET,
        "passed": passed,
        "device": name,
        "cuda": cuda,
        "torch": torch.__version__,
        **parts,
        "quick": bool(args.quick),
        "wall_s": round(wall, 1),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
