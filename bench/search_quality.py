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
(e) equal budget: every method gets at most PEER_BUDGET batches (all trials together) per
    seed, on both problems, the same seeds, and reports the budget it used (median, least,
    most over the seeds). Each launches trials until the budget is spent; its run is then
    cut at the budget (`Run.capped`: the result that would cross it is left out, so a
    method uses a little less than the budget, never more). Methods: our asha with the
    random and with the bohb sampler (up to MAX_TRIALS trials, stopped by the budget, not
    by a trial count, CONCURRENT trials at once); Optuna's SuccessiveHalvingPruner +
    RandomSampler and its HyperbandPruner + TPESampler (Optuna's counterpart of BOHB),
    asked and told CONCURRENT trials at once on the simulated clock (`run_optuna`; (b)
    runs them one at a time); Ray Tune's ASHA (`AsyncHyperBandScheduler` with its
    random search) and Ray Tune's BOHB (`HyperBandForBOHB` with `TuneBOHB`, HpBandSter's
    kernel densities over ConfigSpace), CONCURRENT trials at once. Ray's scheduler and
    searcher objects are driven in the same simulated clock as ours (`run_ray`: each batch
    one time unit, every running trial trains at once, the first to finish reports first;
    the calls, their order and the pause/resume/stop rules of Ray Tune's TuneController),
    with no Ray processes: a real Tune run on this machine spends seconds per trial in
    process start-up and its result order would follow the OS scheduler, not the curves.
    Mapping: Ray's time attribute is a rung clock 1, 4, 16, 64, 256 standing for 3, 15,
    62, 250, 1000 batches (our rungs): reduction factor 4, grace period 1 and max_t 256 give
    Ray's ASHA exactly our 5 rungs, and HyperBand's brackets (r0 = 256 / 4**s) start at
    the same lengths. Per seed, peer's best final loss - ours (> 0: ours won), against
    our asha and against our asha + bohb, with the statistics of (d); also our asha's -
    asha + bohb's (> 0: bohb won). Targets, on today's problem (the one the peers were
    asked for; `hard`'s verdict is reported beside): our asha at least as good as each
    ASHA-type peer (Optuna's and Ray's; median difference >= 0), and our asha + bohb
    better than every peer (median > 0, Wilcoxon p < 0.05). Ray's rows need
    `pip install -e '.[bench-peers]'`; without Ray they are skipped, with a line saying
    so. HpBandSter proposes in about 0.1 s, so Ray's BOHB takes about 20 s a seed and
    problem and runs on the first RAY_BOHB_SEEDS seeds (`--ray-bohb-seeds`); the other
    methods take about 1.5 s a seed together. `--peers` narrows (e) to some peers.
    `--quick` leaves (e) out.
    Each method is also scored by the noise-free final loss of the trial it would hand
    over (the one with its lowest full-length result; `Run.chosen_truth`), paired the same
    way and reported beside the targets: the lowest of noisy results falls with every extra
    full-length result even when the trials are no better, and at this budget the methods
    get a median of 2 (our asha) to 6 (Ray's ASHA) of them.

--quick keeps every row's statistic with fewer seeds (QUICK_SEEDS: 5 for (a) and (b), 1
for (c), 8 for (d)), times bohb's proposals at 1,000 results only, and takes about 20 s of
CPU in two processes (the second runs (c) and, in --quick, 2 of (b)'s seeds).

    python bench/search_quality.py [--quick] [--seeds N] [--first-seed S] [--only-e]
        [--peers optuna_sha,optuna_hyperband_tpe,ray_asha,ray_bohb] [--ray-bohb-seeds N]

The full run takes 200 seeds for (a), (b), (d) and (e) (FULL_SEEDS; (c)'s TPE, which refits
on the whole history per proposal, keeps 20): at 20 seeds, a difference of
0.003 to 0.006 in the best final loss (per-seed spread about 0.01) is missed or found by
chance, and seeds 0 to 19 and 20 to 39 gave opposite verdicts on several of (e)'s pairs.

`--first-seed S` runs seeds S to S + N - 1 (holdout seeds: `--first-seed 20`); `--only-e`
runs row (e) alone.

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
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
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
from assay.config._searcher_config import MAX_TRIALS
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
PEER_BUDGET = 8_000  # (e): batches per method and seed, all trials together
# Seeds per row, 0 to n - 1 (--seeds N: N for every row). --quick keeps each row's
# statistic with fewer seeds: a tpe proposal refits on the whole history (about 6 s of CPU
# per seed for (c)); (d) keeps 8 seeds, so that its Wilcoxon test can pass with a seed lost.
FULL_SEEDS = {"a": 200, "b": 200, "c": 20, "d": 200, "e": 200}
# Ray's BOHB (about 20 s a seed and problem) runs on the first seeds of (e) only.
RAY_BOHB_SEEDS = 40
QUICK_SEEDS = {"a": 5, "b": 5, "c": 1, "d": 8, "e": 0}
QUICK_B_AWAY = 2  # (b)'s seeds that --quick runs in the second process (see main)
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


def _noise(batches: int, trial_seed: int) -> float:
    """The noise of a result: Gaussian, fixed per trial and length, larger early on."""
    noise = random.Random(trial_seed * 1_000_003 + batches).gauss(0.0, 0.01)
    return float(noise * (1 + 3 * batches**-0.5))


def loss(hparams: Mapping[str, Any], batches: int, trial_seed: int) -> float:
    """The simulated validation loss of a trial after `batches` batches."""
    return float(loss_mean(hparams, batches) + _noise(batches, trial_seed))


def loss_mean(hparams: Mapping[str, Any], batches: int) -> float:
    """`loss` without its noise: what the trial's model is worth."""
    x = math.log10(hparams["lr"]) + 2.5  # 0 at the best learning rate
    limit = (
        0.08
        + 0.06 * x * x
        + _OPTIMIZER_PENALTY[hparams["optimizer"]]
        + 0.01 * math.log2(hparams["width"] / 256) ** 2
        + 0.1 * (hparams["dropout"] - 0.2) ** 2
    )
    rate = min(max(0.8 + 0.1 * x, 0.5), 1.1)  # a higher lr learns faster early on
    return float(limit + (1 + batches / 5) ** -rate)


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
    return float(hard_loss_mean(hparams, batches) + _noise(batches, trial_seed))


def hard_loss_mean(hparams: Mapping[str, Any], batches: int) -> float:
    """`hard_loss` without its noise."""
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
    return float(limit + (1 + batches / 5) ** -rate)


@dataclass(frozen=True)
class Problem:
    name: str
    space: Mapping[str, HParam]
    loss: Any  # (hparams, batches, trial seed) -> loss
    mean: Any = None  # (hparams, batches) -> the loss without its noise, if known

    def recorded(self) -> tuple[Problem, list[float]]:
        """This problem, whose every result also appends its noise-free loss to the list
        (empty if `mean` is unknown): one entry per result, in the order of a run's trace."""
        truths: list[float] = []
        if self.mean is None:
            return self, truths

        def objective(hparams: Mapping[str, Any], batches: int, trial_seed: int) -> float:
            truths.append(self.mean(hparams, batches))
            return float(self.loss(hparams, batches, trial_seed))

        return Problem(self.name, self.space, objective, self.mean), truths


PROBLEMS = (
    Problem("today", SPACE, loss, loss_mean),
    Problem("hard", HARD_SPACE, hard_loss, hard_loss_mean),
)


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
    # the noise-free loss of each result of `trace` (empty when the problem has none)
    truths: list[float] = field(default_factory=list)

    def capped(self, budget: int) -> Run:
        """The same run stopped at `budget` batches: only the results whose batches so far
        (all trials together) are within it; `batches` is what those used."""
        kept = [entry for entry in self.trace if entry[0] <= budget]
        finals = [value for _, value, length in kept if length == MAX_LENGTH]
        truths = self.truths[: len(kept)]
        return Run(min(finals, default=math.inf), kept[-1][0] if kept else 0, kept, truths)

    def chosen_truth(self) -> float:
        """The noise-free final loss of the trial the run would hand over: the one with the
        lowest full-length result (the earliest on a tie); inf if none. `best` is the lowest
        of noisy results, so it falls with every extra full-length result, even when the
        trials are no better; this does not."""
        if len(self.truths) != len(self.trace):
            raise ValueError(f"{len(self.truths)} noise-free losses for {len(self.trace)} results")
        finals = [(v, i) for i, (_, v, n) in enumerate(self.trace) if n == MAX_LENGTH]
        return self.truths[min(finals)[1]] if finals else math.inf

    def trials(self) -> int:
        """Trials started: results at the bottom rung."""
        return sum(length == RUNGS[0] for _, _, length in self.trace)

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


def run_ours_capped(sampler: str, problem: Problem, seed: int, budget: int) -> Run:
    """Our asha with `sampler`, launching trials (up to MAX_TRIALS) until `budget` batches
    are spent, then `Run.capped` at it: the first result past the budget stops the run."""
    problem, truths = problem.recorded()
    searcher = make_searcher(searcher_config("asha", MAX_TRIALS, sampler), problem.space, seed)
    master = SimulatedMaster(searcher, problem.loss, max_live=CONCURRENT)
    master.start()
    while master.result.batches <= budget and master.step():
        pass
    return Run(math.inf, master.result.batches, master.result.trace, truths).capped(budget)


def _optuna_params(trial: Any, space: Mapping[str, HParam]) -> dict[str, Any]:
    """`space` drawn by an Optuna trial (a log type over its exponent, as `name_exp`)."""
    hparams: dict[str, Any] = {}
    for name, hp in space.items():
        if isinstance(hp, Const):
            hparams[name] = hp.val
        elif isinstance(hp, Log):
            hparams[name] = hp.base ** trial.suggest_float(f"{name}_exp", hp.minval, hp.maxval)
        elif isinstance(hp, Int):
            hparams[name] = trial.suggest_int(name, hp.minval, hp.maxval)
        elif isinstance(hp, Double):
            hparams[name] = trial.suggest_float(name, hp.minval, hp.maxval)
        elif isinstance(hp, Categorical):
            hparams[name] = trial.suggest_categorical(name, list(hp.vals))
        else:
            raise TypeError(f"{name}: no Optuna distribution for {type(hp).__name__}")
    return hparams


def run_optuna(
    seed: int,
    budget: int,
    problem: Problem = PROBLEMS[0],
    kind: str = "sha",
    concurrent: int = 1,
) -> Run:
    """Optuna with `concurrent` trials at once (1: trial after trial), each reporting at our
    rung lengths, on the simulated clock of `run_ray` (every running trial trains at once,
    the first to reach its next rung reports first). No trial starts once `budget` batches
    are trained; the running ones finish. `sha`: its SuccessiveHalvingPruner (min_resource
    3, reduction factor 4) and RandomSampler; `hyperband_tpe`: its HyperbandPruner
    (min_resource 3, max_resource 1000, reduction factor 4) and TPESampler, Optuna's
    counterpart of BOHB."""
    import heapq

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    problem, truths = problem.recorded()
    if kind == "sha":
        sampler: Any = optuna.samplers.RandomSampler(seed=seed)
        pruner: Any = optuna.pruners.SuccessiveHalvingPruner(
            min_resource=RUNGS[0], reduction_factor=4
        )
    elif kind == "hyperband_tpe":
        sampler = optuna.samplers.TPESampler(seed=seed)
        pruner = optuna.pruners.HyperbandPruner(
            min_resource=RUNGS[0], max_resource=MAX_LENGTH, reduction_factor=4
        )
    else:
        raise ValueError(f"no Optuna peer {kind!r}")
    # A named study: HyperbandPruner puts a trial in a bracket by a checksum of the study's
    # name and the trial's number, and an unnamed study's name is a fresh uuid, which made
    # the run differ from one run to the next on the same seed.
    study = optuna.create_study(
        study_name=f"search-quality-{kind}-{seed}", sampler=sampler, pruner=pruner
    )
    # (time it reaches its next rung, tie, rung index, trial, its hyperparameters, its noise
    # seed: drawn from the run's seed, as ours and Ray's trials draw theirs)
    queue: list[tuple[int, int, int, Any, dict[str, Any], int]] = []
    rng = random.Random(seed)
    trained = tie = 0
    best = math.inf
    trace: list[tuple[int, float, int]] = []

    def launch(now: int) -> None:
        nonlocal tie
        trial = study.ask()
        tie += 1
        hparams = _optuna_params(trial, problem.space)
        heapq.heappush(queue, (now + RUNGS[0], tie, 0, trial, hparams, rng.randrange(2**31)))

    for _ in range(concurrent):
        launch(0)
    while queue:
        now, _, k, trial, hparams, noise_seed = heapq.heappop(queue)
        length = RUNGS[k]
        value = problem.loss(hparams, length, noise_seed)
        trained += length - (RUNGS[k - 1] if k else 0)
        trace.append((trained, value, length))
        if length == MAX_LENGTH:
            study.tell(trial, value)
            best = min(best, value)
        else:
            trial.report(value, length)
            if not trial.should_prune():
                tie += 1
                later = now + RUNGS[k + 1] - length
                heapq.heappush(queue, (later, tie, k + 1, trial, hparams, noise_seed))
                continue
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        if trained < budget:
            launch(now)
    return Run(best, trained, trace, truths)


def optuna_runs(seeds: list[int]) -> list[Run]:
    """(b) for `seeds`: Optuna at the budget our asha (ASHA_TRIALS trials) used."""
    return [run_optuna(s, run_ours("asha", ASHA_TRIALS, s).batches) for s in seeds]


def tpe_runs(seeds: list[int]) -> tuple[list[Run], list[Run]]:
    """(c): asha with the tpe and with the random sampler, TPE_TRIALS trials, per seed."""
    tpes = [run_ours("asha", TPE_TRIALS, s, sampler="tpe") for s in seeds]
    return tpes, [run_ours("asha", TPE_TRIALS, s) for s in seeds]


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
    # A run with no final result (inf) ranks above every finite difference.
    finite = [abs(d) for d in differences if math.isfinite(d)]
    top = 1.0 + max(finite, default=0.0)
    ranked = [d if math.isfinite(d) else math.copysign(top, d) for d in differences]
    return float(scipy_wilcoxon(ranked).pvalue)


def paired_stats(ours: list[float], theirs: list[float]) -> dict[str, Any]:
    """Per seed, theirs - ours (> 0: ours won): median, seeds won, sign test, Wilcoxon."""
    diffs = [t - o for o, t in zip(ours, theirs, strict=True)]
    p = wilcoxon(diffs)
    return {
        "median_difference": round(median(diffs), 5),
        "won": sum(d > 0 for d in diffs),
        "seeds": len(diffs),
        "sign_p": round(sign_test(diffs), 6),
        "wilcoxon_p": None if p is None else round(p, 6),
    }


def paired(problem: Problem, seeds: list[int]) -> tuple[dict[str, Any], list[Run], list[Run]]:
    """asha + bohb against asha + random on `problem`, paired by seed (and the runs)."""
    bohb = [run_ours("asha", BOHB_TRIALS, s, "bohb", problem) for s in seeds]
    rand = [run_ours("asha", BOHB_TRIALS, s, "random", problem) for s in seeds]
    stats = {
        "median_best": median([b.best for b in bohb]),
        "random_sampler_median_best": median([r.best for r in rand]),
        **paired_stats([b.best for b in bohb], [r.best for r in rand]),
    }
    return stats, rand, bohb


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


# Peers: Ray Tune's ASHA and BOHB on the same simulated curves (module doc, (e)).
# Ray's time attribute: a rung clock whose k-th point (RAY_REDUCTION**k) is our k-th rung.
RAY_REDUCTION = 4
RAY_CLOCK = {RAY_REDUCTION**k: length for k, length in enumerate(RUNGS)}  # 1: 3, ... 256: 1000
RAY_MAX_T = max(RAY_CLOCK)
# Ray Tune's status and decision strings (ray.tune.experiment.Trial, TrialScheduler).
PENDING, RUNNING, PAUSED, TERMINATED = "PENDING", "RUNNING", "PAUSED", "TERMINATED"
CONTINUE, PAUSE, STOP = "CONTINUE", "PAUSE", "STOP"


def ray_plan() -> dict[str, Any]:
    """The schedulers' settings, and the rungs they imply by Ray's own formulas."""
    grace, rf, max_t = 1, RAY_REDUCTION, RAY_MAX_T
    # AsyncHyperBandScheduler's _Bracket(min_t=grace, max_t, rf, s=0)
    asha_rungs = [grace * rf**k for k in range(int(math.log(max_t / grace) / math.log(rf) + 1))]
    # HyperBandScheduler: s_max + 1 brackets, bracket s starts at int(max_t * rf**-s)
    s_max_1 = round(math.log(max_t) / math.log(rf)) + 1
    hb_r0 = [int(max_t * rf ** (-s)) for s in reversed(range(s_max_1))]
    return {
        "time_attr": "rung",
        "asha": {"max_t": max_t, "grace_period": grace, "reduction_factor": rf},
        "hyperband": {"max_t": max_t, "reduction_factor": rf},
        "asha_rungs_batches": [RAY_CLOCK[t] for t in asha_rungs],
        "hyperband_r0_batches": [RAY_CLOCK[t] for t in hb_r0],
    }


def ray_space(space: Mapping[str, HParam]) -> tuple[dict[str, tuple[Any, ...]], dict[str, Any]]:
    """Our search space as Ray Tune domains, (kind, args) per name, and the constants."""
    searched: dict[str, tuple[Any, ...]] = {}
    constants: dict[str, Any] = {}
    for name, hp in space.items():
        if isinstance(hp, Const):
            constants[name] = hp.val
        elif isinstance(hp, Log):
            searched[name] = ("loguniform", hp.base**hp.minval, hp.base**hp.maxval)
        elif isinstance(hp, Int):
            searched[name] = ("randint", hp.minval, hp.maxval + 1)  # Ray's upper is exclusive
        elif isinstance(hp, Double):
            searched[name] = ("uniform", hp.minval, hp.maxval)
        elif isinstance(hp, Categorical):
            searched[name] = ("choice", list(hp.vals))
        else:
            raise TypeError(f"{name}: no Ray Tune domain for {type(hp).__name__}")
    return searched, constants


def _plain(value: Any) -> Any:
    """numpy scalars (ConfigSpace's draws) as Python ones."""
    return value.item() if hasattr(value, "item") else value


@dataclass(eq=False)
class _RayTrial:
    """The parts of ray.tune.experiment.Trial that Ray's schedulers read."""

    trial_id: str
    hparams: dict[str, Any]
    seed: int
    status: str = PENDING
    is_saving: bool = False
    rung: int = -1  # index into RUNGS of its last result
    batches: int = 0
    last_result: dict[str, Any] | None = None
    generation: int = 0  # invalidates its queued event when it pauses or stops

    def __hash__(self) -> int:
        return hash(self.trial_id)


class _RaySearcher:
    """Ray Tune's random search for ASHA: its domains' own samplers, one numpy stream."""

    def __init__(self, domains: Mapping[str, Any], seed: int) -> None:
        import numpy as np

        self.domains = domains
        self.rng = np.random.RandomState(seed)

    def suggest(self, trial_id: str) -> dict[str, Any]:
        return {k: d.sample(random_state=self.rng) for k, d in self.domains.items()}

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        pass

    def on_trial_complete(self, trial_id: str, result: Any = None, error: bool = False) -> None:
        pass

    def on_pause(self, trial_id: str) -> None:
        pass

    def on_unpause(self, trial_id: str) -> None:
        pass


class _RayController:
    """Ray Tune's TuneController as its schedulers see it, on the simulated clock."""

    def __init__(self, scheduler: Any, searcher: Any) -> None:
        self.scheduler = scheduler
        self.searcher = searcher
        self.search_alg = self  # schedulers call tune_controller.search_alg.searcher
        self.trials: list[_RayTrial] = []

    def get_trials(self) -> list[_RayTrial]:
        return self.trials

    def stop_trial(self, trial: _RayTrial) -> None:
        # TuneController.stop_trial
        if trial.status == TERMINATED:
            return
        if trial.status in (PENDING, PAUSED):
            self.scheduler.on_trial_remove(self, trial)
            self.searcher.on_trial_complete(trial.trial_id)
        else:
            self.scheduler.on_trial_complete(self, trial, trial.last_result)
            self.searcher.on_trial_complete(trial.trial_id, result=trial.last_result)
        trial.status = TERMINATED
        trial.generation += 1


def run_ray(
    scheduler: Any,
    searcher: Any,
    problem: Problem,
    seed: int,
    budget: int,
    constants: Mapping[str, Any] | None = None,
) -> Run:
    """Drive Ray Tune's `scheduler` and `searcher` until `budget` batches are trained.

    CONCURRENT trials run at once; the trial whose next rung ends first reports first.
    Each report goes to the scheduler, then (unless it stops the trial) to the searcher,
    as TuneController._process_trial_result does; STOP ends the trial, PAUSE frees its
    slot, and free slots go to scheduler.choose_trial_to_run(), or to a new trial from
    searcher.suggest() when it has none to run."""
    import heapq

    problem, truths = problem.recorded()
    rng = random.Random(seed)
    ctrl = _RayController(scheduler, searcher)
    queue: list[tuple[int, int, int, _RayTrial]] = []  # (time done, tie, generation, trial)
    tie = 0
    now = trained = 0
    best = math.inf
    trace: list[tuple[int, float, int]] = []

    def start(trial: _RayTrial) -> None:
        nonlocal tie
        trial.status = RUNNING
        tie += 1
        done = now + RUNGS[trial.rung + 1] - trial.batches
        heapq.heappush(queue, (done, tie, trial.generation, trial))

    def running() -> int:
        return sum(t.status == RUNNING for t in ctrl.trials)

    def fill() -> None:
        while running() < CONCURRENT:
            trial = scheduler.choose_trial_to_run(ctrl)
            if trial is None:
                trial_id = f"{seed}_{len(ctrl.trials):05d}"
                config = searcher.suggest(trial_id)
                if config is None:
                    return
                hparams = {**(constants or {}), **{k: _plain(v) for k, v in config.items()}}
                new = _RayTrial(trial_id, hparams, rng.randrange(2**31))
                ctrl.trials.append(new)
                scheduler.on_trial_add(ctrl, new)
                trial = scheduler.choose_trial_to_run(ctrl)
                if trial is None:
                    return
            start(trial)

    fill()
    while queue and trained < budget:
        now, _, generation, trial = heapq.heappop(queue)
        if generation != trial.generation or trial.status != RUNNING:
            continue
        trial.rung += 1
        length = RUNGS[trial.rung]
        trained += length - trial.batches
        trial.batches = length
        value = problem.loss(trial.hparams, length, trial.seed)
        trace.append((trained, value, length))
        if length == MAX_LENGTH:
            best = min(best, value)
        result = {"loss": value, "rung": RAY_REDUCTION**trial.rung, "batches": length}
        result["training_iteration"] = trial.rung + 1
        decision = scheduler.on_trial_result(ctrl, trial, result)
        if decision != STOP:
            searcher.on_trial_result(trial.trial_id, result)
        trial.last_result = result
        if decision == STOP or length == MAX_LENGTH:
            ctrl.stop_trial(trial)
        elif decision == PAUSE:
            trial.status = PAUSED
            trial.generation += 1
        else:
            start(trial)
        fill()
    return Run(best, trained, trace, truths)


def ray_peers(
    problem: Problem,
    seeds: list[int],
    budget: int,
    which: Collection[str] = ("asha", "bohb"),
    bohb_seeds: int | None = None,
) -> dict[str, list[Run]] | str:
    """Ray Tune's ASHA and BOHB (those of them in `which`) on `problem`, seed by seed, each
    `Run.capped` at `budget` batches, BOHB on the first `bohb_seeds` seeds only (None: all;
    HpBandSter takes about 20 s a seed); a line saying why not when Ray Tune (or, for BOHB,
    HpBandSter and ConfigSpace) is missing."""
    import logging
    import warnings

    try:
        import numpy as np
        from ray import tune
        from ray.tune.schedulers import ASHAScheduler, HyperBandForBOHB
        from ray.tune.search.bohb import TuneBOHB
    except ImportError as e:
        return f"(e) Ray peers skipped: {e.msg}; install them with pip install -e '.[bench-peers]'"
    logging.getLogger("ray").setLevel(logging.ERROR)
    logging.getLogger("hpbandster").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="hpbandster|ConfigSpace|statsmodels|ray")
    warnings.filterwarnings("ignore", category=FutureWarning)  # pandas, called by HpBandSter
    plan = ray_plan()
    searched, constants = ray_space(problem.space)
    domains = {name: getattr(tune, kind)(*args) for name, (kind, *args) in searched.items()}
    runs: dict[str, list[Run]] = {f"ray_{kind}": [] for kind in which}
    for seed in seeds:
        if "asha" in which:
            np.random.seed(seed)  # ASHA draws its bracket from numpy's global stream
            asha = ASHAScheduler(
                time_attr=plan["time_attr"], metric="loss", mode="min", **plan["asha"]
            )
            run = run_ray(asha, _RaySearcher(domains, seed), problem, seed, budget, constants)
            runs["ray_asha"].append(run.capped(budget))
        if "bohb" in which and (bohb_seeds is None or len(runs["ray_bohb"]) < bohb_seeds):
            hb = HyperBandForBOHB(
                time_attr=plan["time_attr"], metric="loss", mode="min", **plan["hyperband"]
            )
            bohb = TuneBOHB(
                space=TuneBOHB.convert_search_space(domains),
                metric="loss",
                mode="min",
                seed=seed,
                max_concurrent=CONCURRENT,
            )
            np.random.seed(seed)  # HpBandSter's kernel densities draw from numpy's global stream
            run = run_ray(hb, bohb, problem, seed, budget, constants)
            runs["ray_bohb"].append(run.capped(budget))
    return runs


# (e)'s methods: ours first, then the peers; the ASHA-type ones (random proposals) must do at
# least as well as our asha, and every peer worse than our asha + bohb.
OURS = {"asha": "our asha", "asha_bohb": "our asha + bohb"}
PEERS = {
    "optuna_sha": "Optuna SuccessiveHalvingPruner + RandomSampler",
    "optuna_hyperband_tpe": "Optuna HyperbandPruner + TPESampler",
    "ray_asha": "Ray ASHA",
    "ray_bohb": "Ray BOHB",
}
ASHA_TYPE = ("optuna_sha", "ray_asha")


def budget_used(runs: list[Run]) -> dict[str, float]:
    used = [float(r.batches) for r in runs]
    return {"median": median(used), "min": min(used), "max": max(used)}


def equal_budget(
    problem: Problem,
    seeds: list[int],
    budget: int,
    peers: Collection[str] = tuple(PEERS),
    ray_bohb_seeds: int | None = None,
) -> tuple[dict[str, Any], str | None]:
    """(e) on `problem`: our two and the `peers` (names of PEERS), every method at most
    `budget` batches (all trials together) per seed, on the same seeds; per method its
    median best final loss and the budget it used, and per peer, paired by seed, peer's
    best - ours against each of ours (> 0: ours won). Also the line saying why the Ray
    peers were skipped, or None."""
    runs: dict[str, list[Run]] = {
        "asha": [run_ours_capped("random", problem, s, budget) for s in seeds],
        "asha_bohb": [run_ours_capped("bohb", problem, s, budget) for s in seeds],
    }
    optuna_kinds = [p.removeprefix("optuna_") for p in peers if p.startswith("optuna_")]
    try:
        import optuna  # noqa: F401
    except ImportError:
        optuna_kinds = []
    for kind in optuna_kinds:
        runs[f"optuna_{kind}"] = [
            run_optuna(s, budget, problem, kind, CONCURRENT).capped(budget) for s in seeds
        ]
    ray_kinds = [p.removeprefix("ray_") for p in peers if p.startswith("ray_")]
    ray = ray_peers(problem, seeds, budget, ray_kinds, ray_bohb_seeds) if ray_kinds else {}
    if not isinstance(ray, str):
        runs.update(ray)
    row: dict[str, Any] = {"seeds": len(seeds), "budget": budget}
    for name, method_runs in runs.items():
        bests = [r.best for r in method_runs]
        row[name] = {
            "median_best": median(bests),
            "median_chosen_true": median([r.chosen_truth() for r in method_runs]),
            "full_length_results": median(
                [float(sum(n == MAX_LENGTH for _, _, n in r.trace)) for r in method_runs]
            ),
            "budget_used": budget_used(method_runs),
            "trials": median([float(r.trials()) for r in method_runs]),
            "no_final_result": sum(not math.isfinite(b) for b in bests),
        }
    # vs_*: by the best full-length result; true_vs_*: by the noise-free loss of the
    # trial each would hand over (`Run.chosen_truth`), paired the same way.
    scores: dict[str, Callable[[Run], float]] = {"": lambda r: r.best, "true_": Run.chosen_truth}
    for prefix, score in scores.items():
        ours = {name: [score(r) for r in runs[name]] for name in OURS}
        row["asha_bohb"][f"{prefix}vs_asha"] = paired_stats(ours["asha_bohb"], ours["asha"])
        for name in runs.keys() - OURS.keys():
            theirs = [score(r) for r in runs[name]]
            n = len(theirs)  # the first n seeds (Ray's BOHB may run fewer)
            row[name][f"{prefix}vs_asha"] = paired_stats(ours["asha"][:n], theirs)
            row[name][f"{prefix}vs_asha_bohb"] = paired_stats(ours["asha_bohb"][:n], theirs)
    return row, ray if isinstance(ray, str) else None


def equal_budget_passed(row: Mapping[str, Any]) -> bool:
    """Our asha at least as good as each ASHA-type peer, our asha + bohb better than every
    peer (median difference > 0, Wilcoxon p < P_TARGET)."""
    peers = [name for name in PEERS if name in row]
    return all(
        row[name]["vs_asha"]["median_difference"] >= 0 for name in peers if name in ASHA_TYPE
    ) and all(_met_better(row[name]["vs_asha_bohb"]) for name in peers)


def _met_better(stats: Mapping[str, Any]) -> bool:
    p = stats["sign_p"] if stats["wilcoxon_p"] is None else stats["wilcoxon_p"]
    return bool(stats["median_difference"] > 0 and p < P_TARGET)


def _paired_line(stats: Mapping[str, Any], who: str) -> str:
    return (
        f"median {stats['median_difference']:+.4f}, {who} won {stats['won']}/{stats['seeds']}, "
        f"sign test p={stats['sign_p']:.2g}, Wilcoxon p={stats['wilcoxon_p'] or math.nan:.2g}"
    )


def peer_rows(
    seeds: list[int],
    which: Collection[str] = tuple(PEERS),
    ray_bohb_seeds: int | None = RAY_BOHB_SEEDS,
) -> dict[str, Any]:
    """(e) on both problems for `seeds`, against the peers named in `which` (Ray's BOHB on
    the first `ray_bohb_seeds` of them), printed as it goes; its part of the JSON. The
    targets are today's problem's, the one the peers were asked for; `hard`'s verdict is
    reported beside them."""
    t_peers = time.perf_counter()
    peers: dict[str, Any] = {"budget": PEER_BUDGET, "peers": sorted(which)}
    ray_skipped: str | None = None
    for problem in PROBLEMS:
        row, ray_skipped = equal_budget(problem, seeds, PEER_BUDGET, which, ray_bohb_seeds)
        peers[problem.name] = row
        print(
            f"(e) {problem.name}, seeds {seeds[0]} to {seeds[-1]}, at most "
            f"{PEER_BUDGET:,} batches each (median used, least-most; median trials):"
        )
        for name, label in {**OURS, **PEERS}.items():
            if name not in row:
                continue
            r, used = row[name], row[name]["budget_used"]
            print(
                f"    {label}: median best {r['median_best']:.4f}, noise-free loss of the "
                f"trial it picks {r['median_chosen_true']:.4f}, used {used['median']:,.0f} "
                f"({used['min']:,.0f}-{used['max']:,.0f}), {r['trials']:.0f} trials, "
                f"{r['full_length_results']:.1f} full-length results"
                + (
                    f", no full-length result in {r['no_final_result']}"
                    if r["no_final_result"]
                    else ""
                )
            )
            for prefix, what in (("", "best"), ("true_", "noise-free")):
                for vs, ours_label in (("vs_asha", "asha"), ("vs_asha_bohb", "asha + bohb")):
                    if prefix + vs in r and name != "asha_bohb":
                        print(
                            f"      {what}: it - our {ours_label}: "
                            + _paired_line(r[prefix + vs], "ours")
                        )
                if name == "asha_bohb":
                    print(
                        f"      {what}: our asha - it: " + _paired_line(r[prefix + "vs_asha"], "it")
                    )
    if ray_skipped:
        print(ray_skipped)
        peers["ray_skipped"] = ray_skipped
    passed = equal_budget_passed(peers[PROBLEMS[0].name])
    hard = equal_budget_passed(peers[PROBLEMS[1].name])
    peers["passed"], peers["hard_passed"] = passed, hard
    peers["seconds"] = round(time.perf_counter() - t_peers, 1)
    print(
        f"(e) targets (our asha >= each ASHA-type peer; our asha + bohb better than every "
        f"peer, by the best full-length result) on {PROBLEMS[0].name}: "
        f"{'met' if passed else 'not met'}; the same on {PROBLEMS[1].name} (reported): "
        f"{'met' if hard else 'not met'}"
    )
    return peers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer seeds, no (e) (< 1 min)")
    parser.add_argument(
        "--seeds", type=int, default=None, help="seeds for every row (default 20; --quick: fewer)"
    )
    parser.add_argument(
        "--first-seed", type=int, default=0, help="the first seed of every row (default 0)"
    )
    parser.add_argument(
        "--only-e", action="store_true", help="row (e) alone: equal budget, with the peers"
    )
    parser.add_argument(
        "--ray-bohb-seeds",
        type=int,
        default=RAY_BOHB_SEEDS,
        help=f"Ray's BOHB in (e) on the first N seeds only (default {RAY_BOHB_SEEDS}; "
        "about 20 s a seed and problem)",
    )
    parser.add_argument(
        "--peers",
        default=",".join(PEERS),
        help=f"(e)'s peers, comma-separated (default all: {','.join(PEERS)}); Ray's BOHB "
        "takes about 20 s a seed and problem, the others about 1 s",
    )
    args = parser.parse_args(argv)
    which = [p for p in args.peers.split(",") if p]
    if unknown := sorted(set(which) - PEERS.keys()):
        parser.error(f"no peer {', '.join(unknown)}; the peers are {', '.join(PEERS)}")
    counts = QUICK_SEEDS if args.quick else FULL_SEEDS
    first = args.first_seed
    seeds = {row: list(range(first, first + (args.seeds or n))) for row, n in counts.items()}
    t0 = time.perf_counter()
    if args.only_e:
        only_e = peer_rows(seeds["e"], which, args.ray_bohb_seeds)
        elapsed = time.perf_counter() - t0
        print(f"passed={only_e['passed']} in {elapsed:.1f} s")
        only = {"benchmark": "search_quality", "only": "e", "peers": only_e}
        print(json.dumps(_finite({**only, "seconds": round(elapsed, 1)}), allow_nan=False))
        return 0
    # (c) is the slowest row in CPU: it runs in a second process while this one does the
    # others (the machine has 2 cores), and prints after them.
    # The second process takes (c), the slowest row, and in --quick the last QUICK_B_AWAY of
    # (b)'s seeds too (with their asha runs of (a)), so that both take about as long.
    worker = ProcessPoolExecutor(max_workers=1)
    away = seeds["b"][len(seeds["b"]) - QUICK_B_AWAY :] if args.quick else []
    optuna_away = worker.submit(optuna_runs, away)
    tpe_row = worker.submit(tpe_runs, seeds["c"])

    randoms = [run_random_baseline(s) for s in seeds["a"]]
    target = median([r.best for r in randoms])
    random_budget = RANDOM_TRIALS * MAX_LENGTH
    ashas = [run_ours("asha", ASHA_TRIALS, s) for s in seeds["a"]]
    costs = [a.cost_to_reach(target) for a in ashas]
    asha_cost = median(costs)
    ratio = random_budget / asha_cost if asha_cost > 0 else 0.0
    print(
        f"(a) random search, {RANDOM_TRIALS} trials x {MAX_LENGTH} batches = {random_budget:,}: "
        f"median best final loss {target:.4f}"
    )
    print(
        f"    ASHA reaches it after a median {asha_cost:,.0f} batches "
        f"(reached in {sum(math.isfinite(c) for c in costs)}/{len(costs)} seeds): "
        f"{ratio:.1f}x less (target >= {RATIO_TARGET})"
    )

    ashas_b = [a for s, a in zip(seeds["a"], ashas, strict=True) if s in seeds["b"]]
    optunas = [
        run_optuna(s, a.batches) for s, a in zip(seeds["b"], ashas_b, strict=True) if s not in away
    ] + optuna_away.result()
    ours_best, optuna_best = median([a.best for a in ashas_b]), median([o.best for o in optunas])
    print(
        f"(b) same budget (median {median([float(a.batches) for a in ashas_b]):,.0f} batches, "
        f"{len(optunas)} seeds): our asha median best {ours_best:.4f}, Optuna "
        f"SuccessiveHalvingPruner + RandomSampler {optuna_best:.4f} (ours must be <=)"
    )

    bohb_seeds = seeds["d"]
    pairs = {p.name: paired(p, bohb_seeds) for p in PROBLEMS}
    bohb = {name: stats for name, (stats, _, _) in pairs.items()}
    bohb_passed = all(_met_better(b) for b in bohb.values())
    for name, b in bohb.items():
        print(
            f"(d) {name}: asha + bohb median best {b['median_best']:.4f}, asha + random "
            f"{b['random_sampler_median_best']:.4f}; per seed random - bohb: "
            + _paired_line(b, "bohb")
        )
    peers: dict[str, Any] = {}
    peers_passed: bool | None = None
    if args.quick:
        peers = {"skipped": "(e) equal budget and peers are left out of --quick"}
        print(peers["skipped"])
    else:
        peers = peer_rows(seeds["e"], which, args.ray_bohb_seeds)
        peers_passed = peers["passed"]

    tpes, smalls = tpe_row.result()
    worker.shutdown()
    tpe_best, small_best = median([t.best for t in tpes]), median([r.best for r in smalls])
    print(
        f"(c) {TPE_TRIALS} trials, {len(tpes)} seeds: asha + tpe median best {tpe_best:.4f}, "
        f"asha + random {small_best:.4f}"
    )
    # Timed once the worker is done. --quick times 1,000 results only: filling 10,000
    # takes seconds.
    repeats = 5 if args.quick else 20
    sizes = (1_000,) if args.quick else (1_000, 10_000)
    costs_ms = {str(n): proposal_cost(n, repeats) for n in sizes}
    print(
        "(d) bohb cost per proposal (ms, hard space; model cached / just refitted): "
        + ", ".join(f"{n} results {c['cached_ms']} / {c['refit_ms']}" for n, c in costs_ms.items())
    )

    elapsed = time.perf_counter() - t0
    out = {
        "benchmark": "search_quality",
        "ratio": round(ratio, 3),
        "target": RATIO_TARGET,
        "passed": ratio >= RATIO_TARGET
        and ours_best <= optuna_best
        and bohb_passed
        and peers_passed is not False,
        "seeds": len(seeds["a"]),
        "quick": bool(args.quick),
        "random": {"trials": RANDOM_TRIALS, "budget": random_budget, "median_best": target},
        "asha": {
            "trials": ASHA_TRIALS,
            "concurrent": CONCURRENT,
            "median_cost_to_target": asha_cost,
            "median_budget": median([float(a.batches) for a in ashas]),
            "median_best": median([a.best for a in ashas]),
        },
        "optuna_sha": {
            "seeds": len(optunas),
            "median_best": optuna_best,
            "asha_median_best": ours_best,
            "asha_not_worse": ours_best <= optuna_best,
        },
        "asha_tpe": {
            "trials": TPE_TRIALS,
            "seeds": len(tpes),
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
        "peers": peers,
        "seconds": round(elapsed, 1),
    }
    print(f"passed={out['passed']} in {elapsed:.1f} s")
    print(json.dumps(_finite(out), allow_nan=False))
    return 0


def _finite(value: Any) -> Any:
    """`value` with every infinite or NaN float as None: a run with no full-length result
    has an infinite best loss, which strict JSON cannot hold."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


if __name__ == "__main__":
    sys.exit(main())
