"""Tests for assay.master.store._downsample: LTTB, bucket merging, M4 and the entry points."""

from __future__ import annotations

import itertools
import math
from functools import reduce

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from assay.master.store._downsample import (
    Bucket,
    MaybePoint,
    Point,
    bucket_index,
    downsample,
    downsample_buckets,
    downsample_indices,
    group_into_buckets,
    lttb,
    m4_arrays,
    m4_groups,
    m4_points,
    merge,
    series_indices,
    summarize,
)

# Integer-valued floats keep hypothesis examples exact and readable.
coords = st.integers(min_value=-1000, max_value=1000).map(float)
point_lists = st.lists(st.tuples(coords, coords), min_size=1, max_size=60)


def series(ys: list[float]) -> list[Point]:
    """Points at x = 0, 1, 2, ... with the given values."""
    return [(float(x), y) for x, y in enumerate(ys)]


# ---------------------------------------------------------------------------- LTTB


def test_lttb_hand_computed_threshold_3() -> None:
    # One middle bucket (x 1..3), next centroid = last point (4, 0), a = (0, 0):
    # doubled areas are 4*|y| -> 12, 4, 8; the peak (1, 3) wins over the dip (3, -2).
    points = series([0, 3, 1, -2, 0])
    assert lttb(points, 3) == [(0, 0), (1, 3), (4, 0)]


def test_lttb_hand_computed_threshold_4() -> None:
    # every = (6 - 2) / (4 - 2) = 2: middle buckets x {1, 2} and {3, 4}.
    # Bucket 1: a = (0, 0), centroid of {3, 4} = (3.5, 2.5): doubled areas 1 and 5 -> (2, 0).
    # Bucket 2: a = (2, 0), centroid = last point (5, 0): doubled areas 15 and 0 -> (3, 5).
    points = series([0, 1, 0, 5, 0, 0])
    assert lttb(points, 4) == [(0, 0), (2, 0), (3, 5), (5, 0)]


@pytest.mark.parametrize("threshold", [0, 6, 7, 100])
def test_lttb_short_input_unchanged(threshold: int) -> None:
    points = series([1, 5, 2, 8, 3, 9])
    assert lttb(points, threshold) == points


def test_lttb_tiny_thresholds() -> None:
    points = series([1, 5, 2, 8, 3, 9])
    assert lttb(points, 1) == [(0, 1)]
    assert lttb(points, 2) == [(0, 1), (5, 9)]


@given(
    ys=st.lists(coords, min_size=3, max_size=200),
    threshold=st.integers(min_value=3, max_value=50),
)
def test_lttb_length_ends_and_order(ys: list[float], threshold: int) -> None:
    points = series(ys)
    out = lttb(points, threshold)
    assert len(out) == min(len(points), threshold)
    assert out[0] == points[0]
    assert out[-1] == points[-1]
    assert [x for x, _ in out] == sorted({x for x, _ in out})
    assert set(out) <= set(points)


def test_lttb_skips_none() -> None:
    points: list[MaybePoint] = [(0, 0), (1, None), (2, 3), (3, None), (4, 1), (5, 0)]
    assert lttb(points, 10) == [(0, 0), (2, 3), (4, 1), (5, 0)]
    out = lttb(points, 3)
    assert len(out) == 3
    assert all(y is not None for _, y in out)
    assert out[0] == (0, 0)
    assert out[-1] == (5, 0)


def test_lttb_all_none() -> None:
    assert lttb([(0, None), (1, None)], 5) == []


def _reference_lttb(points: list[Point], threshold: int) -> list[Point]:
    """LTTB as Steinarsson writes it, one point at a time: the specification."""
    n = len(points)

    def start(k: int) -> int:  # floor(k * every) + 1, every = (n - 2) / (threshold - 2)
        return k * (n - 2) // (threshold - 2) + 1

    out, a = [points[0]], 0
    for k in range(threshold - 2):
        lo, hi = start(k), start(k + 1)
        nxt = points[hi : min(start(k + 2), n)] or [points[-1]]
        cx = sum(p[0] for p in nxt) / len(nxt)
        cy = sum(p[1] for p in nxt) / len(nxt)
        ax, ay = points[a]
        areas = [abs((ax - cx) * (py - ay) - (ax - px) * (cy - ay)) for px, py in points[lo:hi]]
        a = lo + areas.index(max(areas))
        out.append(points[a])
    return [*out, points[-1]]


@given(
    ys=st.lists(coords, min_size=4, max_size=300),
    threshold=st.integers(min_value=3, max_value=80),
)
def test_lttb_matches_the_reference(ys: list[float], threshold: int) -> None:
    # Small integer values: every sum and centroid is exact, so the picks must be equal.
    points = series(ys)
    if threshold >= len(points):
        return
    assert lttb(points, threshold) == _reference_lttb(points, threshold)


# ---------------------------------------------------------------------------- entry points


