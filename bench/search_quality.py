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
(d) ASHA with the bohb sampler against ASHA with the random sampler, BOHB_TRIALS trials
    each, paired by seed (the same seed gives both the same random draws where bohb draws
    at random), on two problems: today's (4 searched hyperparameters) and `hard`, 10
    searched hyperparameters with interactions (the best learning rate depends on the
    optimizer and on batch norm, momentum matters only for sgd, dropout and weight decay
    share one regularisation budget, the best depth depends on batch norm) and two that do
    nothing. Per seed, the difference random - bohb of the best final loss (> 0: bohb
    won); reported: its median, the seeds won, the two-sided exact sign test and the
    Wilcoxon signed-rank p-value. bohb passes when on both problems the median difference
    is > 0 and the Wilcoxon p-value (the sign test's without scipy) < 0.05. Also the cost
    of one bohb proposal with 1,000 and 10,000 results at the modelled rung, with the
    rung's model cached and just refitted.

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
BOHB_TRIALS = 256
P_TARGET = 0.05
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


HARD_SPACE: dict[str, HParam] = {
    "global_batch_size": Const(64),
    "lr": Log(-5.0, 0.0, 10.0),
    "optimizer": Categorical(("sgd", "adam", "rmsprop", "adagrad")),
    "momentum": Double(0.0, 0.99),
    "weight_decay": Log(-6.0, -1.0, 10.0),
    "dropout": Double(0.0, 0.6),
    "width": Int(16, 1024),
    "depth": Int(1, 12),
    "batch_norm": Categorical((True, False)),
    "augment_seed": Double(0.0, 1.0),  # does nothing
    "loader": Categorical(("pil", "cv2", "simd")),  # does nothing
}
_BEST_LR = {"sgd": -1.5, "adam": -3.5, "rmsprop": -3.5, "adagrad": -2.0}
_HARD_PENALTY = {"sgd": 0.0, "adam": 0.0, "rmsprop": 0.02, "adagrad": 0.05}


def hard_loss(hparams: Mapping[str, Any], batches: int, trial_seed: int) -> float:
    """`loss` on a space of 10 searched hyperparameters with interactions (module doc)."""
    bn = hparams["batch_norm"]
    opt = hparams["optimizer"]
    x = math.log10(hparams["lr"]) - _BEST_LR[opt] - (0.5 if bn else 0.0)
    momentum = 0.3 * (hparams["momentum"] - 0.9) ** 2 if opt == "sgd" else 0.0
    reg = hparams["dropout"] / 0.6 + (math.log10(hparams["weight_decay"]) + 6.0) / 5.0
    depth = hparams["depth"] - (8 if bn else 4)
    limit = (
        0.05
        + 0.05 * x * x
        + _HARD_PENALTY[opt]
        + momentum
        + 0.08 * (reg - 0.6) ** 2
        + 0.01 * math.log2(hparams["width"] / 256) ** 2
        + 0.004 * depth * depth
    )
    rate = min(max(0.8 + 0.1 * x + (0.1 if bn else 0.0), 0.5), 1.2)
    noise = random.Random(trial_seed * 1_000_003 + batches).gauss(0.0, 0.01)
    return float(limit + (1 + batches / 5) ** -rate + noise * (1 + 3 * batches**-0.5))


@dataclass(frozen=True)
class Problem:
    name: str
    space: Mapping[str, HParam]
    loss: Any  # (hparams, batches, trial seed) -> loss


PROBLEMS = (Problem("today", SPACE, loss), Problem("hard", HARD_SPACE, hard_loss))


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


def run_ours(
    name: str, trials: int, seed: int, sampler: str = "random", problem: Problem = PROBLEMS[0]
) -> Run:
    searcher = make_searcher(searcher_config(name, trials, sampler), problem.space, seed)
    result = SimulatedMaster(searcher, problem.loss, max_live=CONCURRENT).run()
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


def sign_test(differences: list[float]) -> float:
    """Two-sided exact sign test of `differences` (zeros dropped): P(as lopsided | p=1/2)."""
    wins = sum(d > 0 for d in differences)
    n = wins + sum(d < 0 for d in differences)
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(wins, n - wins) + 1)) / (1 << n)
    return min(1.0, 2 * tail)


