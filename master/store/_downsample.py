"""Downsampling of metric series for charts: LTTB over points, M4 over pre-aggregated buckets.

A metric series is a list of points `(x, y)` where x is `total_batches` and y the value.
Charts never need more points than they have pixels, so the store reduces a series before
sending it: `downsample` for raw points, `downsample_buckets` for rows pre-aggregated into
fixed-width buckets (`Bucket`, built by `summarize`/`merge`/`group_into_buckets`).

Everything here is pure and exact: no I/O, no floating-point tricks in index arithmetic.
A y of None stands for a NaN stored as SQL NULL; it is skipped everywhere.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

Point = tuple[float, float]
"""(x, y): x is total_batches, y the metric value."""

MaybePoint = tuple[float, float | None]
"""A point as read from storage, where a NaN value comes back as None."""


# --------------------------------------------------------------------------------------
# LTTB
# --------------------------------------------------------------------------------------


def _present(points: Sequence[MaybePoint]) -> list[Point]:
    """The points whose y is not None, in their original order."""
    return [(x, y) for x, y in points if y is not None]


def _boundary(k: int, n: int, threshold: int) -> int:
    """Start index of LTTB middle bucket k (exact integer form of floor(k * every) + 1)."""
    return k * (n - 2) // (threshold - 2) + 1


def _bucket_starts(n: int, threshold: int) -> list[int]:
    """Start index of each of the `threshold` LTTB slots: [first point, middles..., last point].

    Slot 0 is the first point alone, slots 1..threshold-2 the middle buckets, and the last
    slot the last point alone (the last middle bucket ends at n - 1).
    """
    return [0, *(_boundary(k, n, threshold) for k in range(threshold - 1))]


def _mean(points: Sequence[Point], start: int, end: int) -> Point:
    """Centroid of points[start:end] (non-empty), the third corner of LTTB's triangle."""
    count = end - start
    sx = sy = 0.0
    for i in range(start, end):
        sx += points[i][0]
        sy += points[i][1]
    return sx / count, sy / count


def _largest_triangle(points: Sequence[Point], a: Point, c: Point, start: int, end: int) -> int:
    """Index in [start, end) of the point forming the largest triangle with a and c.

    Ties go to the earliest index. The 1/2 factor is dropped: it does not change the argmax.
    """
    ax, ay = a
    cx, cy = c
    best, best_area = start, -1.0
    for i in range(start, end):
        px, py = points[i]
        area = abs((ax - cx) * (py - ay) - (ax - px) * (cy - ay))
        if area > best_area:
            best, best_area = i, area
    return best


def _lttb_indices(points: Sequence[Point], threshold: int) -> list[int]:
    """Indices LTTB keeps, one per slot of `_bucket_starts`; needs len(points) > threshold >= 3."""
    n = len(points)
    starts = [*_bucket_starts(n, threshold), n]
    chosen = [0]
    for slot in range(1, threshold - 1):
        # The next bucket's centroid; for the last middle bucket that is the last point.
        c = _mean(points, starts[slot + 1], starts[slot + 2])
        a = points[chosen[-1]]
        chosen.append(_largest_triangle(points, a, c, starts[slot], starts[slot + 1]))
    chosen.append(n - 1)
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
    return [present[i] for i in _lttb_indices(present, threshold)]


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
    if max_points < 3:
        return [0] if max_points == 1 else [0, len(points) - 1]
    return _keep_extremes(points, _lttb_indices(points, max_points), max_points)


def _extreme_indices(points: Sequence[Point]) -> tuple[int, int]:
    """Indices of the global min and global max point (earliest x on ties)."""
    indices = range(len(points))
    low = min(indices, key=lambda i: _by_low_y(points[i]))
    high = min(indices, key=lambda i: _by_high_y(points[i]))
    return low, high


def _nearest_free_slot(
    points: Sequence[Point], chosen: list[int], protected: set[int], target: int
) -> int | None:
    """Slot whose chosen point is nearest in x to points[target] and not protected."""
    free = [s for s, i in enumerate(chosen) if i not in protected]
    if not free:
        return None
    x = points[target][0]
    return min(free, key=lambda s: (abs(points[chosen[s]][0] - x), s))


def _keep_extremes(points: Sequence[Point], chosen: list[int], threshold: int) -> list[int]:
    """Put the global min and max back into LTTB's choice, keeping its length and x order.

    A missing extreme replaces the point chosen from its own LTTB bucket, which keeps x
    order because buckets are contiguous. If that point is itself protected (both extremes
    in one bucket), the nearest unprotected chosen point gives way instead, and the result
    is re-sorted. Both survive whenever threshold >= 4.
    """
    extremes = _extreme_indices(points)
    protected = {0, len(points) - 1, *extremes}
    starts = _bucket_starts(len(points), threshold)
    chosen = list(chosen)
    for target in extremes:
        if target in chosen:
            continue
        slot = bisect.bisect_right(starts, target) - 1
        free = (
            slot
            if chosen[slot] not in protected
            else _nearest_free_slot(points, chosen, protected, target)
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
    chosen = _keep_extremes(points, _lttb_indices(points, max_points), max_points)
    return [points[i] for i in chosen]