def sine_with_spike() -> tuple[list[Point], Point, Point]:
    """100,000 points of a sine plus noise-free spike; returns (points, global min, global max)."""
    n = 100_000
    points = [(float(x), math.sin(x / 500)) for x in range(n)]
    spike = (61_234.0, 50.0)
    points[int(spike[0])] = spike
    low = min(points, key=lambda p: (p[1], p[0]))
    return points, low, spike


def test_downsample_short_unchanged() -> None:
    points = series([3, 1, 2])
    assert downsample(points, 3) == points


def test_downsample_sine_keeps_spike() -> None:
    points, _, spike = sine_with_spike()
    out = downsample(points, 500)
    assert len(out) == 500
    assert out[0] == points[0]
    assert out[-1] == points[-1]
    assert spike in out
    assert [x for x, _ in out] == sorted(x for x, _ in out)


def test_downsample_buckets_sine_keeps_global_min_and_max() -> None:
    points, low, spike = sine_with_spike()
    out = downsample_buckets(group_into_buckets(points, 10).values(), 500)
    assert len(out) == 500
    assert spike in out
    assert low in out
    assert out[0] == points[0]
    assert out[-1] == points[-1]
    assert [x for x, _ in out] == sorted(x for x, _ in out)


def test_downsample_buckets_restores_a_dropped_minimum() -> None:
    # Middle LTTB buckets are x {1, 2} and {3, 4, 5}; in the second, the flat (3, 0) spans a
    # bigger triangle than the dip (5, -1), so plain LTTB loses the global min.
    points = series([0, 0, 3, 0, 0, -1, 0])
    assert lttb(points, 4) == [(0, 0), (2, 3), (3, 0), (6, 0)]
    out = downsample_buckets(group_into_buckets(points, 1).values(), 4)
    assert out == [(0, 0), (2, 3), (5, -1), (6, 0)]


def test_downsample_buckets_both_extremes_in_one_lttb_bucket() -> None:
    # Middle buckets x {1, 2} and {3, 4}: LTTB keeps the max (4, 3) but drops the min (3, -1),
    # whose bucket's pick is the protected max, so the nearest free pick (2, 0) gives way.
    points = series([0, 0, 0, -1, 3, 0])
    assert lttb(points, 4) == [(0, 0), (2, 0), (4, 3), (5, 0)]
    out = downsample_buckets(group_into_buckets(points, 1).values(), 4)
    assert out == [(0, 0), (3, -1), (4, 3), (5, 0)]


@given(
    ys=st.lists(coords, min_size=1, max_size=300),
    width=st.integers(min_value=1, max_value=7),
    max_points=st.integers(min_value=4, max_value=40),
)
def test_downsample_buckets_invariants(ys: list[float], width: int, max_points: int) -> None:
    points = series(ys)
    m4 = m4_points(group_into_buckets(points, width).values())
    out = downsample_buckets(group_into_buckets(points, width).values(), max_points)
    assert len(out) == min(len(m4), max_points)
    assert out == sorted(out)
    assert set(out) <= set(m4)
    everything = summarize(points)
    for kept in (everything.first, everything.last, everything.min, everything.max):
        assert kept in out


@given(ys=st.lists(coords, min_size=1, max_size=300), max_points=st.integers(1, 40))
def test_series_indices_is_downsample_indices_on_columns(ys: list[float], max_points: int) -> None:
    points = series(ys)
    x = np.array([p[0] for p in points])
    y = np.array(ys, dtype=np.float64)
    assert series_indices(x, y, max_points) == downsample_indices(points, max_points)


def test_series_indices_with_infinities_keeps_them() -> None:
    ys = [0.0, 1.0, math.inf, 2.0, -math.inf, 3.0] * 20
    x = np.arange(len(ys), dtype=np.float64)
    keep = series_indices(x, np.array(ys), 10)
    assert len(keep) == 10
    assert keep == sorted(set(keep))
    assert {2, 4} <= set(keep)  # the first +inf and the first -inf


# ---------------------------------------------------------------------------- buckets


def test_summarize_example() -> None:
    bucket = summarize([(1, 5), (2, 1), (3, 5), (4, 1)])
    assert bucket == Bucket(count=4, first=(1, 5), last=(4, 1), min=(2, 1), max=(1, 5))


def test_summarize_empty_raises() -> None:
    with pytest.raises(ValueError, match="at least one point"):
        summarize([])


@given(points=point_lists, data=st.data())
def test_merge_matches_summarize_of_concatenation(points: list[Point], data: st.DataObject) -> None:
    split = data.draw(st.integers(min_value=1, max_value=max(1, len(points) - 1)))
    a, b = points[:split], points[split:]
    if not b:
        return
    assert merge(summarize(a), summarize(b)) == summarize(a + b)