def wilcoxon(differences: list[float]) -> float | None:
    """Two-sided Wilcoxon signed-rank p-value (scipy's exact test for small samples; scipy
    comes with scikit-learn, a dev dependency); None without scipy."""
    try:
        from scipy.stats import wilcoxon as scipy_wilcoxon
    except ImportError:
        return None
    if not any(differences):
        return 1.0
    return float(scipy_wilcoxon(differences).pvalue)


def paired(problem: Problem, seeds: list[int]) -> dict[str, Any]:
    """asha + bohb against asha + random on `problem`, paired by seed."""
    bohb = [run_ours("asha", BOHB_TRIALS, s, "bohb", problem).best for s in seeds]
    rand = [run_ours("asha", BOHB_TRIALS, s, "random", problem).best for s in seeds]
    diffs = [r - b for r, b in zip(rand, bohb, strict=True)]
    p = wilcoxon(diffs)
    return {
        "median_best": median(bohb),
        "random_sampler_median_best": median(rand),
        "median_difference": round(median(diffs), 5),
        "won": sum(d > 0 for d in diffs),
        "seeds": len(seeds),
        "sign_p": round(sign_test(diffs), 6),
        "wilcoxon_p": None if p is None else round(p, 6),
    }


def proposal_cost(results: int, repeats: int = 20) -> dict[str, float]:
    """Milliseconds per bohb proposal on the hard space with `results` results at the
    modelled rung: with its model cached, and when the rung has just had a new result."""
    from assay.master.searcher._bohb import BOHBSampler

    sampler = BOHBSampler(HARD_SPACE, 0, random_fraction=1.0)  # the history: random draws
    for i in range(results):
        point = sampler.propose(i, f"t{i}")
        sampler.observe(f"t{i}", MAX_LENGTH, hard_loss(point, MAX_LENGTH, i))
    sampler.random_fraction = 0.0  # every timed proposal is the model's
    index = results

    def timed(refit: bool) -> float:
        nonlocal index
        t0 = time.perf_counter()
        for _ in range(repeats):
            if refit:
                sampler.observe(f"t{index - 1}", MAX_LENGTH, 0.5)
            sampler.propose(index, f"t{index}")
            index += 1
        return round(1000 * (time.perf_counter() - t0) / repeats, 2)

    return {"cached_ms": timed(False), "refit_ms": timed(True)}


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

    bohb_seeds = list(range(args.seeds or (10 if args.quick else 20)))
    bohb = {p.name: paired(p, bohb_seeds) for p in PROBLEMS}
    bohb_passed = all(
        b["median_difference"] > 0
        and (b["sign_p"] if b["wilcoxon_p"] is None else b["wilcoxon_p"]) < P_TARGET
        for b in bohb.values()
    )
    for name, b in bohb.items():
        print(
            f"(d) {name}: asha + bohb median best {b['median_best']:.4f}, asha + random "
            f"{b['random_sampler_median_best']:.4f}; per seed random - bohb: median "
            f"{b['median_difference']:+.4f}, bohb won {b['won']}/{b['seeds']}, sign test "
            f"p={b['sign_p']:.2g}, Wilcoxon p={b['wilcoxon_p'] or math.nan:.2g}"
        )
    repeats = 5 if args.quick else 20
    costs_ms = {str(n): proposal_cost(n, repeats) for n in (1_000, 10_000)}
    print(
        "    bohb cost per proposal (ms, hard space; model cached / just refitted): "
        + ", ".join(f"{n} results {c['cached_ms']} / {c['refit_ms']}" for n, c in costs_ms.items())
    )

    elapsed = time.perf_counter() - t0
    out = {
        "benchmark": "search_quality",
        "ratio": round(ratio, 3),
        "target": RATIO_TARGET,
        "passed": ratio >= RATIO_TARGET and ours_best <= optuna_best and bohb_passed,
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
        "asha_bohb": {
            "trials": BOHB_TRIALS,
            "p_target": P_TARGET,
            "passed": bohb_passed,
            "problems": bohb,
            "cost_per_proposal": costs_ms,
        },
        "seconds": round(elapsed, 1),
    }
    print(f"passed={out['passed']} in {elapsed:.1f} s")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
