"""Downsampling of metric series for charts: LTTB over points, M4 over pre-aggregated buckets.

A metric series is a list of points `(x, y)` where x is `total_batches` and y the value.
Charts never need more points than they have pixels, so the store reduces a series before
sending it: `downsample` for raw points, `downsample_buckets` for rows pre-aggregated into
fixed-width buckets (`Bucket`, built by `summarize`/`merge`/`group_into_buckets`). The
store holds its series as numpy columns and calls the array forms: `m4_groups` and
`m4_arrays` (M4 on rows of first, min, max and last points) and `series_indices` (LTTB
with the extremes kept, which `downsample` and `downsample_buckets` use too).

Everything here is pure and exact: no I/O, no floating-point tricks in index arithmetic.
A y of None stands for a NaN stored as SQL NULL; it is skipped everywhere.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Point = tuple[float, float]
"""(x, y): x is total_batches, y the metric value."""

MaybePoint = tuple[float, float | None]
"""A point as read from storage, where a NaN value comes back as None."""

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


# --------------------------------------------------------------------------------------
# LTTB
# --------------------------------------------------------------------------------------


def _present(points: Sequence[MaybePoint]) -> list[Point]:
    """The points whose y is not None, in their original order."""
    return [(x, y) for x, y in points if y is not None]


def _columns(points: Sequence[Point]) -> tuple[FloatArray, FloatArray]:
    """The x and y columns of `points` as float arrays."""
    xy = np.asarray(points, dtype=np.float64).reshape(len(points), 2)
    return xy[:, 0], xy[:, 1]


def _bucket_starts(n: int, threshold: int) -> list[int]:
    """Start index of each of the `threshold` LTTB slots, then n: [first point, middles...,
    last point, n], so slot s is starts[s]:starts[s + 1].

    Slot 0 is the first point alone, slots 1..threshold-2 the middle buckets, and the last
    slot the last point alone (the last middle bucket ends at n - 1). Middle bucket k starts
    at floor(k * every) + 1, every = (n - 2) / (threshold - 2), computed in exact integers.
    """
    middles = np.arange(threshold - 1, dtype=np.int64) * (n - 2) // (threshold - 2) + 1
    return [0, *middles.tolist(), n]


def _lttb_indices(x: FloatArray, y: FloatArray, starts: list[int]) -> list[int]:
    """Indices LTTB keeps, one per slot of `starts` (`_bucket_starts(len(x), threshold)`,
    len(x) > threshold >= 3).

    In middle slot s, the kept point spans the largest triangle with the point kept in slot
    s - 1 and the centroid of slot s + 1 (for the last middle slot, the last point). Ties
    go to the earliest index; a NaN area (from infinite values) never wins. The 1/2 factor
    is dropped: it does not change the argmax. Each pick depends on the previous one, so
    the loop stays sequential; it runs on plain lists, with the centroids from numpy.
    """
    # Centroids of slots 1..threshold-1: entry s is slot s + 1's, the one slot s needs.
    counts = np.diff(starts[1:])
    with np.errstate(over="ignore", invalid="ignore"):  # infinite values: NaN areas lose
        cxs: list[float] = (np.add.reduceat(x, starts[1:-1]) / counts).tolist()
        cys: list[float] = (np.add.reduceat(y, starts[1:-1]) / counts).tolist()
    xs: list[float] = x.tolist()
    ys: list[float] = y.tolist()
    chosen = [0]
    kept = 0
    for slot in range(1, len(starts) - 2):
        ax, ay = xs[kept], ys[kept]
        dx, dy = ax - cxs[slot], cys[slot] - ay
        kept, best_area = starts[slot], -1.0
        for i in range(starts[slot], starts[slot + 1]):
            area = abs(dx * (ys[i] - ay) - (ax - xs[i]) * dy)
            if area > best_area:
                kept, best_area = i, area
        chosen.append(kept)
    chosen.append(len(xs) - 1)
    return chosen


def lttb(points: Sequence[MaybePoint], threshold: int) -> list[Point]:
    """Largest-Triangle-Three-Buckets (Steinarsson 2013) on points sorted by x.

    Keeps the first and last point and, from each of threshold - 2 equal-count buckets in
    between, the point spanning the largest triangle with the previously kept point and the
    next bucket's centroid: the visual shape survives with `threshold` points.

    Points with y None are dropped first (they have no position to draw). Of the rest:
    returned unchanged when there are at most `threshold` (or threshold <= 0, meaning no
    limit); [first] for threshold 1, [first, last] for threshold 2; otherwise exactly
    `threshold` points in x order.
    """
    present = _present(points)
    if threshold <= 0 or len(present) <= threshold:
        return present
    if threshold < 3:
        return [present[0], present[-1]][:threshold]
    starts = _bucket_starts(len(present), threshold)
    return [present[i] for i in _lttb_indices(*_columns(present), starts)]


# --------------------------------------------------------------------------------------
# Buckets (pre-aggregation) and M4
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bucket:
    """Summary of the points in one x range: enough to redraw its extremes and endpoints.

    `first`/`last` are the points with the smallest/largest x; `min`/`max` the points with
    the smallest/largest y, ties going to the smaller x. Every field is a total-order pick,
    so buckets merge associatively and commutatively (see `merge`).
    """

    count: int
    first: Point
    last: Point
    min: Point
    max: Point


def _by_x(p: Point) -> Point:
    """Sort key for first/last: x, then y so equal-x points still order deterministically."""
    return p


def _by_low_y(p: Point) -> Point:
    """Sort key whose minimum is the lowest y, earliest x on ties."""
    return p[1], p[0]


def _by_high_y(p: Point) -> Point:
    """Sort key whose minimum is the highest y, earliest x on ties."""
    return -p[1], p[0]


def summarize(points: Sequence[Point]) -> Bucket:
    """The Bucket of a non-empty sequence of points (y never None)."""
    if not points:
        raise ValueError("summarize needs at least one point")
    return Bucket(
        count=len(points),
        first=min(points, key=_by_x),
        last=max(points, key=_by_x),
        min=min(points, key=_by_low_y),
        max=min(points, key=_by_high_y),
    )


def merge(a: Bucket, b: Bucket) -> Bucket:
    """The Bucket of the union of two buckets' points; associative and commutative.

    Lets the store combine per-bucket rows in any order (or in parallel) and still equal
    `summarize` of all points.
    """
    return Bucket(
        count=a.count + b.count,
        first=min(a.first, b.first, key=_by_x),
        last=max(a.last, b.last, key=_by_x),
        min=min(a.min, b.min, key=_by_low_y),
        max=min(a.max, b.max, key=_by_high_y),
    )


def bucket_index(x: float, width: int) -> int:
    """floor(x / width): the fixed-width bucket that x falls in (width > 0).

    Uses floor division, which is exact, rather than rounding x / width first.
    """
    if width <= 0:
        raise ValueError(f"bucket width must be positive, got {width}")
    return int(x // width)


def group_into_buckets(points: Sequence[MaybePoint], width: int) -> dict[int, Bucket]:
    """Bucket index -> Bucket of the points in it, in increasing index; y None is skipped."""
    groups: dict[int, list[Point]] = {}
    for point in _present(points):
        groups.setdefault(bucket_index(point[0], width), []).append(point)
    return {index: summarize(groups[index]) for index in sorted(groups)}


def m4_points(buckets: Iterable[Bucket]) -> list[Point]:
    """M4 reduction (Jugel et al., VLDB 2014): first, min, max, last of every bucket.

    Drawing these four points per pixel column reproduces a line chart exactly, so every
    extreme survives. Returned deduplicated and sorted by x (then y).
    """
    kept: set[Point] = set()
    for bucket in buckets:
        kept.update((bucket.first, bucket.min, bucket.max, bucket.last))
    return sorted(kept)


def m4_arrays(x: IntArray, y: FloatArray) -> tuple[IntArray, FloatArray]:
    """`m4_points` on columns: x and y hold each bucket's first, min, max and last points
    (any shape, e.g. one row per bucket); returns them deduplicated and sorted by x, then y.

    x stays an integer column, so batch counts above 2**53 come back exact.
    """
    xs, ys = x.ravel(), y.ravel()
    order = np.lexsort((ys, xs))
    xs, ys = xs[order], ys[order]
    new = np.ones(len(xs), dtype=bool)
    new[1:] = (xs[1:] != xs[:-1]) | (ys[1:] != ys[:-1])
    return xs[new], ys[new]


def m4_groups(x: IntArray, y: FloatArray, groups: int) -> tuple[IntArray, FloatArray]:
    """Merge consecutive buckets into `groups` groups of near-equal bucket count.

    x and y are (buckets, 4) columns: each bucket's first, min, max and last points, the
    buckets in increasing x; the result has the same layout, one row per group, and each
    row is what `merge` makes of its buckets (the lowest min and highest max, the earliest
    on ties). Fewer buckets than `groups` come back as they are.
    """
    n = len(x)
    if n <= groups:
        return x, y
    starts = np.arange(groups, dtype=np.int64) * n // groups
    sizes = np.diff(starts, append=n)
    gx = np.empty((groups, 4), dtype=np.int64)
    gy = np.empty((groups, 4), dtype=np.float64)
    gx[:, 0], gy[:, 0] = x[starts, 0], y[starts, 0]
    gx[:, 3], gy[:, 3] = x[starts + sizes - 1, 3], y[starts + sizes - 1, 3]
    for column, best in ((1, np.minimum), (2, np.maximum)):
        values = y[:, column]
        hits = np.flatnonzero(values == np.repeat(best.reduceat(values, starts), sizes))
        # The first hit of each group: hits ascend, and every group has one.
        group_of = np.searchsorted(starts, hits, side="right") - 1
        pick = hits[np.searchsorted(group_of, np.arange(groups))]
        gx[:, column], gy[:, column] = x[pick, column], values[pick]
    return gx, gy


# --------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------


def downsample(points: Sequence[MaybePoint], max_points: int) -> list[Point]:
    """At most `max_points` points of a raw series: as is if short enough, else LTTB with
    the global min and max kept (see `downsample_buckets`)."""
    present = _present(points)
    return [present[i] for i in downsample_indices(present, max_points)]


def downsample_indices(points: Sequence[Point], max_points: int) -> list[int]:
    """Indices of the points `downsample` keeps, for callers that hold richer rows."""
    if max_points <= 0 or len(points) <= max_points:
        return list(range(len(points)))
    return series_indices(*_columns(points), max_points)


def series_indices(x: FloatArray, y: FloatArray, max_points: int) -> list[int]:
    """`downsample_indices` on columns (sorted by x, y never NaN), in increasing order."""
    n = len(x)
    if max_points <= 0 or n <= max_points:
        return list(range(n))
    if max_points < 3:
        return [0] if max_points == 1 else [0, n - 1]
    starts = _bucket_starts(n, max_points)
    chosen = _lttb_indices(x, y, starts)
    # argmin/argmax return the first occurrence: the earliest x among equal extremes.
    extremes = (int(np.argmin(y)), int(np.argmax(y)))
    return _keep_extremes(x, chosen, starts, extremes)


def _nearest_free_slot(
    x: FloatArray, chosen: list[int], protected: set[int], target: int
) -> int | None:
    """Slot whose chosen point is nearest in x to x[target] and not protected."""
    free = [s for s, i in enumerate(chosen) if i not in protected]
    if not free:
        return None
    at = x[target]
    return min(free, key=lambda s: (abs(x[chosen[s]] - at), s))


def _keep_extremes(
    x: FloatArray, chosen: list[int], starts: list[int], extremes: tuple[int, int]
) -> list[int]:
    """Put the global min and max back into LTTB's choice, keeping its length and x order.

    A missing extreme replaces the point chosen from its own LTTB bucket, which keeps x
    order because buckets are contiguous. If that point is itself protected (both extremes
    in one bucket), the nearest unprotected chosen point gives way instead, and the result
    is re-sorted. Both survive whenever threshold >= 4.
    """
    protected = {0, len(x) - 1, *extremes}
    chosen = list(chosen)
    for target in extremes:
        if target in chosen:
            continue
        slot = bisect.bisect_right(starts, target) - 1
        free = (
            slot
            if chosen[slot] not in protected
            else _nearest_free_slot(x, chosen, protected, target)
        )
        if free is not None:
            chosen[free] = target
    return sorted(chosen)


def downsample_buckets(buckets: Iterable[Bucket], max_points: int) -> list[Point]:
    """At most `max_points` points from pre-aggregated buckets: M4, then LTTB if still long.

    LTTB picks points by triangle area and can drop the global min or max (a narrow dip
    next to a wide swing loses to it), yet those are the values users look for on a chart;
    so after LTTB they are put back in place of their bucket's pick (`_keep_extremes`).
    """
    points = m4_points(buckets)
    if max_points <= 0 or len(points) <= max_points or max_points < 3:
        return lttb(points, max_points)
    return [points[i] for i in series_indices(*_columns(points), max_points)]
