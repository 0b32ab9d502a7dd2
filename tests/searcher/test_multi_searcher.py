"""Multi-objective search: Pareto ranks as a pure function, the searcher fed metric
vectors, and restart safety of the multi-objective TPE sampler as a property."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from assay.config import Objective, SearcherConfig
from assay.master.searcher import Create, Searcher, make_searcher, restore_searcher
from assay.master.searcher._multi import dominates, orient, pareto_front, pareto_ranks
from assay.master.searcher._searcher import HalvingSearcher

from ._support import SPACE, config, objective
from .test_restore import Master, call, roundtrip

NAN = math.nan
TWO = (Objective("loss"), Objective("accuracy", smaller_is_better=False))


def multi(name: str, **options: Any) -> SearcherConfig:
    return dataclasses.replace(config(name, **options), objectives=TWO)


def halving(cfg: SearcherConfig, space: Any = SPACE, seed: int = 0) -> HalvingSearcher:
    searcher = make_searcher(cfg, space, seed)
    assert isinstance(searcher, HalvingSearcher)
    return searcher


# --- the Pareto front ----------------------------------------------------------------------


def test_dominated_points_are_not_on_the_front() -> None:
    points = [[1.0, 5.0], [2.0, 2.0], [5.0, 1.0], [3.0, 3.0], [6.0, 6.0]]
    assert pareto_front(points) == [0, 1, 2]
    assert pareto_ranks(points) == [0, 0, 0, 1, 2]


def test_ties_share_a_rank() -> None:
    points = [[1.0, 1.0], [1.0, 1.0], [1.0, 2.0]]
    assert pareto_front(points) == [0, 1]
    assert pareto_ranks(points) == [0, 0, 1]
    assert not dominates([1.0, 1.0], [1.0, 1.0])


def test_nan_ranks_last_and_is_never_on_the_front() -> None:
    points = [[NAN, 0.0], [9.0, 9.0], [0.0, 0.0], [math.inf, 0.0]]
    assert pareto_front(points) == [2]
    assert pareto_ranks(points) == [2, 1, 0, 2]
    assert pareto_front([[NAN, NAN]]) == []
    assert pareto_front([]) == []


def test_orient_flips_larger_is_better_metrics() -> None:
    assert orient([1.0, 0.9, None], [True, False, True]) == pytest.approx(
        [1.0, -0.9, NAN], nan_ok=True
    )


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.lists(
            st.sampled_from([0.0, 1.0, 2.0, NAN]) | st.floats(-10, 10), min_size=2, max_size=2
        ),
        max_size=12,
    )
)
def test_front_is_exactly_the_non_dominated_complete_points(points: list[list[float]]) -> None:
    front = set(pareto_front(points))
    complete = [i for i, p in enumerate(points) if all(math.isfinite(x) for x in p)]
    for i in complete:
        dominated = any(dominates(points[j], points[i]) for j in complete)
        assert (i in front) == (not dominated)
    ranks = pareto_ranks(points)
    for i in complete:  # a point is ranked after every point that dominates it
        for j in complete:
            if dominates(points[j], points[i]):
                assert ranks[j] < ranks[i]
    assert all(
        ranks[i] > max((ranks[j] for j in complete), default=-1)
        for i in set(range(len(points))) - set(complete)
    )


# --- the searcher --------------------------------------------------------------------------


def vector(hparams: dict[str, Any], length: int, seed: int) -> list[float]:
    """Two conflicting objectives: the synthetic loss, and an "accuracy" that rises with
    the learning rate (so a small loss and a large accuracy pull lr apart)."""
    return [objective(hparams, length, seed), math.log10(hparams["lr"])]


def run(cfg: SearcherConfig, seed: int) -> list[tuple[dict[str, Any], list[float]]]:
    searcher = halving(cfg, SPACE, seed)
    master = Master()
    hparams: dict[str, dict[str, Any]] = {}
    results = []

    def apply(ops: list[Any]) -> None:
        for op in ops:
            if isinstance(op, Create):
                hparams[op.request_id] = op.hparams
        master.apply(ops)

    apply(searcher.initial_operations())
    while master.live or master.closing:
        if master.closing:
            apply(searcher.on_trial_closed(master.closing.pop(0)))
            continue
        rid, length = next(iter(master.live.items()))
        del master.live[rid]
        master.paused.append(rid)
        values = vector(hparams[rid], length, int(rid[1:]))
        results.append((hparams[rid], values))
        apply(searcher.on_validation_completed(rid, values, length))
    assert master.shutdown == 1
    return results


@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_random_and_tpe_searches_run_every_trial_on_vectors(sampler: str) -> None:
    results = run(multi("random", max_trials=12, max_concurrent_trials=2, sampler=sampler), 3)
    assert len(results) == 12


def test_grid_search_runs_every_point_on_vectors() -> None:
    small = {"lr": SPACE["lr"], "optimizer": SPACE["optimizer"]}
    searcher = make_searcher(multi("grid", max_concurrent_trials=4), small, 1)
    ops = searcher.initial_operations()
    assert sum(isinstance(op, Create) for op in ops) == 4


def test_tpe_learns_from_the_vectors() -> None:
    """The sampler's history holds each trial's oriented vector."""
    cfg = multi("random", max_trials=6, max_concurrent_trials=1, sampler="tpe")
    searcher = halving(cfg)
    ops = searcher.initial_operations()
    rid = next(op.request_id for op in ops if isinstance(op, Create))
    searcher.on_validation_completed(rid, [0.5, 0.9], 1000)
    history = searcher.snapshot()["sampler"]["history"]
    assert history[rid]["value"] == [0.5, -0.9]
    searcher.on_validation_completed("t1", [NAN, 0.9], 1000)  # incomplete: not learnt
    assert searcher.snapshot()["sampler"]["history"]["t1"]["value"] is None


def test_a_vector_of_the_wrong_size_is_refused() -> None:
    searcher = halving(multi("random", max_trials=2))
    searcher.initial_operations()
    with pytest.raises(ValueError, match="a validation of 3 metrics for a search of 2"):
        searcher.on_validation_completed("t0", [1.0, 2.0, 3.0], 1000)


# --- restart safety --------------------------------------------------------------------------

vectors = st.lists(
    st.sampled_from([0.1, 0.5, 1.0]) | st.floats(allow_nan=True, allow_infinity=True) | st.none(),
    min_size=2,
    max_size=2,
)
CASES = {
    "random": multi("random", max_trials=8, max_concurrent_trials=2),
    "tpe": multi("random", max_trials=10, max_concurrent_trials=2, sampler="tpe"),
}


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(CASES)), data=st.data())
def test_restored_multi_objective_searcher_decides_like_the_original(
    name: str, data: st.DataObject
) -> None:
    cfg, steps = CASES[name], 40
    seed = data.draw(st.integers(0, 2**31 - 1), label="seed")
    split = data.draw(st.integers(0, steps), label="split")
    original = make_searcher(cfg, SPACE, seed)
    restored: Searcher | None = None
    master = Master()
    for step in range(steps + 1):
        if step == split:
            restored = restore_searcher(cfg, SPACE, seed, roundtrip(original.snapshot()))
        if step == 0:
            event: tuple[str, tuple[Any, ...]] = ("initial_operations", ())
        elif master.closing and (not master.live or data.draw(st.booleans(), label="close")):
            event = ("on_trial_closed", (master.closing.pop(0),))
        elif master.live:
            live: list[str] = sorted(master.live)
            rid = live[data.draw(st.integers(0, len(live) - 1), label="trial")]
            length = master.live.pop(rid)
            master.paused.append(rid)
            event = ("on_validation_completed", (rid, data.draw(vectors, label="v"), length))
        else:
            break
        ops = call(original, event)
        if restored is not None:
            assert call(restored, event) == ops, event
        master.apply(ops)
    if restored is not None:
        assert roundtrip(restored.snapshot()) == roundtrip(original.snapshot())
