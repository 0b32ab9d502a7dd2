"""Hyperparameter searchers: pure state machines that decide which trials run and how long.

The master feeds a searcher events (a trial was created, validated, closed, exited early)
and carries out the operations it returns (`Create`, `ValidateAfter`, `Close`,
`Shutdown`); it persists `snapshot()` with them and rebuilds the searcher with
`restore_searcher` after a restart. No I/O, clocks or threads: see `simulate` for a master
played in memory.

    searcher = make_searcher(config.searcher, config.hyperparameters, config.experiment_seed)
    ops = searcher.initial_operations()

Searchers: `single`, `grid`, `random`, `bayesian` (random with the tpe sampler), `asha`
and `adaptive_asha`, with `sampler: random | tpe | bohb` where trials are sampled (`bohb`:
a density model of the highest rung with enough results, see `_bohb`); and `pbt`,
population-based training (`_pbt`), whose `Create`s may start from another trial's
checkpoint; and `custom` (`_custom`), whose operations come from user code run outside
the master (`assay.client.searcher`): it queues the events for that code and applies the
batches of operations it answers with.
"""

from assay.config import BracketPreview, Preview, RungPreview, preview, rung_lengths

from ._asha import INVALID_HP_FACTOR, promotion_quota
from ._custom import MAX_METHOD_STATE, CustomSearcher, OperationsError
from ._multi import orient, pareto_ranks
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
from ._pbt import PBTSearcher
from ._searcher import make_searcher, restore_searcher

__all__ = [
    "EXITED_REASONS",
    "INVALID_HP_FACTOR",
    "BracketPreview",
    "Close",
    "Create",
    "CustomSearcher",
    "ExitedReason",
    "MAX_METHOD_STATE",
    "Operation",
    "OperationsError",
    "PBTSearcher",
    "Preview",
    "RungPreview",
    "Searcher",
    "Shutdown",
    "ValidateAfter",
    "make_searcher",
    "orient",
    "pareto_ranks",
    "preview",
    "promotion_quota",
    "restore_searcher",
    "rung_lengths",
]
