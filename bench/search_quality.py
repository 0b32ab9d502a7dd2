"""Search quality of the searchers on simulated learning curves, against baselines.

Each trial's validation loss after `b` batches follows a power law,
`loss(b) = limit(h) + (1 + b / 5) ** -rate(h) + noise`, whose limit and rate
depend on the hyperparameters `h`: the log learning rate has an optimum (1e-2.5) and a
higher rate learns faster but ends worse (curves cross, so early results mislead a
little), one optimizer of three is better, width and dropout matter a little. The noise is
Gaussian (0.01, more early on), fixed per trial and length.

All searches run in the simulated master (`assay.master.searcher.simulate`, time order:
every live trial trains at once, the first to finish reports first) with at most
`CONCURRENT` trials at once, max_length 1000 batches, divisor 4 and 5 rungs (3, 15, 62, 250,
1000 batches) for ASHA: the defaults for 1,024 trials. Over the seeds:

(a) random search with RANDOM_TRIALS full-length trials sets the target: the median of its
    best final (1000-batch) loss. ASHA (random sampler, ASHA_TRIALS trials) is followed
    event by event; its cost is the number of batches trained when its best final loss
    first reaches that target. ratio = random's budget / ASHA's median cost; target >= 3.
(b) Optuna's SuccessiveHalvingPruner (min_resource 3, reduction factor 4) with its
    RandomSampler, trials one after the other, each reporting at our rung lengths, until
    it has trained as many batches as our ASHA did with the same seed: our
    median best final loss must be equal or better.
(c) ASHA with the tpe sampler against ASHA with the random sampler, TPE_TRIALS trials each
    (TPE refits on the whole history for every proposal).

    python bench/search_quality.py [--quick] [--seeds N]

Human-readable lines first; the last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from assay.config import (
    Categorical,
    Const,
    Double,
    HParam,
    Int,
    Length,
    Log,
    SearcherConfig,
    rung_lengths,
)
from assay.master.searcher import make_searcher
from assay.master.searcher.simulate import SimulatedMaster

RATIO_TARGET = 3.0
MAX_LENGTH = 1000
RANDOM_TRIALS = 64
ASHA_TRIALS = 1024
TPE_TRIALS = 256  # TPE refits on the whole history per proposal: O(trials**2)
CONCURRENT = 4
# ASHA's defaults: divisor 4, 5 rungs (3, 15, 62, 250, 1000 batches)
RUNGS = rung_lengths(MAX_LENGTH, 4, 5)

SPACE: dict[str, HParam] = {
    "global_batch_size": Const(64),
    "lr": Log(-5.0, 0.0, 10.0),
    "optimizer": Categorical(("sgd", "adam", "rmsprop")),
    "width": Int(16, 512),
    "dropout": Double(0.0, 0.6),
}
_OPTIMIZER_PENALTY = {"adam": 0.0, "rmsprop": 0.03, "sgd": 0.08}


def loss(hparams: Mapping[str, Any], batches: int, trial_seed: int) -> float:
    """The simulated validation loss of a trial after `batches` batches."""
    x = math.log10(hparams["lr"]) + 2.5  # 0 at the best learning rate
    limit = (
        0.08
        + 0.06 * x * x
        + _OPTIMIZER_PENALTY[hparams["optimizer"]]
        + 0.01 * math.log2(hparams["width"] / 256) ** 2
        + 0.1 * (hparams["dropout"] - 0.2) ** 2
    )
    rate = min(max(0.8 + 0.1 * x, 0.5), 1.1)  # a higher lr learns faster early on
    noise = random.Random(trial_seed * 1_000_003 + batches).gauss(0.0, 0.01)
    return float(limit + (1 + batches / 5) ** -rate + noise * (1 + 3 * batches**-0.5))


def searcher_config(name: str, trials: int, sampler: str = "random") -> SearcherConfig:
    options: dict[str, Any] = {"sampler": sampler}
    return SearcherConfig(
        name=name,
        metric="loss",
        max_length=Length.batches(MAX_LENGTH),
        max_trials=trials,
        max_concurrent_trials=CONCURRENT,
        options=options,
    )


@dataclass
class Run:
    best: float  # best final (full-length) loss
    batches: int  # batches trained in all
    trace: list[tuple[int, float, int]]  # (batches so far, loss, length)

    def cost_to_reach(self, target: float) -> float:
        """Batches trained when the best final loss first reached `target` (inf if never)."""
        for batches, value, length in self.trace:
            if length == MAX_LENGTH and value <= target:
                return float(batches)
        return math.inf


def run_ours(name: str, trials: int, seed: int, sampler: str = "random") -> Run:
    searcher = make_searcher(searcher_config(name, trials, sampler), SPACE, seed)
    result = SimulatedMaster(searcher, loss, max_live=CONCURRENT).run()
    finals = [v for _, v, n in result.trace if n == MAX_LENGTH]
    return Run(min(finals), result.batches, result.trace)


def run_optuna(seed: int, budget: int) -> Run:
    """Optuna's successive halving pruner and random sampler, trial after trial."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        sampler=optuna.samplers.RandomSampler(seed=seed),
        pruner=optuna.pruners.SuccessiveHalvingPruner(min_resource=RUNGS[0], reduction_factor=4),
    )
    trained = 0
    best = math.inf
    trace: list[tuple[int, float, int]] = []
    while trained < budget:
        trial = study.ask()
        hparams = {
            "lr": 10 ** trial.suggest_float("lr_exp", -5.0, 0.0),
            "optimizer": trial.suggest_categorical("optimizer", ["sgd", "adam", "rmsprop"]),
            "width": trial.suggest_int("width", 16, 512),
            "dropout": trial.suggest_float("dropout", 0.0, 0.6),
        }
        value, pruned, previous = math.inf, False, 0
        for length in RUNGS:
            value = loss(hparams, length, trial.number)
            trained, previous = trained + length - previous, length
            trace.append((trained, value, length))
            if length == MAX_LENGTH:
                break
            trial.report(value, length)
            if trial.should_prune():
                pruned = True
                break
        if pruned:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            study.tell(trial, value)
            best = min(best, value)
    return Run(best, trained, trace)


