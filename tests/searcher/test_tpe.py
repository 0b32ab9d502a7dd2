"""The tpe sampler: proposals inside the space, learning from results, Optuna kept out of
the snapshot and out of searches that do not use it."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from statistics import mean

from assay.config import Categorical, Const, Double, HParam, Int, Log
from assay.master.searcher import make_searcher
from assay.master.searcher._tpe import TPESampler
from assay.master.searcher.simulate import SimulatedMaster

from ._support import SPACE, config, objective

ODD_SPACE: dict[str, HParam] = {
    "i": Int(-3, 3),
    "d": Double(0.5, 0.5),  # a single value is a valid range
    "l": Log(1.0, 3.0, 2.0),
    "c": Categorical(({"nested": 1}, [1, 2], None)),  # any YAML value is a choice
    "k": Const("fixed"),
    "g": {"h": {"deep": Int(0, 1)}, "empty": {}},
}


def test_proposals_stay_in_the_space_before_and_after_startup() -> None:
    sampler = TPESampler(ODD_SPACE, seed=1)
    for index in range(25):  # TPE leaves its random startup after 10 results
        point = sampler.propose(index, f"t{index}")
        assert isinstance(point["i"], int)
        assert -3 <= point["i"] <= 3
        assert point["d"] == 0.5
        assert 2.0 * (1 - 1e-12) <= point["l"] <= 8.0 * (1 + 1e-12)
        assert point["c"] in ODD_SPACE["c"].vals  # type: ignore[union-attr]
        assert point["k"] == "fixed"
        assert set(point["g"]) == {"h", "empty"}
        assert point["g"]["empty"] == {}
        assert point["g"]["h"]["deep"] in (0, 1)
        sampler.observe(f"t{index}", 10, float(point["i"] ** 2))
    json.dumps(sampler.snapshot(), allow_nan=False)


def test_only_finite_latest_results_are_learnt() -> None:
    sampler = TPESampler({"x": Double(0.0, 1.0)}, seed=0)
    sampler.propose(0, "t0")
    sampler.observe("t0", 100, 0.5)
    sampler.observe("t0", 50, 0.1)  # an older, shorter result does not replace it
    assert sampler.history["t0"]["value"] == 0.5
    sampler.observe("t0", 200, None)  # the longest result was not finite
    assert sampler.history["t0"]["value"] is None
    sampler.forget("t0")
    assert sampler.history == {}


def test_tpe_learns_where_random_search_does_not() -> None:
    def final_losses(sampler: str) -> list[float]:
        cfg = config(
            "random", max_length=100, max_trials=60, max_concurrent_trials=1, sampler=sampler
        )
        result = SimulatedMaster(make_searcher(cfg, SPACE, seed=4), objective).run()
        return [t.metrics[-1] for t in result.trials.values()][30:]

    # The best loss at 100 batches is 0.1 + 2 / 10 = 0.3; what each search loses beyond it
    # over its last 30 trials: TPE's proposals cluster near the optimum (lr 1e-2.5, adam).
    best = 0.3
    tpe, rnd = mean(final_losses("tpe")) - best, mean(final_losses("random")) - best
    assert tpe < 0.3 * rnd, (tpe, rnd)


def test_optuna_is_imported_only_for_tpe() -> None:
    code = (
        "import sys\n"
        "from assay.config import Length, SearcherConfig, Double\n"
        "from assay.master.searcher import make_searcher\n"
        "cfg = SearcherConfig('asha', 'loss', Length.batches(100), max_trials=8)\n"
        "s = make_searcher(cfg, {'x': Double(0, 1)}, 0)\n"
        "s.initial_operations()\n"
        "assert 'optuna' not in sys.modules, 'optuna imported by a random search'\n"
        "cfg = SearcherConfig('bayesian', 'loss', Length.batches(100), max_trials=8)\n"
        "make_searcher(cfg, {'x': Double(0, 1)}, 0).initial_operations()\n"
        "assert 'optuna' in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "ExperimentalWarning" not in done.stderr
    assert "[I " not in done.stderr  # Optuna's INFO lines ("Trial 0 finished ...")


def test_log_parameters_are_searched_in_the_exponent() -> None:
    sampler = TPESampler({"lr": Log(-6.0, -1.0, 10.0)}, seed=3)
    exponents = [math.log10(sampler.propose(i, f"t{i}")["lr"]) for i in range(40)]

    assert all(-6 - 1e-9 <= e <= -1 + 1e-9 for e in exponents)
    assert min(exponents) < -4.5
    assert max(exponents) > -2.5
