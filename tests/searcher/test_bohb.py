"""The bohb sampler: BOHB's rule (highest rung with enough results, random fraction, random
draws below the threshold), determinism, restarts, and its config options."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Mapping
from statistics import mean
from typing import Any

import pytest

from assay.config import Categorical, Const, Double, HParam, Int, Log, search_spec
from assay.master.searcher import make_searcher
from assay.master.searcher._bohb import BOHBSampler
from assay.master.searcher._samplers import RandomSampler
from assay.master.searcher.simulate import SimulatedMaster

from ._support import SPACE, config, objective
from .test_options import parse

ODD_SPACE: dict[str, HParam] = {
    "i": Int(-3, 3),
    "d": Double(0.5, 0.5),  # a single value: not searched
    "l": Log(1.0, 3.0, 2.0),
    "c": Categorical(({"nested": 1}, [1, 2], None)),  # any YAML value is a choice
    "one": Categorical(("only",)),
    "k": Const("fixed"),
    "g": {"h": {"deep": Int(0, 1)}, "empty": {}},
}
# Searched: i, l, c, g.h.deep -> d = 4, so a rung is modelled once its best 15% hold d + 1 = 5
# results: from ceil(5 / 0.15) = 34 results on.
ODD_MIN_POINTS = 34


def score(point: Mapping[str, Any]) -> float:
    """Smaller is better: i near 2, l near 4, the list choice, deep = 1."""
    c = 0.0 if point["c"] == [1, 2] else 1.0
    return float(
        (point["i"] - 2) ** 2 + (math.log2(point["l"]) - 2) ** 2 + c + 1 - point["g"]["h"]["deep"]
    )


def fed(
    sampler: BOHBSampler,
    count: int,
    length: int = 100,
    start: int = 0,
    value: Any = score,
) -> list[dict[str, Any]]:
    """`count` proposals, each observed at `length` right away."""
    points = []
    for index in range(start, start + count):
        point = sampler.propose(index, f"t{index}")
        sampler.observe(f"t{index}", length, value(point))
        points.append(point)
    return points


def roundtrip(state: dict[str, Any]) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(json.dumps(state, allow_nan=False))
    return loaded


def test_proposals_stay_in_the_space() -> None:
    sampler = BOHBSampler(ODD_SPACE, seed=1, random_fraction=0.0)
    for point in fed(sampler, 60):
        assert isinstance(point["i"], int)
        assert -3 <= point["i"] <= 3
        assert point["d"] == 0.5
        assert 2.0 * (1 - 1e-12) <= point["l"] <= 8.0 * (1 + 1e-12)
        assert point["c"] in ODD_SPACE["c"].vals  # type: ignore[union-attr]
        assert point["one"] == "only"
        assert point["k"] == "fixed"
        assert point["g"]["empty"] == {}
        assert point["g"]["h"]["deep"] in (0, 1)
    assert sum(e["model"] is not None for e in sampler.history.values()) == 60 - ODD_MIN_POINTS


def test_below_the_threshold_it_is_the_random_sampler() -> None:
    bohb = BOHBSampler(ODD_SPACE, seed=7, random_fraction=0.0)
    rnd = RandomSampler(ODD_SPACE, seed=7)
    assert bohb.min_points == ODD_MIN_POINTS
    # Many results, but at rungs none of which has 34: every draw is random search's.
    for index in range(ODD_MIN_POINTS * 3 - 3):
        assert bohb.propose(index, f"t{index}") == rnd.propose(index, f"t{index}")
        bohb.observe(f"t{index}", [10, 40, 160][index % 3], float(index))
    assert all(e["model"] is None for e in bohb.history.values())
    bohb.observe("t0", 40, 1.0)  # the 34th result at length 40
    index = ODD_MIN_POINTS * 3
    bohb.propose(index, f"t{index}")
    assert bohb.history[f"t{index}"]["model"] == 40


def test_the_highest_rung_with_enough_results_is_modelled() -> None:
    sampler = BOHBSampler(ODD_SPACE, seed=3, random_fraction=0.0)
    fed(sampler, 40, length=10)
    fed(sampler, 33, length=40, start=40)  # 33 at 40: still short (floor(0.15 * 33) = 4)
    assert sampler.model_rung() == 10
    fed(sampler, 1, length=40, start=73)
    assert sampler.model_rung() == 40
    sampler.observe("t0", 160, None)  # one result higher up changes nothing
    assert sampler.model_rung() == 40
    sampler.forget("t45")  # a replaced trial's results are dropped
    assert sampler.model_rung() == 10


def test_the_random_fraction_holds() -> None:
    for fraction in (0.0, 1 / 3, 0.8, 1.0):
        sampler = BOHBSampler(ODD_SPACE, seed=11, random_fraction=fraction)
        fed(sampler, ODD_MIN_POINTS)
        points = fed(sampler, 600, start=ODD_MIN_POINTS)
        entries = list(sampler.history.values())[ODD_MIN_POINTS:]
        share = mean(e["model"] is None for e in entries)
        # Binomial(600, p): 4 standard deviations at most (0.077 at p = 1/2)
        assert abs(share - fraction) <= 4 * math.sqrt(fraction * (1 - fraction) / 600), fraction
        rnd = RandomSampler(ODD_SPACE, seed=11)
        for n, (point, entry) in enumerate(zip(points, entries, strict=True)):
            if entry["model"] is None:  # a random draw is random search's draw
                index = ODD_MIN_POINTS + n
                assert point == rnd.propose(index, f"t{index}")


def test_same_history_and_seed_same_proposal() -> None:
    def run(seed: int) -> list[dict[str, Any]]:
        return fed(BOHBSampler(ODD_SPACE, seed=seed, random_fraction=1 / 3), 50)

    first = run(5)
    assert first == run(5)
    assert first[ODD_MIN_POINTS:] != run(6)[ODD_MIN_POINTS:]


def test_restored_sampler_proposes_like_the_original() -> None:
    original = BOHBSampler(ODD_SPACE, seed=2, random_fraction=1 / 3)
    fed(original, 40, length=10)
    fed(original, 37, length=40, start=40)
    original.observe("t3", 40, None)
    original.observe("t4", 160, 0.5)
    original.forget("t5")
    restored = BOHBSampler(ODD_SPACE, seed=2, random_fraction=1 / 3)
    restored.restore(roundtrip(original.snapshot()))
    assert roundtrip(restored.snapshot()) == roundtrip(original.snapshot())
    # The original's model is cached, the restored one refits: the same proposals.
    for index in range(77, 100):
        assert restored.propose(index, f"t{index}") == original.propose(index, f"t{index}")
        value = float(index % 7)
        restored.observe(f"t{index}", 40, value)
        original.observe(f"t{index}", 40, value)
    assert any(original.history[f"t{i}"]["model"] == 40 for i in range(77, 100))


def test_a_snapshot_of_another_space_is_refused() -> None:
    sampler = BOHBSampler(ODD_SPACE, seed=2, random_fraction=0.5)
    fed(sampler, 3)
    other = BOHBSampler({"x": Double(0.0, 1.0)}, seed=2, random_fraction=0.5)
    with pytest.raises(ValueError, match="the snapshot's bohb points have 4 dimensions"):
        other.restore(roundtrip(sampler.snapshot()))


def test_the_model_is_cached_until_its_rung_gets_a_result() -> None:
    sampler = BOHBSampler(ODD_SPACE, seed=4, random_fraction=0.0)
    fed(sampler, 40, length=10)
    sampler.propose(40, "t40")
    model = sampler._models[10]
    sampler.propose(41, "t41")
    assert sampler._models[10] is model  # no new result: no refit
    sampler.observe("t40", 40, 1.0)  # another rung's result
    assert sampler._models[10] is model
    sampler.observe("t41", 10, 1.0)
    assert 10 not in sampler._models


def test_results_that_are_not_finite_rank_worst() -> None:
    # Half the space (x > 0.5) never gives a finite result: the model avoids it.
    sampler = BOHBSampler({"x": Double(0.0, 1.0)}, seed=0, random_fraction=0.0)
    points = fed(sampler, 200, value=lambda p: None if p["x"] > 0.5 else 1.0 - p["x"])
    modelled = [p["x"] for p in points[40:]]
    assert mean(x > 0.5 for x in modelled) < 0.1
    assert mean(modelled) > 0.3  # and it is drawn toward the best finite results


def test_bohb_in_asha_learns_where_random_sampling_does_not() -> None:
    def best_finals(sampler: str) -> list[float]:
        finals = []
        for seed in range(3):
            cfg = config(
                "asha", max_length=256, max_trials=128, max_concurrent_trials=4, sampler=sampler
            )
            result = SimulatedMaster(make_searcher(cfg, SPACE, seed), objective, max_live=4).run()
            finals.append(min(v for _, v, n in result.trace if n == 256))
        return finals

    # The best possible final loss is 0.1 + 2 / 16 = 0.225.
    bohb, rnd = best_finals("bohb"), best_finals("random")
    assert mean(bohb) < mean(rnd), (bohb, rnd)


def test_config_options() -> None:
    good = {"name": "asha", "max_trials": 16, "sampler": "bohb"}
    assert parse(good) == []
    assert parse({**good, "random_fraction": 0}) == []
    assert parse({**good, "name": "adaptive_asha", "random_fraction": 1}) == []
    assert parse({**good, "name": "random", "random_fraction": 0.25}) == []
    problems = parse({"name": "bayesian", "max_trials": 4, "random_fraction": 0.5})
    assert any("random_fraction: is not a setting of the bayesian searcher" in p for p in problems)
    assert search_spec(config("asha", max_trials=16, sampler="bohb"), SPACE).random_fraction == (
        1 / 3
    )
    spec = search_spec(config("asha", max_trials=16, sampler="bohb", random_fraction=0), SPACE)
    assert spec.random_fraction == 0.0
    assert spec.sampler == "bohb"


def test_existing_samplers_keep_their_meaning() -> None:
    assert search_spec(config("asha", max_trials=16), SPACE).sampler == "random"
    assert search_spec(config("asha", max_trials=16, sampler="tpe"), SPACE).sampler == "tpe"
    assert search_spec(config("bayesian", max_trials=16), SPACE).sampler == "tpe"


def test_a_bohb_search_needs_neither_scipy_nor_optuna() -> None:
    code = (
        "import sys\n"
        "from assay.config import Length, SearcherConfig, Double\n"
        "from assay.master.searcher import make_searcher\n"
        "from assay.master.searcher.simulate import SimulatedMaster\n"
        "cfg = SearcherConfig('asha', 'loss', Length.batches(64), max_trials=40,\n"
        "                     options={'sampler': 'bohb', 'divisor': 2})\n"
        "s = make_searcher(cfg, {'x': Double(0, 1)}, 0)\n"
        "SimulatedMaster(s, lambda h, n, seed: (h['x'] - 0.3) ** 2 + 1 / n).run()\n"
        "assert any(e['model'] for e in s._sampler.history.values())\n"
        "assert 'scipy' not in sys.modules and 'optuna' not in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