def run_random_baseline(seed: int) -> Run:
    """Random search, every trial trained to max_length (our `random` searcher)."""
    return run_ours("random", RANDOM_TRIALS, seed)


def median(values: list[float]) -> float:
    return float(statistics.median(values))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="5 seeds (< 1 min)")
    parser.add_argument("--seeds", type=int, default=None, help="number of seeds (default 20)")
    args = parser.parse_args(argv)
    seeds = list(range(args.seeds or (5 if args.quick else 20)))
    t0 = time.perf_counter()

    randoms = [run_random_baseline(s) for s in seeds]
    target = median([r.best for r in randoms])
    random_budget = RANDOM_TRIALS * MAX_LENGTH
    ashas = [run_ours("asha", ASHA_TRIALS, s) for s in seeds]
    costs = [a.cost_to_reach(target) for a in ashas]
    asha_cost = median(costs)
    ratio = random_budget / asha_cost if asha_cost > 0 else 0.0
    print(
        f"(a) random search, {RANDOM_TRIALS} trials x {MAX_LENGTH} batches = {random_budget:,}: "
        f"median best final loss {target:.4f}"
    )
    print(
        f"    ASHA reaches it after a median {asha_cost:,.0f} batches "
        f"(reached in {sum(math.isfinite(c) for c in costs)}/{len(seeds)} seeds): "
        f"{ratio:.1f}x less (target >= {RATIO_TARGET})"
    )

    optunas = [run_optuna(s, a.batches) for s, a in zip(seeds, ashas, strict=True)]
    ours_best, optuna_best = median([a.best for a in ashas]), median([o.best for o in optunas])
    print(
        f"(b) same budget (median {median([float(a.batches) for a in ashas]):,.0f} batches): "
        f"our asha median best {ours_best:.4f}, Optuna SuccessiveHalvingPruner + "
        f"RandomSampler {optuna_best:.4f} (ours must be <=)"
    )

    tpes = [run_ours("asha", TPE_TRIALS, s, sampler="tpe") for s in seeds]
    smalls = [run_ours("asha", TPE_TRIALS, s) for s in seeds]
    tpe_best, small_best = median([t.best for t in tpes]), median([r.best for r in smalls])
    print(
        f"(c) {TPE_TRIALS} trials: asha + tpe median best {tpe_best:.4f}, "
        f"asha + random {small_best:.4f}"
    )

    elapsed = time.perf_counter() - t0
    out = {
        "benchmark": "search_quality",
        "ratio": round(ratio, 3),
        "target": RATIO_TARGET,
        "passed": ratio >= RATIO_TARGET and ours_best <= optuna_best,
        "seeds": len(seeds),
        "quick": bool(args.quick),
        "random": {"trials": RANDOM_TRIALS, "budget": random_budget, "median_best": target},
        "asha": {
            "trials": ASHA_TRIALS,
            "concurrent": CONCURRENT,
            "median_cost_to_target": asha_cost,
            "median_budget": median([float(a.batches) for a in ashas]),
            "median_best": ours_best,
        },
        "optuna_sha": {"median_best": optuna_best, "asha_not_worse": ours_best <= optuna_best},
        "asha_tpe": {
            "trials": TPE_TRIALS,
            "median_best": tpe_best,
            "random_sampler_median_best": small_best,
            "tpe_over_random": round(tpe_best / small_best, 4),
        },
        "seconds": round(elapsed, 1),
    }
    print(f"passed={out['passed']} in {elapsed:.1f} s")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
