"""Curve reads: which rows a curve is drawn from, and what every curve keeps (both engines)."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import delete, func, select

from assay.master.store import MetricReport, Store, _curves
from assay.master.store._curves import RAW_READ_LIMIT, _plan
from assay.master.store._models import MetricRollup
from assay.master.store._rollups import LEVELS, TOP
from tests.store import _seed as seed

ALL = list(LEVELS.items())
WITHOUT_LEVEL_0 = [(level, shift) for level, shift in ALL if level > 0]

# --- planning (pure) --------------------------------------------------------------------------


@pytest.mark.parametrize("max_points", [500, 800, 1000])
def test_a_dense_mid_sized_curve_is_drawn_from_the_finest_level(max_points: int) -> None:
    assert _plan(10_000, 9_999, max_points, ALL) == 0


def test_a_curve_within_max_points_is_read_whole() -> None:
    assert _plan(1000, 10**9, 1000, ALL) is None


def test_a_store_without_level_0_reads_mid_sized_curves_raw() -> None:
    # Level 1 has 40 buckets of 256 batches: too coarse for 1,000 points.
    assert _plan(10_000, 9_999, 1000, WITHOUT_LEVEL_0) is None
    assert _plan(RAW_READ_LIMIT + 1, RAW_READ_LIMIT, 1000, WITHOUT_LEVEL_0) == 1


def test_a_curve_reported_every_100_batches_uses_a_level_that_summarises_it() -> None:
    # 10,000 rows over 1,000,000 batches: level 0 holds one row a bucket, level 1 2.56 and
    # 3,907 buckets; level 2 has 245 buckets of 41 rows.
    assert _plan(10_000, 999_900, 1000, ALL) == 2
    assert _plan(10_000, 999_900, 800, ALL) == 2


def test_short_curves_too_coarse_for_any_level_are_read_raw() -> None:
    assert _plan(500, 499, 200, ALL) is None  # level 0: 32 buckets for 200 points
    assert _plan(3000, 2999, 1000, ALL) is None  # level 0: 188 buckets, 3,000 rows are cheap


def test_a_long_sparse_curve_is_drawn_coarsely_rather_than_slowly() -> None:
    # Every level is either sparse or has too many buckets: the coarsest is used.
    assert _plan(RAW_READ_LIMIT + 1, 2**62, 10, ALL) == TOP


# --- helpers ----------------------------------------------------------------------------------


def _trials(store: Store) -> Iterator[tuple[int, int]]:
    """Fresh (trial, run) pairs of one experiment."""
    eid = seed.experiment(store, name="curves", owner="a")
    for k in itertools.count():
        tid = seed.trial(store, eid, request_id=f"r{k}", seed=k)
        yield tid, seed.start_run(store, tid)


def _write(store: Store, tid: int, run: int, points: list[tuple[int, float]], chunk: int) -> None:
    reports = [MetricReport(b, {"loss": v}) for b, v in points]
    for start in range(0, len(reports), chunk):
        store.report_metrics(tid, run, "training", reports[start : start + chunk])


def _check(curve: list[tuple[int, float]], live: dict[int, float], max_points: int) -> None:
    """What every curve keeps, whatever it was drawn from."""
    assert len(curve) <= max_points
    if len(live) <= max_points:
        assert curve == sorted(live.items())
        return
    xs = [b for b, _ in curve]
    assert all(a < b for a, b in itertools.pairwise(xs)), "batches strictly increase"
    assert all(type(b) is int and type(v) is float for b, v in curve)
    assert all(live[b] == v for b, v in curve), "every point is a live row"
    ordered = sorted(live.items())
    assert curve[0] == ordered[0]
    assert curve[-1] == ordered[-1]
    if max_points >= 4:
        low = min(ordered, key=lambda p: (p[1], p[0]))
        high = min(ordered, key=lambda p: (-p[1], p[0]))
        assert low in curve, "the earliest global minimum is kept"
        assert high in curve, "the earliest global maximum is kept"


def _sources(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The SQL of every curve query from now on."""
    seen: list[str] = []
    fetch = _curves._fetch

    def spy(session: Any, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        seen.append(sql)
        return fetch(session, sql, params)

    monkeypatch.setattr(_curves, "_fetch", spy)
    return seen


def _sawtooth(n: int, start: int = 1) -> list[tuple[int, float]]:
    """n consecutive batches of a noisy sine, with one spike and one dip."""
    rng = random.Random(n)
    points = [(b, math.sin(b / 300) + rng.gauss(0, 0.1)) for b in range(start, start + n)]
    points[n // 3] = (points[n // 3][0], 50.0)
    points[2 * n // 3] = (points[2 * n // 3][0], -50.0)
    return points


# --- invariants on random curves --------------------------------------------------------------


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rows=st.integers(min_value=1, max_value=6000),
    step=st.sampled_from([1, 1, 2, 3, 20, 100, 700]),
    seed=st.integers(min_value=0, max_value=2**32),
    max_points=st.integers(min_value=2, max_value=60) | st.integers(min_value=100, max_value=1500),
    chunk=st.sampled_from([1, 7, 400, 5000]),
    values=st.sampled_from(["gauss", "few", "holes"]),
)
def test_every_curve_keeps_its_ends_and_extremes(
    store: Store,
    rows: int,
    step: int,
    seed: int,
    max_points: int,
    chunk: int,
    values: str,
) -> None:
    rng = random.Random(seed)
    tid, run = next(_trials(store))
    batches = itertools.accumulate(rng.randint(1, 2 * step - 1) for _ in range(rows))
    points: list[tuple[int, float]] = []
    for b in batches:
        if values == "gauss":
            v = rng.gauss(0, 1)
        elif values == "few":  # ties everywhere: the earliest must win
            v = float(rng.randint(-2, 2))
        else:  # NaN is stored as NULL and never drawn; infinities are drawn
            v = rng.choice([math.nan, math.inf, -math.inf, rng.gauss(0, 1), rng.gauss(0, 1)])
        points.append((b, v))
    _write(store, tid, run, points, chunk if chunk != 1 or rows <= 50 else 500)
    live = {b: v for b, v in points if not math.isnan(v)}
    _check(
        store.trial_curve(tid, "loss", group="training", max_points=max_points), live, max_points
    )


# --- where curves come from -------------------------------------------------------------------


def test_a_dense_curve_reads_level_0_not_the_raw_rows(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    tid, run = next(_trials(store))
    points = _sawtooth(6000)
    _write(store, tid, run, points, 2500)
    seen = _sources(monkeypatch)
    curve = store.trial_curve(tid, "loss", group="training", max_points=200)
    assert seen == [_curves._EXTENT_SQL, _curves._ROLLUP_SQL]
    # M4 of 50 groups of level-0 buckets: up to 4 points each, 2 at least.
    assert 150 <= len(curve) <= 200
    _check(curve, dict(points), 200)


@pytest.mark.parametrize("missing", ["all", "some"])
def test_a_store_written_before_level_0_falls_back_to_the_raw_rows(
    store: Store, monkeypatch: pytest.MonkeyPatch, missing: str
) -> None:
    tid, run = next(_trials(store))
    points = _sawtooth(6000)
    _write(store, tid, run, points, 2500)
    expected = store.trial_curve(tid, "loss", group="training", max_points=200)
    with store.write() as s:
        gone = delete(MetricRollup).where(MetricRollup.trial_id == tid, MetricRollup.level == 0)
        if missing == "some":
            gone = gone.where(MetricRollup.bucket % 7 == 3)
        s.execute(gone)
    seen = _sources(monkeypatch)
    curve = store.trial_curve(tid, "loss", group="training", max_points=200)
    assert seen[-1] == _curves._RAW_SQL
    assert len(curve) == 200
    _check(curve, dict(points), 200)
    spike = points[2000]
    assert spike in expected
    assert spike in curve
    # Rows reported after the upgrade get level-0 rollups; the level still lacks the old
    # ones, so reads keep to the raw rows until it is complete.
    _write(store, tid, run, _sawtooth(100, start=6001), 100)
    seen.clear()
    store.trial_curve(tid, "loss", group="training", max_points=200)
    assert seen[-1] == _curves._RAW_SQL


def _level_counts(store: Store, tid: int) -> dict[int, int]:
    with store.read() as s:
        rows = s.execute(
            select(MetricRollup.level, func.sum(MetricRollup.count))
            .where(MetricRollup.trial_id == tid)
            .group_by(MetricRollup.level)
        )
        return {int(level): int(count) for level, count in rows}


def test_level_0_follows_a_restore(store: Store) -> None:
    tid, run = next(_trials(store))
    points = _sawtooth(6000)
    _write(store, tid, run, points, 1000)
    assert _level_counts(store, tid) == dict.fromkeys(LEVELS, 6000)
    cut = 3500  # past the spike at batch 2001, before the dip at batch 4001
    run2 = seed.start_run(store, tid, restored_batches=cut)
    assert _level_counts(store, tid) == dict.fromkeys(LEVELS, cut)
    curve = store.trial_curve(tid, "loss", group="training", max_points=200)
    _check(curve, dict(points[:cut]), 200)
    assert curve[-1][0] == cut
    assert min(v for _, v in curve) > -2  # the dip was superseded
    redo = [(b, 7.0) for b in range(cut + 1, 6001)]
    _write(store, tid, run2, redo, 1000)
    assert _level_counts(store, tid) == dict.fromkeys(LEVELS, 6000)
    curve = store.trial_curve(tid, "loss", group="training", max_points=200)
    _check(curve, dict(points[:cut] + redo), 200)


def test_huge_batch_counts_come_back_exact_from_rollups(store: Store) -> None:
    tid, run = next(_trials(store))
    top = 2**63 - 1
    points = [(top - 5999 + k, v) for k, (_, v) in enumerate(_sawtooth(6000))]
    _write(store, tid, run, points, 3000)
    curve = store.trial_curve(tid, "loss", group="training", max_points=100)
    _check(curve, dict(points), 100)
    assert curve[-1] == (top, points[-1][1])


def test_experiment_curves_equal_each_trials_curve(store: Store) -> None:
    trials = _trials(store)
    written = []
    for rows in (3, 900, 6000, 25_000):
        tid, run = next(trials)
        _write(store, tid, run, _sawtooth(rows), 5000)
        written.append(tid)
    eid = store.get_trial(written[0]).experiment_id
    curves = store.experiment_curves(eid, "loss", group="training", max_points=300)
    assert curves == {
        t: store.trial_curve(t, "loss", group="training", max_points=300) for t in written
    }
    lengths = [len(curves[t]) for t in written]
    assert lengths[:2] == [3, 300]  # whole; raw rows thinned by LTTB
    assert all(225 <= n <= 300 for n in lengths[2:])  # M4 of 75 groups of rollup buckets


def test_a_trials_many_short_curves_are_read_in_one_query(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trial that reports 300 metric names: its curves were a query or two each (50,000
    names took 54 s); the short ones now come from one query, a long one as before, and
    every curve is what `trial_curve` draws."""
    tid, run = next(_trials(store))
    names = [f"m{i:03d}" for i in range(300)]
    values = [{n: b * 0.5 + i for i, n in enumerate(names)} for b in (1, 2, 3)]
    values[1]["m007"] = math.nan  # never drawn
    reports = [MetricReport(b, v) for b, v in zip((1, 2, 3), values, strict=True)]
    store.report_metrics(tid, run, "training", reports)
    _write(store, tid, run, _sawtooth(6000, start=10), 2500)  # "loss": a long curve
    seen = _sources(monkeypatch)
    curves = store.trial_curves(tid, group="training", max_points=200)
    assert seen.count(_curves._BULK_SQL) == 1
    assert len(seen) <= 5  # the counts, the bulk read, and "loss" by its rollups
    assert sorted(curves) == sorted([*names, "loss"])
    monkeypatch.undo()
    for name in ("m000", "m007", "m299", "loss"):
        assert curves[name] == store.trial_curve(tid, name, group="training", max_points=200)
    assert curves["m007"] == [(1, 7.5), (3, 8.5)]
