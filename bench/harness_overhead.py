"""Per-batch overhead of the Assay harness against a hand-written PyTorch loop.

The same MLP (256 -> 512 -> 512 -> 10), the same in-memory data (a TensorDataset of random
tensors, batches of 128, DataLoader with shuffle=True) and the same optimizer (Adam) are
trained (a) by a plain loop and (b) by the harness in this process
(`assay.run_local(Trial, config, checkpoint_dir=tmp)`, one slot), for
`aggregation_frequency` 1 and 4. With k=4 the plain loop divides the loss by 4, calls
backward on every batch and steps + zero_grads on every 4th, as the harness does.

Both sides record `time.perf_counter()` at the start of every batch (in `train_batch` for
the harness), so a batch's time is the interval between consecutive stamps: it covers data
loading and everything the harness does between two `train_batch` calls, and none of the
process start, the final validation or the checkpoint. The first warm-up batches of every
run are skipped. For k=4 a sample is the time of one aligned accumulation window of 4
batches divided by 4 (so the optimizer step counts exactly once per sample).

Rounds are interleaved A/B: each round runs plain then harness for every k, and the order
flips every round. Per round and k the ratio is harness median / plain median; a setting's
ratio is the median of its round ratios, and the headline `ratio` is the worse setting.
Target: <= 1.02 (Lightning Fabric's parity bar).

Correctness guard: with shuffle=False, both sides train the same number of batches from
the same initial weights; the final weights must agree to <= 1e-6 (max abs diff).

torch runs on one thread (`torch.set_num_threads(1)`) so that timings are stable.

    python bench/harness_overhead.py [--quick] [--rounds N] [--batches N]

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import assay
from assay import Trial, TrialContext

TARGET = 1.02
WEIGHT_TOLERANCE = 1e-6
SEED = 0
IN_FEATURES, HIDDEN, CLASSES = 256, 512, 10
BATCH_SIZE = 128
TRAIN_BATCHES_PER_EPOCH = 64  # 8,192 samples: epoch boundaries happen inside a run
VAL_BATCHES = 2
AGGREGATIONS = (1, 4)


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(IN_FEATURES, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, CLASSES),
    )


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.parameters(), lr=1e-3)


def make_dataset(batches: int, generator: torch.Generator) -> TensorDataset:
    n = batches * BATCH_SIZE
    x = torch.randn(n, IN_FEATURES, generator=generator)
    y = torch.randint(CLASSES, (n,), generator=generator)
    return TensorDataset(x, y)


@dataclass
class RunSpec:
    """What one run (plain or harness) trains on; the harness's Trial reads it from `_ACTIVE`."""

    train: TensorDataset
    val: TensorDataset
    init_state: dict[str, torch.Tensor]
    shuffle: bool
    stamps: list[float] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)
    model: nn.Module | None = None


_ACTIVE: RunSpec | None = None


def _active() -> RunSpec:
    if _ACTIVE is None:
        raise RuntimeError("BenchTrial built outside a benchmark run")
    return _ACTIVE


