"""ASHA decisions step by step against hand-worked traces: promotions, pauses, closes,
ties, results that are not finite, metric direction and early exits."""

from __future__ import annotations

import math
from typing import Any

import pytest

from assay.master.searcher import (
    Close,
    Create,
    Operation,
    Searcher,
    Shutdown,
    ValidateAfter,
    make_searcher,
    restore_searcher,
)

from ._support import SPACE, config


def asha(max_trials: int = 4, concurrent: int = 1, **extra: Any) -> Searcher:
    # rungs at 100, 200 and 400 batches; the top half of each rung is promoted
    cfg = config(
        "asha",
        max_length=400,
        max_trials=max_trials,
        max_concurrent_trials=concurrent,
        divisor=2,
        num_rungs=3,
        **extra,
    )
    return make_searcher(cfg, SPACE, seed=1)


def plain(ops: list[Operation]) -> list[tuple[str, str] | tuple[str, str, int]]:
    """Operations without the sampled hyperparameters, for comparing with a trace."""
    out: list[tuple[str, str] | tuple[str, str, int]] = []
    for op in ops:
        if isinstance(op, Create):
            out.append(("create", op.request_id))
        elif isinstance(op, ValidateAfter):
            out.append(("validate", op.request_id, op.length))
        elif isinstance(op, Close):
            out.append(("close", op.request_id))
        else:
            out.append(("shutdown", ""))
    return out


def test_hand_worked_trace() -> None:
    s = asha()

    assert plain(s.initial_operations()) == [("create", "t0"), ("validate", "t0", 100)]
    # Alone in rung 0: floor(1/2) = 0 promotable, so t0 pauses and a new trial starts.
    assert plain(s.on_validation_completed("t0", 1.0, 100)) == [
        ("create", "t1"),
        ("validate", "t1", 100),
    ]
    # rung 0 = [t1 .5, t0 1.0]: t1 is the top half and goes on to 200.
    assert plain(s.on_validation_completed("t1", 0.5, 100)) == [("validate", "t1", 200)]
    # rung 1 = [t1]: nothing to promote, t1 pauses, t2 starts.
    assert plain(s.on_validation_completed("t1", 0.7, 200)) == [
        ("create", "t2"),
        ("validate", "t2", 100),
    ]
    # rung 0 = [t1, t0, t2 2.0]: t2 ranks 3rd; with 4 trials at most 2 are ever promoted
    # from rung 0, so t2 is closed at once.
    assert plain(s.on_validation_completed("t2", 2.0, 100)) == [
        ("close", "t2"),
        ("create", "t3"),
        ("validate", "t3", 100),
    ]
    assert s.on_trial_closed("t2") == []
    # rung 0 = [t1 .5, t3 .8, t0 1.0, t2]: t0 is pushed to 3rd and closed; t3 promoted.
    assert plain(s.on_validation_completed("t3", 0.8, 100)) == [
        ("close", "t0"),
        ("validate", "t3", 200),
    ]
    assert s.on_trial_closed("t0") == []
    # rung 1 = [t3 .6, t1 .7]: t3 goes to the top rung.
    assert plain(s.on_validation_completed("t3", 0.6, 200)) == [("validate", "t3", 400)]
    # The top rung closes t3; no trial left to create or promote, so the paused t1 closes.
    assert plain(s.on_validation_completed("t3", 0.4, 400)) == [("close", "t3"), ("close", "t1")]
    assert s.on_trial_closed("t3") == []
    # batches trained: 4 x 100 at rung 0, 2 x 100 to rung 1, 200 to the top = 800, the plan
    # of synchronous halving (4 x 100 + 2 x 100 + 1 x 200), so progress is capped below 1
    assert s.snapshot()["brackets"][0]["work"] == 800
    assert s.progress() == 0.99
    assert plain(s.on_trial_closed("t1")) == [("shutdown", "")]
    assert s.progress() == 1.0
    assert s.on_trial_closed("t1") == []  # after Shutdown nothing more happens


def test_ties_promote_the_earlier_result() -> None:
    s = asha(concurrent=2)
    s.initial_operations()

    assert plain(s.on_validation_completed("t0", 0.5, 100)) == [
        ("create", "t2"),
        ("validate", "t2", 100),
    ]
    assert plain(s.on_validation_completed("t1", 0.5, 100)) == [("validate", "t0", 200)]


def test_larger_is_better() -> None:
    s = asha(concurrent=2, smaller_is_better=False)
    s.initial_operations()
    s.on_validation_completed("t0", 0.9, 100)

    # accuracy 0.1 is worse than 0.9: t0 is promoted, not t1
    assert plain(s.on_validation_completed("t1", 0.1, 100)) == [("validate", "t0", 200)]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_metric_ranks_last_and_closes(bad: float) -> None:
    s = asha(concurrent=2)
    s.initial_operations()

    # A result that is not finite is never promoted: the trial is closed at once.
    assert plain(s.on_validation_completed("t0", bad, 100)) == [
        ("close", "t0"),
        ("create", "t2"),
        ("validate", "t2", 100),
    ]
    # ... and ranks below every finite result: t1 is the best of rung 0 and is promoted.
    assert plain(s.on_validation_completed("t1", 50.0, 100)) == [("validate", "t1", 200)]


