"""A search is created as it runs, never whole: bounded concurrency, grid points computed
one at a time, and caps on `max_trials` and `max_concurrent_trials` that the config
parser and `make_searcher` refuse with the rule."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from assay.config import (
    MAX_GRID_POINTS,
    Categorical,
    Const,
    Double,
    HParam,
    Int,
    Log,
    SearcherConfig,
    grid_points,
    search_spec,
)
from assay.config._search import grid_count
from assay.config._searcher_config import (
    DEFAULT_MAX_CONCURRENT_TRIALS,
    MAX_CONCURRENT_TRIALS,
    MAX_TRIALS,
)
from assay.master.searcher import Create, make_searcher
from assay.master.searcher._samplers import GridSampler
from assay.master.searcher.simulate import SimulatedMaster

from ._support import SPACE, config
from .test_options import parse

GRID_80: dict[str, HParam] = {"a": Int(0, 39), "b": Categorical(("x", "y")), "c": Const(1)}


def objective(hparams: Mapping[str, Any], length: int, seed: int) -> float:
    """Any hyperparameters: a loss fixed by them and the seed, falling with length."""
    return random.Random(json.dumps(hparams, sort_keys=True) + str(seed)).random() + 1 / length


def trace(cfg: SearcherConfig, space: Mapping[str, HParam], seed: int, order: Any) -> str:
    """A digest of every operation list the searcher returns in a simulated search."""
    master = SimulatedMaster(make_searcher(cfg, space, seed), objective, order=order, seed=seed)
    digest = hashlib.sha256()
    apply = master.apply

    def recorded(ops: Any) -> None:
        digest.update(repr(ops).encode())
        apply(ops)

    master.apply = recorded  # type: ignore[method-assign]
    master.run()
    return digest.hexdigest()[:16]


# Digests taken with the searchers that created every trial of an unlimited search at
# once: searches that were bounded then must decide exactly as they did (seed 11, events
# in time order, then in random order).
BOUNDED: dict[str, tuple[SearcherConfig, dict[str, HParam], str, str]] = {
    "grid": (
        config("grid", max_concurrent_trials=3),
        GRID_80,
        "0a31a287bd10902f",
        "9bc23af8362bd45b",
    ),
    "random": (
        config("random", max_trials=30, max_concurrent_trials=5),
        SPACE,
        "5b2e9fb135af6d8f",
        "919c179984876d13",
    ),
    "asha-default": (
        config("asha", max_length=1000, max_trials=300),
        SPACE,
        "bb2e6014d47a08d1",
        "a09f80ea6b715d52",
    ),
    "adaptive-default": (
        config("adaptive_asha", max_trials=100),
        SPACE,
        "fac26602069824fc",
        "dc33dc7e4b61ebae",
    ),
    "asha-float": (
        config("asha", max_length=100, max_trials=12, max_concurrent_trials=3, divisor=2.5),
        SPACE,
        "3c41fa9bb112f09d",
        "aa4b8b977e5b6f2e",
    ),
}


@pytest.mark.parametrize("name", sorted(BOUNDED))
def test_bounded_searches_decide_as_before(name: str) -> None:
    cfg, space, by_time, at_random = BOUNDED[name]

    assert trace(cfg, space, 11, "time") == by_time
    assert trace(cfg, space, 11, "random") == at_random


# --- unset concurrency --------------------------------------------------------------------

UNSET: dict[str, tuple[SearcherConfig, dict[str, HParam], int]] = {
    "grid": (config("grid"), GRID_80, 80),
    "random": (config("random", max_trials=60), SPACE, 60),
}


@settings(max_examples=20, deadline=None)
@given(
    name=st.sampled_from(sorted(UNSET)),
    seed=st.integers(0, 2**31 - 1),
    order=st.sampled_from(["time", "random"]),
)
def test_unset_concurrency_creates_trials_as_others_end(name: str, seed: int, order: Any) -> None:
    cfg, space, total = UNSET[name]
    searcher = make_searcher(cfg, space, seed)

    first = [op for op in searcher.initial_operations() if isinstance(op, Create)]
    assert len(first) == DEFAULT_MAX_CONCURRENT_TRIALS
    # A fresh searcher, driven to the end: every trial runs, 16 at most at once.
    master = SimulatedMaster(
        make_searcher(cfg, space, seed),
        objective,
        max_live=DEFAULT_MAX_CONCURRENT_TRIALS,
        order=order,
        seed=seed,
    )
    result = master.run()
    assert len(result.trials) == total
    assert result.max_live == DEFAULT_MAX_CONCURRENT_TRIALS
    assert result.shutdowns == 1


def test_unset_concurrency_proposes_the_same_trials() -> None:
    # Trial i gets the hyperparameters and seed of index i, however many run at once.
    cfg, space, total = UNSET["random"]
    capped = config("random", max_trials=total, max_concurrent_trials=MAX_CONCURRENT_TRIALS)
    slow = SimulatedMaster(make_searcher(cfg, space, 5), objective, order="random").run()
    fast = SimulatedMaster(make_searcher(capped, space, 5), objective, order="random").run()

    assert {r: (t.hparams, t.seed) for r, t in slow.trials.items()} == {
        r: (t.hparams, t.seed) for r, t in fast.trials.items()
    }
    assert fast.max_live == total


# --- the biggest searches -----------------------------------------------------------------

BIGGEST: dict[str, tuple[SearcherConfig, Mapping[str, HParam], int]] = {
    "random": (config("random", max_trials=MAX_TRIALS), SPACE, DEFAULT_MAX_CONCURRENT_TRIALS),
    "grid": (config("grid"), {"i": Int(1, MAX_GRID_POINTS)}, DEFAULT_MAX_CONCURRENT_TRIALS),
    "random-at-once": (
        config("random", max_trials=MAX_TRIALS, max_concurrent_trials=MAX_CONCURRENT_TRIALS),
        SPACE,
        MAX_CONCURRENT_TRIALS,
    ),
    "grid-at-once": (
        config("grid", max_concurrent_trials=MAX_CONCURRENT_TRIALS),
        {"i": Int(1, MAX_GRID_POINTS)},
        MAX_CONCURRENT_TRIALS,
    ),
}


@pytest.mark.parametrize("name", sorted(BIGGEST))
def test_the_biggest_searches_start_with_what_can_run(name: str) -> None:
    cfg, space, expected = BIGGEST[name]

    searcher = make_searcher(cfg, space, 0)
    ops = searcher.initial_operations()
    snapshot = json.dumps(searcher.snapshot())

    assert len([op for op in ops if isinstance(op, Create)]) == expected
    # What is kept (and stored at every event) grows with the trials created, not with
    # max_trials or the grid: about 24 bytes a trial today, 100,000 trials would be MBs.
    assert len(snapshot) < 1_000 + 100 * expected


def test_the_last_grid_point_is_proposed_without_listing_the_grid() -> None:
    half = MAX_GRID_POINTS // 2
    sampler = GridSampler({"i": Int(1, half), "c": Categorical(("a", "b"))})

    assert sampler.size == MAX_GRID_POINTS
    assert sampler.point(0) == {"c": "a", "i": 1}
    assert sampler.point(half) == {"c": "b", "i": 1}  # the first name varies slowest
    assert sampler.point(sampler.size - 1) == {"c": "b", "i": half}
    with pytest.raises(ValueError, match=f"grid point {MAX_GRID_POINTS} requested"):
        sampler.point(sampler.size)
    with pytest.raises(ValueError, match="more than 100,000 points"):
        GridSampler({"i": Int(0, MAX_GRID_POINTS)})


# --- grid points by index -----------------------------------------------------------------

leaf = st.one_of(
    st.builds(Const, st.integers(0, 3)),
    st.builds(Int, st.integers(-3, 3), st.integers(3, 9), st.one_of(st.none(), st.integers(1, 5))),
    st.builds(Double, st.just(0.0), st.floats(0.5, 2.0), st.integers(1, 4)),
    st.builds(Log, st.just(-3.0), st.just(-1.0), st.just(10.0), st.integers(1, 3)),
    st.lists(st.sampled_from(["a", None, 1, [2]]), min_size=1, max_size=3).map(
        lambda vals: Categorical(tuple(vals))
    ),
)
names = st.sampled_from(["a", "b", "c", "d"])
spaces = st.recursive(
    st.dictionaries(names, leaf, max_size=3),
    lambda group: st.dictionaries(names, st.one_of(leaf, group), max_size=3),
    max_leaves=6,
)


@settings(max_examples=200, deadline=None)
@given(space=spaces)
def test_grid_point_by_index_is_the_listed_point(space: dict[str, Any]) -> None:
    # Grids the test lists in full: the space's nesting could multiply out to more
    # points than the master takes (refused, tested above) or than a test should list.
    assume(grid_count(space) <= 2_000)
    points = grid_points(space)
    sampler = GridSampler(space)

    assert sampler.size == len(points) == grid_count(space)
    assert [sampler.point(i) for i in range(sampler.size)] == points
    # same key order too: the stored hyperparameters read the same
    assert [json.dumps(sampler.point(i)) for i in range(sampler.size)] == [
        json.dumps(p) for p in points
    ]


# --- caps -----------------------------------------------------------------------------------


def test_max_trials_past_the_cap_is_refused() -> None:
    message = (
        f"searcher: max_trials must be at most {MAX_TRIALS:,} (the largest search the master "
        "runs), got 1,000,000,000; split the search into experiments"
    )

    assert parse({"name": "random", "max_trials": 10**9}) == [message]
    assert parse({"name": "asha", "max_trials": MAX_TRIALS + 1}) != []
    assert parse({"name": "random", "max_trials": MAX_TRIALS}) == []
    with pytest.raises(ValueError, match="max_trials must be at most"):
        make_searcher(config("adaptive_asha", max_trials=MAX_TRIALS + 1), SPACE, 0)


def test_max_concurrent_trials_past_the_cap_is_refused() -> None:
    flood = {"name": "random", "max_trials": 8, "max_concurrent_trials": MAX_CONCURRENT_TRIALS + 1}

    assert parse(flood) == [
        f"searcher.max_concurrent_trials: must be at most {MAX_CONCURRENT_TRIALS:,} "
        f"(trials running or queued at once), got {MAX_CONCURRENT_TRIALS + 1:,}"
    ]
    assert parse({**flood, "max_concurrent_trials": MAX_CONCURRENT_TRIALS}) == []
    with pytest.raises(ValueError, match="searcher.max_concurrent_trials: must be at most"):
        make_searcher(config("grid", max_concurrent_trials=10**6), GRID_80, 0)


def test_no_default_concurrency_passes_the_cap() -> None:
    # ASHA's default is divisor**(rungs-1), 100**2 here; a 1-rung bracket's is the divisor.
    asha = config("asha", max_length=10**6, max_trials=MAX_TRIALS, divisor=100)
    wide = config("adaptive_asha", max_length=10**6, max_trials=999, divisor=10**6)
    # Five brackets, each at the cap: the search as a whole is capped too.
    many = config(
        "adaptive_asha", max_length=10**6, max_trials=MAX_TRIALS, divisor=2, mode="conservative"
    )

    assert search_spec(asha, SPACE).brackets[0].max_concurrent_trials == MAX_CONCURRENT_TRIALS
    assert search_spec(wide, SPACE).brackets[0].max_concurrent_trials == MAX_CONCURRENT_TRIALS
    spec = search_spec(many, SPACE)
    assert [b.max_concurrent_trials for b in spec.brackets] == [MAX_CONCURRENT_TRIALS] * 5
    assert spec.max_concurrent_trials == MAX_CONCURRENT_TRIALS
    for cfg in (asha, wide, many):
        ops = make_searcher(cfg, SPACE, 0).initial_operations()
        assert len([op for op in ops if isinstance(op, Create)]) <= MAX_CONCURRENT_TRIALS
