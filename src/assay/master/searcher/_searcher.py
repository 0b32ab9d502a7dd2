"""The searcher the master drives: brackets of successive halving sharing one sampler.

Every searcher name is this one machine with a different plan (`assay.config.SearchSpec`):
`single`, `grid`, `random` and `bayesian` (random with the tpe sampler) are one bracket of
one rung, `asha` one bracket of several rungs, and `adaptive_asha` several brackets, as
Determined splits them. Free slots go to the brackets in turn (round robin), each within
its own concurrency limit and all within `max_concurrent_trials`. Trials are created only
into free slots, as earlier ones end: `search_spec` bounds every bracket (16 trials at
once by default for grid, random and bayesian), so no search, however large, is created
at once, and the grid's points are computed one at a time from their index.

Request ids are `t0`, `t1`, ... in creation order across brackets; trial `i` gets the seed
and (random) hyperparameters derived from the experiment seed and `i`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from assay.config import (
    HParam,
    LengthUnit,
    SearcherConfig,
    SearchSpec,
    pbt_spec,
    preview,
    search_spec,
)

from ._asha import Bracket
from ._custom import CustomSearcher
from ._multi import MultiTPESampler, orient
from ._ops import EXITED_REASONS, Create, ExitedReason, Operation, Searcher, Shutdown
from ._pbt import PBTSearcher
from ._samplers import GridSampler, RandomSampler, Sampler, derive_seed

SNAPSHOT_VERSION = 1


class HalvingSearcher(Searcher):
    """Successive-halving brackets behind the `Searcher` interface (see the module doc)."""

    def __init__(
        self,
        spec: SearchSpec,
        sampler: Sampler,
        *,
        seed: int,
        smaller_is_better: bool,
        budgets: tuple[int, ...],
        objectives: Sequence[bool] = (),
    ) -> None:
        self.spec = spec
        # A multi-objective search's smaller_is_better per metric (empty for one metric).
        self._objectives = tuple(objectives)
        self._sampler = sampler
        self._seed = seed
        self._sign = 1.0 if smaller_is_better else -1.0
        self._budget = sum(budgets)
        replace = spec.sampler != "grid"  # a grid point has no replacement
        self.brackets = [Bracket(b, spec.divisor, replace_invalid=replace) for b in spec.brackets]
        self._owner: dict[str, Bracket] = {}
        self._next_index = 0
        self._turn = 0
        self._shutdown = False

    # --- events --------------------------------------------------------------------------

    def initial_operations(self) -> list[Operation]:
        return self._after_event()

    def on_trial_created(self, request_id: str) -> list[Operation]:
        self._bracket(request_id)
        return []

    def on_validation_completed(
        self, request_id: str, metric: float | Sequence[float | None], length: int
    ) -> list[Operation]:
        """`metric`: the searcher metric, or in a multi-objective search every metric in
        the config's order (None or NaN where a trial did not report one)."""
        if isinstance(metric, Sequence):
            if len(metric) != len(self._objectives) or not metric:
                raise ValueError(
                    f"a validation of {len(metric)} metrics for a search of {len(self._objectives)}"
                )
            vector = orient(metric, self._objectives)
            first = vector[0]
            value = first if math.isfinite(first) else None
            ops = self._bracket(request_id).report(request_id, value, length)
            if isinstance(self._sampler, MultiTPESampler):
                self._sampler.observe_vector(request_id, length, vector)
            else:
                self._sampler.observe(request_id, length, value)
            return ops + self._after_event()
        value = self.normalize(metric)
        ops = self._bracket(request_id).report(request_id, value, length)
        self._sampler.observe(request_id, length, value)
        return ops + self._after_event()

    def on_trial_closed(self, request_id: str) -> list[Operation]:
        self._bracket(request_id).closed(request_id)
        return self._after_event()

    def on_trial_exited_early(self, request_id: str, reason: ExitedReason) -> list[Operation]:
        if reason not in EXITED_REASONS:
            raise ValueError(f"exit reason must be one of {EXITED_REASONS}, got {reason!r}")
        ops, replaced = self._bracket(request_id).exit(request_id, reason)
        if replaced:
            self._sampler.forget(request_id)
        return ops + self._after_event()

    def progress(self) -> float:
        if self._shutdown:
            return 1.0
        return min(0.99, sum(b.work for b in self.brackets) / max(self._budget, 1))

    # --- decisions -----------------------------------------------------------------------

    def normalize(self, metric: float) -> float | None:
        """The metric as smaller-is-better; None when it is not finite."""
        value = float(metric)
        return self._sign * value if math.isfinite(value) else None

    def _bracket(self, request_id: str) -> Bracket:
        bracket = self._owner.get(request_id)
        if bracket is None:
            raise ValueError(f"unknown trial request id {request_id!r}")
        return bracket

    def _after_event(self) -> list[Operation]:
        if self._shutdown:
            return []
        ops = self._fill()
        for bracket in self.brackets:
            if bracket.idle():
                ops += bracket.close_paused()
        if all(b.finished() for b in self.brackets):
            self._shutdown = True
            ops.append(Shutdown())
        return ops

    def _fill(self) -> list[Operation]:
        """Give free slots to the brackets in turn: a promotion first, else a new trial."""
        ops: list[Operation] = []
        limit = self.spec.max_concurrent_trials
        n = len(self.brackets)
        while not limit or sum(b.live for b in self.brackets) < limit:
            for step in range(n):
                k = (self._turn + step) % n
                bracket = self.brackets[k]
                if not bracket.has_room():
                    continue
                job = bracket.best_promotable()
                if job is not None:
                    ops.append(bracket.promote(*job))
                elif bracket.can_create():
                    ops += self._create(bracket)
                else:
                    continue
                self._turn = (k + 1) % n
                break
            else:
                return ops
        return ops

    def _create(self, bracket: Bracket) -> list[Operation]:
        index = self._next_index
        self._next_index += 1
        request_id = f"t{index}"
        self._owner[request_id] = bracket
        hparams = self._sampler.propose(index, request_id)
        seed = derive_seed(self._seed, "trial", index)
        return [Create(request_id, hparams, seed), bracket.add_trial(request_id)]

    # --- snapshot ------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        return {
            "version": SNAPSHOT_VERSION,
            "searcher": self.spec.name,
            "next_index": self._next_index,
            "turn": self._turn,
            "shutdown": self._shutdown,
            "brackets": [b.snapshot() for b in self.brackets],
            "sampler": self._sampler.snapshot(),
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Load a `snapshot()`; raise ValueError if it belongs to another search."""
        if state.get("version") != SNAPSHOT_VERSION:
            raise ValueError(
                f"searcher snapshot version {state.get('version')!r} is not supported "
                f"(this master reads version {SNAPSHOT_VERSION})"
            )
        if state.get("searcher") != self.spec.name or len(state["brackets"]) != len(self.brackets):
            raise ValueError(
                f"the snapshot is of a {state.get('searcher')!r} searcher with "
                f"{len(state['brackets'])} brackets; the config gives {self.spec.name!r} with "
                f"{len(self.brackets)}"
            )
        for bracket, saved in zip(self.brackets, state["brackets"], strict=True):
            bracket.restore(saved)
        self._sampler.restore(state["sampler"])
        self._next_index = int(state["next_index"])
        self._turn = int(state["turn"])
        self._shutdown = bool(state["shutdown"])
        self._owner = {rid: b for b in self.brackets for rid in b.trials}


def make_searcher(config: SearcherConfig, space: Mapping[str, HParam], seed: int) -> Searcher:
    """The searcher `config` names, over `space`, seeded by the experiment seed.

    Raises ValueError for options the config rules refuse, and for a `max_length` in
    epochs (the master counts batches).
    """
    return _make(config, space, seed)


def restore_searcher(
    config: SearcherConfig, space: Mapping[str, HParam], seed: int, snapshot: Mapping[str, Any]
) -> Searcher:
    """The searcher of `make_searcher`, in the state `snapshot` recorded."""
    searcher = _make(config, space, seed)
    searcher.restore(snapshot)
    return searcher


def _make(
    config: SearcherConfig, space: Mapping[str, HParam], seed: int
) -> HalvingSearcher | PBTSearcher | CustomSearcher:
    if config.max_length.unit is not LengthUnit.BATCHES:
        raise ValueError(
            f"searcher.max_length: the searchers count batches; got "
            f"{config.max_length.to_dict()}, give e.g. {{batches: 1000}}"
        )
    if config.name == "custom":
        from assay.config import UNBOUNDED_LENGTH

        bound = config.max_length.value
        return CustomSearcher(
            space,
            seed=seed,
            max_trials=config.max_trials,
            max_length=None if bound >= UNBOUNDED_LENGTH else bound,
        )
    if config.name == "pbt":
        return PBTSearcher(
            pbt_spec(config), space, seed=seed, smaller_is_better=config.smaller_is_better
        )
    spec = search_spec(config, space)
    sampler: Sampler
    if spec.sampler == "grid":
        sampler = GridSampler(space)
    elif spec.sampler == "tpe" and config.objectives:
        sampler = MultiTPESampler(space, seed, len(config.objectives))
    elif spec.sampler == "tpe":
        from ._tpe import TPESampler

        sampler = TPESampler(space, seed)
    elif spec.sampler == "bohb":
        from ._bohb import BOHBSampler

        sampler = BOHBSampler(space, seed, spec.random_fraction)
    else:
        sampler = RandomSampler(space, seed)
    budgets = tuple(b.budget for b in preview(config, space).brackets)
    return HalvingSearcher(
        spec,
        sampler,
        seed=seed,
        smaller_is_better=config.smaller_is_better,
        budgets=budgets,
        objectives=[o.smaller_is_better for o in config.objectives],
    )
