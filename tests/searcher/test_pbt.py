"""Population-based training: rounds, exploit and explore, early exits, determinism, and
restart safety (the snapshot/restore properties the other searchers have)."""

from __future__ import annotations

import json
import math
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from assay.config import Categorical, Const, Double, HParam, Int, Log, SearcherConfig, preview
from assay.master.searcher import (
    Close,
    Create,
    PBTSearcher,
    Shutdown,
    ValidateAfter,
    make_searcher,
    restore_searcher,
)
from assay.master.searcher.simulate import SimulatedMaster

from ._support import SPACE, config, objective
from .test_restore import check_restore


def pbt(
    population_size: int = 4,
    num_rounds: int = 3,
    length: int = 10,
    truncate_fraction: float = 0.25,
    resample_probability: float = 0.25,
    perturb_factor: float = 0.2,
    smaller_is_better: bool = True,
) -> SearcherConfig:
    return config(
        "pbt",
        max_length=length,
        smaller_is_better=smaller_is_better,
        population_size=population_size,
        num_rounds=num_rounds,
        replace_function={"truncate_fraction": truncate_fraction},
        explore_function={
            "resample_probability": resample_probability,
            "perturb_factor": perturb_factor,
        },
    )


def searcher(cfg: SearcherConfig, space: Any = SPACE, seed: int = 1) -> PBTSearcher:
    s = make_searcher(cfg, space, seed)
    assert isinstance(s, PBTSearcher)
    return s


def test_the_first_round_creates_the_population_from_scratch() -> None:
    ops = searcher(pbt()).initial_operations()

    creates = [op for op in ops if isinstance(op, Create)]
    assert [c.request_id for c in creates] == ["t0", "t1", "t2", "t3"]
    assert all(c.checkpoint_from is None and c.round == 0 for c in creates)
    assert [op for op in ops if isinstance(op, ValidateAfter)] == [
        ValidateAfter(f"t{i}", 10) for i in range(4)
    ]


def test_a_round_replaces_the_worst_with_perturbed_copies_of_the_best() -> None:
    s = searcher(pbt(population_size=4, truncate_fraction=0.5))
    s.initial_operations()
    metrics = {"t0": 0.3, "t1": 0.1, "t2": 0.9, "t3": 0.2}

    ops: list[Any] = []
    for rid, metric in metrics.items():
        ops = s.on_validation_completed(rid, metric, 10)
        if rid != "t3":
            assert ops == []  # the member waits, paused, for the rest of the round

    assert [op for op in ops if isinstance(op, Close)] == [Close("t0"), Close("t2")]
    creates = [op for op in ops if isinstance(op, Create)]
    assert [c.request_id for c in creates] == ["t4", "t5"]
    assert {c.checkpoint_from for c in creates} <= {"t1", "t3"}  # the best half
    assert all(c.round == 1 for c in creates)
    assert set(op for op in ops if isinstance(op, ValidateAfter)) == {
        ValidateAfter(rid, 20) for rid in ("t1", "t3", "t4", "t5")
    }
    # Every Create comes before any survivor resumes (its parent is still where it paused).
    kinds = [type(op).__name__ for op in ops]
    assert kinds.index("Create") < max(i for i, k in enumerate(kinds) if k == "ValidateAfter")
    assert s.parents == {c.request_id: c.checkpoint_from for c in creates}


def test_larger_is_better_and_metrics_that_are_not_finite_rank_last() -> None:
    s = searcher(pbt(population_size=4, truncate_fraction=0.25, smaller_is_better=False))
    s.initial_operations()
    for rid, metric in (("t0", math.nan), ("t1", 5.0), ("t2", 1.0), ("t3", math.inf)):
        ops = s.on_validation_completed(rid, metric, 10)

    # Ranked t1, t2, then t0 and t3 (not finite, in creation order): t3 is replaced.
    assert [op for op in ops if isinstance(op, Close)] == [Close("t3")]
    (create,) = [op for op in ops if isinstance(op, Create)]
    assert create.checkpoint_from == "t1"


def test_the_last_round_closes_everyone_then_shuts_down() -> None:
    s = searcher(pbt(population_size=2, num_rounds=1, truncate_fraction=0.5))
    s.initial_operations()
    assert s.on_validation_completed("t0", 1.0, 10) == []
    assert s.on_validation_completed("t1", 2.0, 10) == [Close("t0"), Close("t1")]
    assert s.on_trial_closed("t1") == []
    assert s.on_trial_closed("t0") == [Shutdown()]
    assert s.progress() == 1.0


def test_explore_perturbs_within_ranges() -> None:
    space: dict[str, HParam] = {
        "c": Const(7),
        "n": Int(1, 10),
        "x": Double(0.0, 1.0),
        "lr": Log(-4.0, -1.0, 10.0),
        "opt": Categorical(("a", "b", "c")),
    }
    s = searcher(pbt(resample_probability=0.0, perturb_factor=0.5), space)
    rng = random.Random(0)
    parent = {"c": 7, "n": 10, "x": 0.8, "lr": 0.05, "opt": "b"}

    for _ in range(200):
        child = s.explore(parent, rng)
        assert child["c"] == 7
        assert child["n"] in (5, 10)  # 15 clamped to the maximum
        assert child["x"] in (pytest.approx(0.4), 1.0)
        assert child["lr"] in (pytest.approx(0.025), pytest.approx(0.075))
        assert child["opt"] in ("a", "c")


