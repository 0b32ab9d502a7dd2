"""Per-batch overhead of a Core API loop against the same plain PyTorch loop.

Both loops train the same MLP (256 -> 512 -> 512 -> 10) with Adam on the same in-memory
batches of 128, in this process, on one thread. Every 100 steps both read the loss
(`loss.item()`); the Core API loop also reports it (`core.train.report_training_metrics`,
which the local twin prints and appends to its metrics file), and it asks
`core.preempt.should_preempt()` after every step, as a script that can be paused must.

The two loops take turns in blocks of 50 batches (which goes first flips every block),
so both see the same machine load: on shared machines the load drifts more within a few
seconds than the overhead being measured. Each side records `time.perf_counter()` at the
start of every batch; a block's figure is the median interval. `ratio` is the median,
over every block pair of every round, of Core median / plain median. Target: <= 1.02.
`core_calls_us_per_batch` is the time spent inside the Core API calls, per batch.

Correctness guard: both loops start from the same weights and see the same batches, so the
final weights must agree exactly.

    python bench/core_overhead.py [--quick] [--rounds N] [--batches N]

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import logging
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

import assay.core

TARGET = 1.02
REPORT_EVERY = 100
BLOCK = 50  # batches per side before the loops take turns
IN_FEATURES, HIDDEN, CLASSES, BATCH = 256, 512, 10, 128


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(IN_FEATURES, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, CLASSES),
    )


def make_batches(count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [
        (
            torch.randn(BATCH, IN_FEATURES, generator=g),
            torch.randint(CLASSES, (BATCH,), generator=g),
        )
        for _ in range(count)
    ]


def step(
    model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()  # type: ignore[no-untyped-call]
    optimizer.step()
    return loss


@contextlib.contextmanager
def _in(directory: Path) -> Iterator[None]:
    before = Path.cwd()
    os.chdir(directory)
    try:
        yield
    finally:
        os.chdir(before)


def lockstep(
    batches: list[tuple[torch.Tensor, torch.Tensor]], block: int, first: str
) -> tuple[list[float], float, bool]:
    """Train both loops over `batches` in alternating blocks of `block` batches (the
    order flipping every block); return each block pair's ratio (Core median / plain
    median), the Core API calls' own time per batch (seconds), and whether the two loops
    ended with identical weights."""
    plain_model, core_model = make_model(), make_model()
    plain_opt = torch.optim.Adam(plain_model.parameters(), lr=1e-3)
    core_opt = torch.optim.Adam(core_model.parameters(), lr=1e-3)
    ratios: list[float] = []
    in_core = 0.0
    with (
        tempfile.TemporaryDirectory(prefix="assay-bench-") as tmp,
        _in(Path(tmp)),
        assay.core.init() as context,
    ):
        for b, start in enumerate(range(0, len(batches), block)):
            chunk = list(enumerate(batches[start : start + block], start=start + 1))
            medians: dict[str, float] = {}
            order = ("plain", "core") if (b % 2 == 0) == (first == "plain") else ("core", "plain")
            for side in order:
                stamps: list[float] = []
                for i, (x, y) in chunk:
                    stamps.append(time.perf_counter())
                    if side == "plain":
                        loss = step(plain_model, plain_opt, x, y)
                        if i % REPORT_EVERY == 0:
                            loss.item()
                        continue
                    loss = step(core_model, core_opt, x, y)
                    t0 = time.perf_counter()
                    if i % REPORT_EVERY == 0:
                        context.train.report_training_metrics(i, {"loss": loss.item()})
                    context.preempt.should_preempt()
                    in_core += time.perf_counter() - t0
                stamps.append(time.perf_counter())
                medians[side] = statistics.median(b - a for a, b in itertools.pairwise(stamps))
            ratios.append(medians["core"] / medians["plain"])
    same = all(
        torch.equal(a, b)
        for a, b in zip(plain_model.parameters(), core_model.parameters(), strict=True)
    )
    return ratios, in_core / len(batches), same


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="A short run (under a minute).")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--batches", type=int, default=None)
    args = parser.parse_args()
    rounds = args.rounds or (4 if args.quick else 10)
    count = args.batches or (400 if args.quick else 1000)
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.WARNING)
    batches = make_batches(count)
    ratios: list[float] = []
    in_core: list[float] = []
    for r in range(rounds):
        block_ratios, core_s, same = lockstep(batches, BLOCK, "plain" if r % 2 == 0 else "core")
        if not same:
            raise SystemExit("the two loops trained different weights")
        ratios.extend(block_ratios)
        in_core.append(core_s)
        print(
            f"round {r + 1}: median block ratio {statistics.median(block_ratios):.4f}, "
            f"Core API calls {core_s * 1e6:.1f} us/batch",
            flush=True,
        )
    ratio = statistics.median(ratios)
    print(
        json.dumps(
            {
                "benchmark": "core_overhead",
                "ratio": round(ratio, 4),
                "target": TARGET,
                "met": ratio <= TARGET,
                "core_calls_us_per_batch": round(statistics.median(in_core) * 1e6, 2),
                "block_pairs": len(ratios),
                "rounds": rounds,
                "batches": count,
                "block": BLOCK,
                "report_every": REPORT_EVERY,
            }
        )
    )


if __name__ == "__main__":
    main()
