"""Per-batch overhead of a Core API loop against the same plain PyTorch loop.

Both loops train the same MLP (256 -> 512 -> 512 -> 10) with Adam on the same in-memory
batches of 128, in this process, on one thread. Every 100 steps both read the loss
(`loss.item()`); the Core API loop also reports it (`core.train.report_training_metrics`,
which the local twin prints and appends to its metrics file), and it asks
`core.preempt.should_preempt()` after every step, as a script that can be paused must.

Both record `time.perf_counter()` at the start of every batch; a batch's time is the
interval between consecutive stamps, the first warm-up batches skipped. Rounds are
interleaved A/B with the order flipped every round; per round the ratio is Core median /
plain median, and `ratio` is the median of the round ratios. Target: <= 1.02.

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
WARMUP = 20
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


def plain(batches: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[list[float], nn.Module]:
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    stamps: list[float] = []
    for i, (x, y) in enumerate(batches, start=1):
        stamps.append(time.perf_counter())
        loss = step(model, optimizer, x, y)
        if i % REPORT_EVERY == 0:
            loss.item()
    stamps.append(time.perf_counter())
    return stamps, model


@contextlib.contextmanager
def _in(directory: Path) -> Iterator[None]:
    before = Path.cwd()
    os.chdir(directory)
    try:
        yield
    finally:
        os.chdir(before)


def core(batches: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[list[float], nn.Module]:
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    stamps: list[float] = []
    with (
        tempfile.TemporaryDirectory(prefix="assay-bench-") as tmp,
        _in(Path(tmp)),
        assay.core.init() as context,
    ):
        for i, (x, y) in enumerate(batches, start=1):
            stamps.append(time.perf_counter())
            loss = step(model, optimizer, x, y)
            if i % REPORT_EVERY == 0:
                context.train.report_training_metrics(i, {"loss": loss.item()})
            if context.preempt.should_preempt():
                break
        stamps.append(time.perf_counter())
    return stamps, model


def per_batch(stamps: list[float]) -> float:
    gaps = [b - a for a, b in itertools.pairwise(stamps)][WARMUP:]
    return statistics.median(gaps)


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
    plain_s: list[float] = []
    core_s: list[float] = []
    for r in range(rounds):
        order = (plain, core) if r % 2 == 0 else (core, plain)
        results = {fn.__name__: fn(batches) for fn in order}
        (p_stamps, p_model), (c_stamps, c_model) = results["plain"], results["core"]
        for a, b in zip(p_model.parameters(), c_model.parameters(), strict=True):
            if not torch.equal(a, b):
                raise SystemExit("the two loops trained different weights")
        p, c = per_batch(p_stamps), per_batch(c_stamps)
        plain_s.append(p)
        core_s.append(c)
        ratios.append(c / p)
        print(
            f"round {r + 1}: plain {p * 1e3:.3f} ms/batch, core {c * 1e3:.3f} ms/batch, "
            f"ratio {c / p:.4f}",
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
                "plain_ms_per_batch": round(statistics.median(plain_s) * 1e3, 4),
                "core_ms_per_batch": round(statistics.median(core_s) * 1e3, 4),
                "rounds": rounds,
                "batches": count,
                "report_every": REPORT_EVERY,
            }
        )
    )


if __name__ == "__main__":
    main()