def test_errored_trial_counts_as_the_worst_result_of_its_rung() -> None:
    s = asha(concurrent=2)
    s.initial_operations()
    s.on_validation_completed("t0", 1.0, 100)

    # rung 0 = [t0, t1 (errored)]: the quota becomes 1 and t0 is promoted.
    assert plain(s.on_trial_exited_early("t1", "errored")) == [("validate", "t0", 200)]
    snapshot = s.snapshot()
    assert snapshot["brackets"][0]["counted"] == 3  # t0, t1 and t2 count toward max_trials


def test_invalid_hp_is_replaced_without_counting() -> None:
    s = asha(max_trials=2, concurrent=1)
    s.initial_operations()

    assert plain(s.on_trial_exited_early("t0", "invalid_hp")) == [
        ("create", "t1"),
        ("validate", "t1", 100),
    ]
    assert s.snapshot()["brackets"][0]["counted"] == 1


def test_invalid_hp_replacement_is_capped() -> None:
    s = make_searcher(config("random", max_trials=2, max_concurrent_trials=1), SPACE, seed=0)
    ops = s.initial_operations()
    created = 0
    while not any(isinstance(op, Shutdown) for op in ops):
        (create, _) = ops
        assert isinstance(create, Create)
        created += 1
        ops = s.on_trial_exited_early(create.request_id, "invalid_hp")

    # 10 x max_trials replacements, then invalid trials count: 20 + 2 trials in all
    assert created == 22


def test_grid_does_not_replace_invalid_points() -> None:
    space = {"a": SPACE["optimizer"]}
    s = make_searcher(config("grid", max_concurrent_trials=1), space, seed=0)
    ops = s.initial_operations()
    seen = []
    while not any(isinstance(op, Shutdown) for op in ops):
        create = ops[0]
        assert isinstance(create, Create)
        seen.append(create.hparams["a"])
        ops = s.on_trial_exited_early(create.request_id, "invalid_hp")

    assert seen == ["sgd", "adam", "rmsprop"]


def test_user_canceled_paused_trial_is_never_promoted() -> None:
    s = asha(concurrent=1)
    s.initial_operations()
    s.on_validation_completed("t0", 0.1, 100)  # paused, t1 starts
    assert s.on_trial_exited_early("t0", "user_canceled") == []

    # rung 0 = [t0 .1 (gone), t1 .5]: t0 would be promoted, but it exited; t1 is not in
    # the top half, so a new trial starts.
    assert plain(s.on_validation_completed("t1", 0.5, 100)) == [
        ("create", "t2"),
        ("validate", "t2", 100),
    ]


def test_protocol_errors_are_refused() -> None:
    s = asha(concurrent=1)
    s.initial_operations()

    with pytest.raises(ValueError, match="unknown trial request id 'nope'"):
        s.on_validation_completed("nope", 1.0, 100)
    with pytest.raises(ValueError, match="at 50 batches; it was asked to validate after 100"):
        s.on_validation_completed("t0", 1.0, 50)
    with pytest.raises(ValueError, match="closed, but the searcher did not close it"):
        s.on_trial_closed("t0")
    with pytest.raises(ValueError, match="exit reason must be one of"):
        s.on_trial_exited_early("t0", "bored")  # type: ignore[arg-type]
    s.on_validation_completed("t0", 1.0, 100)
    with pytest.raises(ValueError, match="reported a validation but is paused"):
        s.on_validation_completed("t0", 1.0, 100)


def test_restore_refuses_a_snapshot_of_another_search() -> None:
    s = asha()
    s.initial_operations()
    snapshot = s.snapshot()

    with pytest.raises(ValueError, match="snapshot is of a 'asha' searcher"):
        restore_searcher(config("random", max_trials=3), SPACE, 1, snapshot)
    longer = config("asha", max_length=800, max_trials=4, divisor=2, num_rungs=3)
    with pytest.raises(ValueError, match=r"rungs \[100, 200, 400\] and 4 trials; the config"):
        restore_searcher(longer, SPACE, 1, snapshot)
    with pytest.raises(ValueError, match="version 99 is not supported"):
        restore_searcher(config("asha", max_length=400, max_trials=4), SPACE, 1, {"version": 99})


def test_epoch_lengths_are_refused() -> None:
    from dataclasses import replace

    from assay.config import Length

    cfg = replace(config("single"), max_length=Length.epochs(3))
    with pytest.raises(ValueError, match=r"searcher.max_length: the searchers count batches"):
        make_searcher(cfg, SPACE, 0)