def test_explore_resamples_with_its_probability() -> None:
    space: dict[str, HParam] = {"x": Double(0.0, 1.0)}
    s = searcher(pbt(resample_probability=1.0), space)
    rng = random.Random(3)

    values = {s.explore({"x": 0.5}, rng)["x"] for _ in range(50)}
    assert len(values) == 50  # all drawn afresh, none a multiple of 0.5
    assert all(0.0 <= v <= 1.0 for v in values)


@pytest.mark.parametrize("seed", range(5))
def test_a_simulated_search_keeps_its_population_and_shuts_down(seed: int) -> None:
    cfg = pbt(population_size=6, num_rounds=4, truncate_fraction=0.34)
    sim = SimulatedMaster(searcher(cfg, seed=seed), objective, max_live=6, seed=seed)

    result = sim.run()

    assert result.shutdowns == 1
    assert len(result.trials) == 6 + 3 * 2
    children = [t for rid, t in result.trials.items() if int(rid[1:]) >= 6]
    # A copy continues its parent's batches: its first validation ends a later round.
    assert all(t.lengths[0] > 10 for t in children)
    assert all(
        t.lengths == list(range(t.lengths[0], t.lengths[-1] + 1, 10))
        for t in result.trials.values()
    )
    # Every round ends with the whole population at the round's length.
    for r in range(4):
        assert sum((r + 1) * 10 in t.lengths for t in result.trials.values()) == 6
    assert result.batches == 6 * 4 * 10
    assert preview(cfg, SPACE).total_budget == result.batches
    assert preview(cfg, SPACE).total_trials == len(result.trials)


def test_exploit_improves_on_the_first_round() -> None:
    cfg = pbt(population_size=8, num_rounds=5, truncate_fraction=0.25)
    sim = SimulatedMaster(searcher(cfg, seed=4), objective, order="random", seed=4)
    result = sim.run()

    def floor(hparams: dict[str, Any]) -> float:
        return objective(hparams, 10**9, 0)

    first = sorted(floor(t.hparams) for rid, t in result.trials.items() if int(rid[1:]) < 8)
    last = sorted(floor(t.hparams) for t in result.trials.values() if 50 in t.lengths)
    assert sum(last) / len(last) < sum(first) / len(first)


@pytest.mark.parametrize("seed", range(8))
def test_random_failures_and_any_order_still_end_in_one_shutdown(seed: int) -> None:
    rng = random.Random(seed)

    def exit_policy(rid: str, hparams: Any, length: int) -> Any:
        return (
            rng.choice(["errored", "invalid_hp", "user_canceled"]) if rng.random() < 0.2 else None
        )

    cfg = pbt(population_size=5, num_rounds=4, truncate_fraction=0.4)
    sim = SimulatedMaster(
        searcher(cfg, seed=seed), objective, order="random", exit_policy=exit_policy, seed=seed
    )

    result = sim.run()

    assert result.shutdowns == 1
    assert result.max_live <= 5
    assert all(t.closed or t.exited for t in result.trials.values())


def test_same_seed_same_search() -> None:
    def run(seed: int) -> list[tuple[str, Any, str | None]]:
        result = SimulatedMaster(searcher(pbt(), seed=seed), objective, seed=0).run()
        s = result.trials
        return [(rid, t.hparams, None) for rid, t in s.items()]

    assert run(5) == run(5)
    assert run(5) != run(6)


def test_unknown_and_repeated_events_are_refused() -> None:
    s = searcher(pbt())
    s.initial_operations()
    with pytest.raises(ValueError, match="unknown trial request id 't9'"):
        s.on_validation_completed("t9", 1.0, 10)
    s.on_validation_completed("t0", 1.0, 10)
    with pytest.raises(ValueError, match="validated twice"):
        s.on_validation_completed("t0", 1.0, 10)
    with pytest.raises(ValueError, match="not closed"):
        s.on_trial_closed("t1")
    with pytest.raises(ValueError, match="exit reason"):
        s.on_trial_exited_early("t1", "bored")  # type: ignore[arg-type]


def test_a_snapshot_of_another_searcher_is_refused() -> None:
    asha = make_searcher(config("asha", max_length=64, max_trials=4), SPACE, 1)
    with pytest.raises(ValueError, match="pbt"):
        restore_searcher(pbt(), SPACE, 1, asha.snapshot())


def test_the_snapshot_is_plain_json() -> None:
    s = searcher(pbt())
    s.initial_operations()
    s.on_validation_completed("t0", math.nan, 10)

    state = json.loads(json.dumps(s.snapshot(), allow_nan=False))
    assert restore_searcher(pbt(), SPACE, 1, state).snapshot() == s.snapshot()


PBT_CONFIGS: dict[str, tuple[SearcherConfig, Any]] = {
    "pbt": (pbt(population_size=4, num_rounds=4, truncate_fraction=0.5), SPACE),
    "pbt-larger-is-better": (
        pbt(population_size=5, num_rounds=3, truncate_fraction=0.2, smaller_is_better=False),
        SPACE,
    ),
    "pbt-one-round": (pbt(population_size=3, num_rounds=1, truncate_fraction=0.34), SPACE),
}


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(PBT_CONFIGS)), data=st.data())
def test_restored_pbt_searcher_decides_like_the_original(name: str, data: st.DataObject) -> None:
    check_restore(PBT_CONFIGS[name], data, steps=80)