class BenchTrial(Trial):
    """The plain loop's model, data and step, written as an Assay Trial."""

    def __init__(self, context: TrialContext) -> None:
        self.context = context
        self.spec = _active()
        model = make_model()
        model.load_state_dict(self.spec.init_state)
        self.model = context.wrap_model(model)
        self.optimizer = context.wrap_optimizer(make_optimizer(self.model))
        self.loss_fn = nn.CrossEntropyLoss()
        self.stamps = self.spec.stamps
        self.ends = self.spec.ends
        self.spec.model = self.model

    def build_training_data_loader(self) -> DataLoader[Any]:
        return DataLoader(
            self.spec.train,
            batch_size=self.context.get_per_slot_batch_size(),
            shuffle=self.spec.shuffle,
        )

    def build_validation_data_loader(self) -> DataLoader[Any]:
        return DataLoader(self.spec.val, batch_size=BATCH_SIZE)

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        self.stamps.append(time.perf_counter())
        x, y = batch
        loss = self.loss_fn(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        self.ends.append(time.perf_counter())
        return {"loss": loss}

    def evaluate_batch(self, batch: Any) -> dict[str, Any]:
        x, y = batch
        return {"validation_loss": self.loss_fn(self.model(x), y)}


def run_plain(spec: RunSpec, k: int, total: int) -> None:
    """The hand-written loop: `total` batches with accumulation over `k` batches."""
    model = make_model()
    model.load_state_dict(spec.init_state)
    optimizer = make_optimizer(model)
    loss_fn = nn.CrossEntropyLoss()
    loader: DataLoader[Any] = DataLoader(spec.train, batch_size=BATCH_SIZE, shuffle=spec.shuffle)
    stamps, ends = spec.stamps, spec.ends
    model.train()
    done = 0
    while done < total:
        for x, y in loader:
            stamps.append(time.perf_counter())
            loss = loss_fn(model(x), y)
            if k > 1:
                loss = loss / k
            loss.backward()
            if (done + 1) % k == 0:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            ends.append(time.perf_counter())
            done += 1
            if done >= total:
                break
    spec.model = model


def harness_config(k: int, total: int) -> dict[str, Any]:
    return {
        "name": "bench-harness-overhead",
        "entrypoint": "harness_overhead:BenchTrial",
        "hyperparameters": {"global_batch_size": BATCH_SIZE},
        "searcher": {
            "name": "single",
            "metric": "validation_loss",
            "smaller_is_better": True,
            "max_length": {"batches": total},
        },
        "optimizations": {"aggregation_frequency": k},
        "reproducibility": {"experiment_seed": SEED},
    }


def run_harness(spec: RunSpec, k: int, total: int) -> None:
    """`total` batches through `assay.run_local` in this process (one slot)."""
    global _ACTIVE
    _ACTIVE = spec
    try:
        with tempfile.TemporaryDirectory(prefix="assay-bench-") as tmp:
            result = assay.run_local(BenchTrial, harness_config(k, total), checkpoint_dir=tmp)
    finally:
        _ACTIVE = None
    if result.total_batches != total:
        raise RuntimeError(f"the harness trained {result.total_batches} batches, not {total}")


Runner = Callable[[RunSpec, int, int], None]
RUNNERS: dict[str, Runner] = {"plain": run_plain, "harness": run_harness}


@dataclass(frozen=True)
class Timing:
    """Seconds per batch of each aligned k-batch window of one run, after its warm-up.

    `total` is stamp to stamp (the whole iteration); `outside` is the part spent outside
    the training step (after the step's end stamp until the next batch's start stamp: data
    loading, plus the harness's own work between two `train_batch` calls).
    """

    total: list[float]
    outside: list[float]


def window_times(
    stamps: list[float], ends: list[float], k: int, warmup: int, batches: int
) -> Timing:
    first, last = warmup // k, (warmup + batches) // k
    if len(stamps) < last * k + 1 or len(ends) < last * k:
        raise RuntimeError(f"expected {last * k + 1} batch stamps, got {len(stamps)}")
    total = [(stamps[(j + 1) * k] - stamps[j * k]) / k for j in range(first, last)]
    outside = [
        sum(stamps[i + 1] - ends[i] for i in range(j * k, (j + 1) * k)) / k
        for j in range(first, last)
    ]
    return Timing(total, outside)


def measure(kind: str, k: int, warmup: int, batches: int, base: RunSpec) -> Timing:
    # One extra window so that the last timed window has an end stamp.
    total = warmup + batches + k
    spec = RunSpec(base.train, base.val, base.init_state, shuffle=True)
    gc.collect()
    RUNNERS[kind](spec, k, total)
    return window_times(spec.stamps, spec.ends, k, warmup, batches)


def max_abs_diff(a: nn.Module, b: nn.Module) -> float:
    sa = {n: t.detach() for n, t in getattr(a, "module", a).state_dict().items()}
    sb = {n: t.detach() for n, t in getattr(b, "module", b).state_dict().items()}
    if sa.keys() != sb.keys():
        raise RuntimeError(f"state dicts differ in keys: {sorted(sa)} vs {sorted(sb)}")
    return max(float((sa[n] - sb[n]).abs().max()) for n in sa)


def weights_check(base: RunSpec, k: int, total: int) -> float:
    """Max abs difference of the final weights after `total` unshuffled batches."""
    models: dict[str, nn.Module] = {}
    for kind, runner in RUNNERS.items():
        spec = RunSpec(base.train, base.val, base.init_state, shuffle=False)
        runner(spec, k, total)
        assert spec.model is not None
        models[kind] = spec.model
    return max_abs_diff(models["plain"], models["harness"])


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def ms(seconds: float) -> float:
    return round(seconds * 1e3, 4)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="few rounds and batches (< 1 min)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved A/B rounds")
    parser.add_argument("--batches", type=int, default=None, help="timed batches per run")
    args = parser.parse_args(argv)
    rounds: int = args.rounds or (4 if args.quick else 16)
    batches = round_up(args.batches or (96 if args.quick else 200), max(AGGREGATIONS))
    warmup = 12 if args.quick else 24
    check_batches = 32 if args.quick else 64
    if rounds < 1 or batches < 1:
        parser.error("--rounds and --batches must be positive")

    started = time.perf_counter()
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(SEED)
    torch.manual_seed(SEED)
    init_state = {n: t.clone() for n, t in make_model().state_dict().items()}
    base = RunSpec(
        train=make_dataset(TRAIN_BATCHES_PER_EPOCH, generator),
        val=make_dataset(VAL_BATCHES, generator),
        init_state=init_state,
        shuffle=True,
    )
    print(
        f"harness_overhead: MLP {IN_FEATURES}->{HIDDEN}->{HIDDEN}->{CLASSES}, Adam, batch "
        f"{BATCH_SIZE}, {TRAIN_BATCHES_PER_EPOCH} batches/epoch, torch {torch.__version__} "
        f"on {torch.get_num_threads()} thread; {rounds} rounds x {batches} timed batches "
        f"(+{warmup} warm-up) per run, aggregation_frequency {AGGREGATIONS}"
    )

    # Untimed warm-up of both paths (first-call costs: lazy imports, allocator, caches).
    for k in AGGREGATIONS:
        for kind in RUNNERS:
            measure(kind, k, warmup, 2 * k, base)

    medians: dict[tuple[str, int], list[float]] = {
        (kind, k): [] for kind in RUNNERS for k in AGGREGATIONS
    }
    outside: dict[tuple[str, int], list[float]] = {
        (kind, k): [] for kind in RUNNERS for k in AGGREGATIONS
    }
    for r in range(rounds):
        order = ["plain", "harness"] if r % 2 == 0 else ["harness", "plain"]
        parts: list[str] = []
        for k in AGGREGATIONS:
            for kind in order:
                timing = measure(kind, k, warmup, batches, base)
                medians[kind, k].append(statistics.median(timing.total))
                outside[kind, k].append(statistics.median(timing.outside))
            p, h = medians["plain", k][-1], medians["harness", k][-1]
            parts.append(f"k={k}: plain {ms(p):.3f} ms, harness {ms(h):.3f} ms ({h / p:.4f})")
        print(f"round {r + 1}/{rounds} ({order[0]} first): " + "; ".join(parts))

    summary: dict[str, Any] = {}
    ratios: dict[int, float] = {}
    for k in AGGREGATIONS:
        plain, harness = medians["plain", k], medians["harness", k]
        round_ratios = [h / p for p, h in zip(plain, harness, strict=True)]
        ratios[k] = statistics.median(round_ratios)
        plain_ms = statistics.median(plain)
        # Lower-noise cross-check: the harness's extra time outside the step, per round.
        extra = statistics.median(
            [h - p for p, h in zip(outside["plain", k], outside["harness", k], strict=True)]
        )
        summary[f"ratio_agg{k}"] = round(ratios[k], 4)
        summary[f"plain_median_ms_agg{k}"] = ms(plain_ms)
        summary[f"harness_median_ms_agg{k}"] = ms(statistics.median(harness))
        summary[f"round_ratios_agg{k}"] = [round(x, 4) for x in round_ratios]
        summary[f"outside_step_us_plain_agg{k}"] = round(
            statistics.median(outside["plain", k]) * 1e6, 1
        )
        summary[f"outside_step_us_harness_agg{k}"] = round(
            statistics.median(outside["harness", k]) * 1e6, 1
        )
        summary[f"extra_us_per_batch_agg{k}"] = round(extra * 1e6, 1)
        summary[f"ratio_from_extra_agg{k}"] = round(1 + extra / plain_ms, 4)
        print(
            f"aggregation_frequency={k}: plain {ms(plain_ms):.3f} ms/batch, harness "
            f"{ms(statistics.median(harness)):.3f} ms/batch, ratio {ratios[k]:.4f} (round "
            f"ratios {min(round_ratios):.4f}..{max(round_ratios):.4f}); time outside the step "
            f"+{extra * 1e6:.1f} us/batch for the harness = ratio {1 + extra / plain_ms:.4f}"
        )

    diff1 = weights_check(base, 1, check_batches)
    diff4 = weights_check(base, 4, check_batches)
    weights_ok = diff1 <= WEIGHT_TOLERANCE
    print(
        f"weights after {check_batches} unshuffled batches, max |plain - harness|: "
        f"k=1 {diff1:.3g} ({'ok' if weights_ok else 'MISMATCH'}, tolerance "
        f"{WEIGHT_TOLERANCE:g}), k=4 {diff4:.3g}"
    )
    ratio = max(ratios.values())
    wall = time.perf_counter() - started
    verdict = "meets" if ratio <= TARGET else "MISSES"
    print(f"ratio {ratio:.4f} (worse setting) {verdict} the target {TARGET}; wall {wall:.1f} s")
    result: dict[str, Any] = {
        "benchmark": "harness_overhead",
        "ratio": round(ratio, 4),
        "target": TARGET,
        "passed": ratio <= TARGET and weights_ok,
        **summary,
        "rounds": rounds,
        "batches": batches,
        "warmup_batches": warmup,
        "batch_size": BATCH_SIZE,
        "threads": torch.get_num_threads(),
        "weights_max_abs_diff": diff1,
        "weights_max_abs_diff_agg4": diff4,
        "weights_check_batches": check_batches,
        "weights_ok": weights_ok,
        "quick": bool(args.quick),
        "wall_s": round(wall, 1),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
