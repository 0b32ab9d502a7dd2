"""Population-based training (PBT, Jaderberg et al. 2017; Determined's `pbt` searcher).

A population of `population_size` trials trains in rounds. In each round every member
trains `length_per_round` more batches and validates (a member that has validated waits,
paused and checkpointed, for the rest). When the round is complete:

- exploit: the worst `truncate_fraction` of the population are closed, and each is
  replaced by a new trial that starts from the latest checkpoint of a member drawn at
  random from the best `truncate_fraction` (`Create(checkpoint_from=...)`); members that
  exited early are replaced the same way, so the population keeps its size;
- explore: each hyperparameter of the copy is redrawn from its range with
  `resample_probability`, else a number is multiplied by `1 + perturb_factor` or
  `1 - perturb_factor` (clamped to its range, rounded for an int) and a categorical moves
  to a neighbouring value;
- the other members go on from where they paused.

After the last round every member is closed. The draws of round `r` come from a generator
seeded by the experiment seed and `r`, so the search is a pure function of the seed and
the results, and a restored searcher decides exactly as the original.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from typing import Any

from assay.config import (
    Categorical,
    Const,
    Double,
    HParam,
    Int,
    Log,
    PBTSpec,
    assemble,
    leaves,
    sample_hparams,
)

from ._ops import (
    EXITED_REASONS,
    Close,
    Create,
    ExitedReason,
    Operation,
    Searcher,
    Shutdown,
    ValidateAfter,
)
from ._samplers import derive_seed

SNAPSHOT_VERSION = 1


class PBTSearcher(Searcher):
    """Population-based training behind the `Searcher` interface (see the module doc)."""

    def __init__(
        self,
        spec: PBTSpec,
        space: Mapping[str, HParam],
        *,
        seed: int,
        smaller_is_better: bool,
    ) -> None:
        self.spec = spec
        self._space = space
        self._seed = seed
        self._sign = 1.0 if smaller_is_better else -1.0
        self.round = 0
        self._next_index = 0
        self.members: list[str] = []  # this round's population, in creation order
        self.results: dict[str, float | None] = {}  # members that validated this round
        self.hparams: dict[str, dict[str, Any]] = {}  # of the members
        self.parents: dict[str, str] = {}  # request id -> the member it was copied from
        self.closing: set[str] = set()  # closed, not yet stopped
        self._done = False  # no round is left to run
        self._shutdown = False

    # --- events --------------------------------------------------------------------------

    def initial_operations(self) -> list[Operation]:
        if self.members or self._done:
            return []
        ops: list[Operation] = []
        for _ in range(self.spec.population_size):
            index = self._next_index
            hparams = sample_hparams(
                self._space, random.Random(derive_seed(self._seed, "hparams", index))
            )
            ops += self._create(hparams, None)
        return ops

    def on_trial_created(self, request_id: str) -> list[Operation]:
        self._member(request_id)
        return []

    def on_validation_completed(
        self, request_id: str, metric: float, length: int
    ) -> list[Operation]:
        self._member(request_id)
        if request_id in self.results:
            raise ValueError(f"trial {request_id!r} validated twice in round {self.round}")
        value = float(metric)
        self.results[request_id] = self._sign * value if math.isfinite(value) else None
        return self._after_event()

    def on_trial_closed(self, request_id: str) -> list[Operation]:
        if request_id not in self.closing:
            raise ValueError(f"trial {request_id!r} was not closed by the searcher")
        self.closing.discard(request_id)
        return self._after_event()

    def on_trial_exited_early(self, request_id: str, reason: ExitedReason) -> list[Operation]:
        if reason not in EXITED_REASONS:
            raise ValueError(f"exit reason must be one of {EXITED_REASONS}, got {reason!r}")
        if request_id in self.closing:
            self.closing.discard(request_id)  # it stopped before its close reached it
        else:
            self._member(request_id)
            self.members.remove(request_id)
            self.results.pop(request_id, None)
            self.hparams.pop(request_id, None)
        return self._after_event()

    def progress(self) -> float:
        if self._shutdown:
            return 1.0
        done = self.round + len(self.results) / max(len(self.members), 1)
        return min(0.99, done / self.spec.num_rounds)

    # --- decisions -----------------------------------------------------------------------

    def _member(self, request_id: str) -> None:
        if request_id not in self.members:
            raise ValueError(f"unknown trial request id {request_id!r} (not in the population)")

    def _after_event(self) -> list[Operation]:
        ops: list[Operation] = []
        if not self._done and len(self.results) == len(self.members):
            ops += self._end_round()
        if self._done and not self.closing and not self._shutdown:
            self._shutdown = True
            ops.append(Shutdown())
        return ops

    def ranked(self) -> list[str]:
        """This round's members best first (a metric that is not finite ranks last)."""

        def key(rid: str) -> tuple[bool, float, int]:
            value = self.results[rid]
            return (value is None, value if value is not None else 0.0, int(rid[1:]))

        return sorted(self.members, key=key)

    def _end_round(self) -> list[Operation]:
        ranked = self.ranked()
        if not ranked or self.round + 1 >= self.spec.num_rounds:
            self._done = True
            self.closing.update(ranked)
            self.members, self.results, self.hparams = [], {}, {}
            return [Close(rid) for rid in ranked]
        replaced = min(self.spec.replaced_per_round, len(ranked) - 1)
        survivors, losers = ranked[: len(ranked) - replaced], ranked[len(ranked) - replaced :]
        best = ranked[: max(min(self.spec.replaced_per_round, len(ranked)), 1)]
        ops: list[Operation] = [Close(rid) for rid in losers]
        self.closing.update(losers)
        rng = random.Random(derive_seed(self._seed, "pbt", self.round))
        self.round += 1
        copies = []
        for _ in range(self.spec.population_size - len(survivors)):
            parent = best[rng.randrange(len(best))]
            copies.append((parent, self.explore(self.hparams[parent], rng)))
        for rid in losers:
            self.hparams.pop(rid)
        self.members, self.results = list(survivors), {}
        for parent, hparams in copies:
            ops += self._create(hparams, parent)
        ops += [ValidateAfter(rid, self._length()) for rid in survivors]
        return ops

    def _length(self) -> int:
        return (self.round + 1) * self.spec.length_per_round

    def _create(self, hparams: dict[str, Any], parent: str | None) -> list[Operation]:
        index = self._next_index
        self._next_index += 1
        rid = f"t{index}"
        self.members.append(rid)
        self.hparams[rid] = hparams
        if parent is not None:
            self.parents[rid] = parent
        seed = derive_seed(self._seed, "trial", index)
        create = Create(rid, hparams, seed, checkpoint_from=parent, round=self.round)
        return [create, ValidateAfter(rid, self._length())]

    def explore(self, hparams: Mapping[str, Any], rng: random.Random) -> dict[str, Any]:
        """A perturbed copy of `hparams` (see the module doc); uses `rng` only."""
        values: dict[tuple[str, ...], Any] = {}
        factor = self.spec.perturb_factor
        for path, hp in leaves(self._space):
            current: Any = hparams
            for name in path:
                current = current[name]
            if isinstance(hp, Const):
                values[path] = hp.val
                continue
            if rng.random() < self.spec.resample_probability:
                values[path] = sample_hparams({"x": hp}, rng)["x"]
                continue
            up = rng.random() < 0.5
            if isinstance(hp, Categorical):
                values[path] = _neighbour(hp, current, up)
                continue
            scaled = float(current) * (1 + factor if up else 1 - factor)
            if isinstance(hp, Int):
                values[path] = min(max(round(scaled), hp.minval), hp.maxval)
            elif isinstance(hp, Log):
                low, high = sorted((hp.base**hp.minval, hp.base**hp.maxval))
                values[path] = min(max(scaled, low), high)
            elif isinstance(hp, Double):
                values[path] = min(max(scaled, hp.minval), hp.maxval)
        return assemble(self._space, values)

    # --- snapshot ------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        return {
            "version": SNAPSHOT_VERSION,
            "searcher": "pbt",
            "round": self.round,
            "next_index": self._next_index,
            "members": list(self.members),
            "results": dict(self.results),
            "hparams": {rid: self.hparams[rid] for rid in self.members},
            "parents": dict(self.parents),
            "closing": sorted(self.closing, key=lambda rid: int(rid[1:])),
            "done": self._done,
            "shutdown": self._shutdown,
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Load a `snapshot()`; raise ValueError if it belongs to another search."""
        if state.get("version") != SNAPSHOT_VERSION or state.get("searcher") != "pbt":
            raise ValueError(
                f"the snapshot is of a {state.get('searcher')!r} searcher (version "
                f"{state.get('version')!r}); the config gives pbt (version {SNAPSHOT_VERSION})"
            )
        self.round = int(state["round"])
        self._next_index = int(state["next_index"])
        self.members = [str(rid) for rid in state["members"]]
        self.results = {
            str(rid): None if v is None else float(v) for rid, v in state["results"].items()
        }
        self.hparams = {str(rid): dict(hp) for rid, hp in state["hparams"].items()}
        self.parents = {str(k): str(v) for k, v in state["parents"].items()}
        self.closing = {str(rid) for rid in state["closing"]}
        self._done = bool(state["done"])
        self._shutdown = bool(state["shutdown"])


def _neighbour(hp: Categorical, current: Any, up: bool) -> Any:
    """The value next to `current` in `hp.vals` (towards the end when `up`), or the one
    on the other side at an end."""
    if current not in hp.vals:
        return hp.vals[0]
    i = hp.vals.index(current)
    if len(hp.vals) == 1:
        return current
    j = i + 1 if up else i - 1
    if not 0 <= j < len(hp.vals):
        j = i - 1 if up else i + 1
    return hp.vals[j]