@given(a=point_lists, b=point_lists, c=point_lists)
def test_merge_associative_and_commutative(a: list[Point], b: list[Point], c: list[Point]) -> None:
    sa, sb, sc = summarize(a), summarize(b), summarize(c)
    assert merge(sa, sb) == merge(sb, sa)
    assert merge(merge(sa, sb), sc) == merge(sa, merge(sb, sc))
    assert merge(sa, sb) == summarize(b + a)


@given(points=point_lists, width=st.integers(min_value=1, max_value=500))
def test_group_then_merge_equals_summarize(points: list[Point], width: int) -> None:
    buckets = group_into_buckets(points, width)
    assert sum(bucket.count for bucket in buckets.values()) == len(points)
    assert list(buckets) == sorted(buckets)
    for index, bucket in buckets.items():
        assert bucket_index(bucket.first[0], width) == index
        assert bucket_index(bucket.last[0], width) == index
    assert reduce(merge, buckets.values()) == summarize(points)


def test_bucket_index() -> None:
    assert bucket_index(0, 10) == 0
    assert bucket_index(9.999, 10) == 0
    assert bucket_index(10, 10) == 1
    assert bucket_index(-1, 10) == -1
    with pytest.raises(ValueError, match="positive"):
        bucket_index(5, 0)


def test_group_into_buckets_skips_none() -> None:
    points: list[MaybePoint] = [(0, None), (1, 2), (2, None), (12, 7), (13, None)]
    buckets = group_into_buckets(points, 10)
    assert buckets == {0: summarize([(1, 2)]), 1: summarize([(12, 7)])}
    assert group_into_buckets([(0, None)], 10) == {}


# ---------------------------------------------------------------------------- M4


def test_m4_points_example() -> None:
    buckets = [
        summarize([(0, 1), (1, 9), (2, -3), (3, 2)]),
        summarize([(4, 4)]),
    ]
    assert m4_points(buckets) == [(0, 1), (1, 9), (2, -3), (3, 2), (4, 4)]


@given(ys=st.lists(coords, min_size=1, max_size=200), width=st.integers(min_value=1, max_value=9))
def test_m4_keeps_every_bucket_extreme(ys: list[float], width: int) -> None:
    points = series(ys)
    buckets = group_into_buckets(points, width)
    out = m4_points(buckets.values())
    assert out == sorted(set(out))
    assert len(out) <= 4 * len(buckets)
    for bucket in buckets.values():
        assert {bucket.first, bucket.last, bucket.min, bucket.max} <= set(out)
    everything = summarize(points)
    assert everything.min in out
    assert everything.max in out


def _columns(buckets: list[Bucket]) -> tuple[np.ndarray, np.ndarray]:
    """(buckets, 4) integer x and float y columns of first, min, max, last."""
    picks = [(b.first, b.min, b.max, b.last) for b in buckets]
    x = np.array([[int(p[0]) for p in row] for row in picks], dtype=np.int64).reshape(-1, 4)
    y = np.array([[p[1] for p in row] for row in picks], dtype=np.float64).reshape(-1, 4)
    return x, y


@given(ys=st.lists(coords, min_size=1, max_size=200), width=st.integers(min_value=1, max_value=9))
def test_m4_arrays_equal_m4_points(ys: list[float], width: int) -> None:
    buckets = list(group_into_buckets(series(ys), width).values())
    x, y = m4_arrays(*_columns(buckets))
    assert x.dtype == np.int64
    assert list(zip(x.tolist(), y.tolist(), strict=True)) == m4_points(buckets)


@given(
    ys=st.lists(st.integers(-3, 3).map(float), min_size=1, max_size=200),
    width=st.integers(min_value=1, max_value=5),
    groups=st.integers(min_value=1, max_value=30),
)
def test_m4_groups_merge_consecutive_buckets(ys: list[float], width: int, groups: int) -> None:
    # Few distinct values: many ties, which must go to the earliest point as in `merge`.
    buckets = list(group_into_buckets(series(ys), width).values())
    x, y = m4_groups(*_columns(buckets), groups)
    assert len(x) == min(groups, len(buckets))
    starts = [k * len(buckets) // len(x) for k in range(len(x))] + [len(buckets)]
    for row, (lo, hi) in enumerate(itertools.pairwise(starts)):
        merged = reduce(merge, buckets[lo:hi])
        expected = (merged.first, merged.min, merged.max, merged.last)
        assert list(zip(x[row].tolist(), y[row].tolist(), strict=True)) == list(expected)


def test_m4_groups_keep_huge_batch_counts_exact() -> None:
    top = 2**63 - 1
    x = np.array([[top - 7, top - 6, top - 5, top - 4], [top - 3, top - 2, top - 1, top]])
    y = np.array([[0.0, -1.0, 5.0, 1.0], [2.0, -2.0, 3.0, 0.0]])
    gx, gy = m4_groups(x, y, 1)
    assert gx.tolist() == [[top - 7, top - 2, top - 5, top]]
    assert gy.tolist() == [[0.0, -2.0, 5.0, 0.0]]
