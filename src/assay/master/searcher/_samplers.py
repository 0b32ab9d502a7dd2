"""Where a new trial's hyperparameters and seed come from: random draws or the grid.

Proposals are pure functions of the experiment seed and the trial's index, so a restored
searcher proposes exactly what the original would have, with no random state to save.
The grid's point `index` is computed from the index alone, so a grid is never listed
whole. The TPE sampler (`_tpe.py`) has the same interface and keeps its history in the
snapshot.
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Mapping
from typing import Any, Protocol

from assay.config import (
    MAX_GRID_POINTS,
    HParam,
    assemble,
    grid_size,
    grid_values,
    leaves,
    sample_hparams,
)


def derive_seed(seed: int, purpose: str, index: int) -> int:
    """A 31-bit seed for `purpose` and `index`, stable across processes and platforms
    (string seeds go through SHA-512, not Python's salted hash)."""
    return random.Random(f"assay:{purpose}:{seed}:{index}").randrange(2**31)


class Sampler(Protocol):
    """Proposes hyperparameters for trial `index` and learns from validations."""

    def propose(self, index: int, request_id: str) -> dict[str, Any]: ...

    def observe(self, request_id: str, length: int, value: float | None) -> None:
        """A validation at `length`; `value` is smaller-is-better, None if not finite."""

    def forget(self, request_id: str) -> None:
        """The trial's hyperparameters were unusable: drop what was learnt from it."""

    def snapshot(self) -> dict[str, Any]: ...

    def restore(self, state: Mapping[str, Any]) -> None: ...


class RandomSampler:
    """Uniform draws (log types uniform in the exponent), one RNG per trial index."""

    def __init__(self, space: Mapping[str, HParam], seed: int) -> None:
        self._space = space
        self._seed = seed

    def propose(self, index: int, request_id: str) -> dict[str, Any]:
        rng = random.Random(derive_seed(self._seed, "hparams", index))
        return sample_hparams(self._space, rng)

    def observe(self, request_id: str, length: int, value: float | None) -> None:
        pass  # random search learns nothing

    def forget(self, request_id: str) -> None:
        pass

    def snapshot(self) -> dict[str, Any]:
        return {}

    def restore(self, state: Mapping[str, Any]) -> None:
        pass


class GridSampler:
    """The grid's points in order: trial `index` gets point `index` (a grid never replaces
    a trial, so indices and points stay aligned). The order is `grid_points`': the
    Cartesian product of each leaf's `grid_values`, the first leaf varying slowest."""

    def __init__(self, space: Mapping[str, HParam]) -> None:
        if grid_size(space) > MAX_GRID_POINTS:
            raise ValueError(f"the grid has more than {MAX_GRID_POINTS:,} points")
        self._space = space
        pairs = leaves(space)
        self._paths = [path for path, _ in pairs]
        self._axes = [grid_values(hp) for _, hp in pairs]
        self.size = math.prod(len(axis) for axis in self._axes)

    def point(self, index: int) -> dict[str, Any]:
        """Point `index` of the grid: `index` in mixed radix, one digit per leaf."""
        if not 0 <= index < self.size:
            raise ValueError(f"grid point {index} requested; the grid has {self.size}")
        digits = []
        for axis in reversed(self._axes):
            index, digit = divmod(index, len(axis))
            digits.append(digit)
        values = {
            path: axis[digit]
            for path, axis, digit in zip(self._paths, self._axes, reversed(digits), strict=True)
        }
        return copy.deepcopy(assemble(self._space, values))

    def propose(self, index: int, request_id: str) -> dict[str, Any]:
        return self.point(index)

    def observe(self, request_id: str, length: int, value: float | None) -> None:
        pass

    def forget(self, request_id: str) -> None:
        pass

    def snapshot(self) -> dict[str, Any]:
        return {}

    def restore(self, state: Mapping[str, Any]) -> None:
        pass
