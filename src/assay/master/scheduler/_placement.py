"""Where a gang of slots goes, as arithmetic on (agent id, free slot count) pairs."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def choose_agents(slots: int, free: Iterable[tuple[str, int]]) -> list[tuple[str, int]] | None:
    """Pick agents for `slots` slots from `free` (agent id, free count); None if none fit.

    One agent if any can hold them all: the one with the fewest free slots that still
    fits (best fit, so large holes stay open for large requests; ties by id). Otherwise
    the smallest k >= 2 that divides `slots` and has k agents with slots/k free each,
    again preferring the fullest agents; every chosen agent gives the same number of
    slots, so each distributed worker gets an equal share. Returns (agent id, count)
    pairs sorted by agent id.
    """
    ordered = sorted(free, key=lambda pair: (pair[1], pair[0]))
    for k in range(1, min(slots, len(ordered)) + 1):
        if slots % k:
            continue
        share = slots // k
        fitting = [agent for agent, count in ordered if count >= share][:k]
        if len(fitting) == k:
            return sorted((agent, share) for agent in fitting)
    return None


def choose_slots(count: int, free: Sequence[int], islands: Sequence[int] = ()) -> tuple[int, ...]:
    """Which `count` of an agent's `free` slot indices a request takes, ascending.

    `islands[s]` is slot s's island (GPUs joined by NVLink, else on one NUMA node; empty:
    every slot in island 0, as for CPU slots). One island if any has `count` free: the one
    with the fewest free that still fits (best fit, so large islands stay whole for large
    requests; ties by island number). Otherwise as few islands as possible: the largest
    ones whole, and the remainder from the smallest island that holds it. Within an island
    the lowest indices go first. Raises ValueError if fewer than `count` are free.
    """
    if count > len(free):
        raise ValueError(f"{count} slots wanted, only {len(free)} free")
    by_island: dict[int, list[int]] = {}
    for slot in sorted(free):
        by_island.setdefault(islands[slot] if islands else 0, []).append(slot)
    groups = sorted(by_island.items(), key=lambda item: (len(item[1]), item[0]))
    chosen: list[int] = []
    while len(chosen) < count:
        need = count - len(chosen)
        fitting = [g for g in groups if len(g[1]) >= need]
        island, slots = fitting[0] if fitting else groups[-1]  # best fit, else the largest
        chosen += slots[:need]
        groups.remove((island, slots))
    return tuple(sorted(chosen))


def largest_placement(capacities: Iterable[int]) -> int:
    """The most slots one request can get from agents with these free counts (0 if none).

    With k agents a request gets at most k times the k-th largest count, and exactly that
    many fits, so the answer is the best k.
    """
    descending = sorted(capacities, reverse=True)
    return max((k * count for k, count in enumerate(descending, start=1)), default=0)
