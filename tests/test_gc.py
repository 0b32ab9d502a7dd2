"""The checkpoint GC policy, a pure function: hand-computed cases and a simulation."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from assay.master.checkpoints import GCPolicy, TrialCheckpoints, checkpoints_to_delete
from assay.master.store import CheckpointRecord


def ckpt(
    name: str, trial_id: int, batches: int, metric: float | None, state: str = "COMPLETED"
) -> CheckpointRecord:
    metrics: dict[str, Any] = {} if metric is None else {"val_loss": metric}
    return CheckpointRecord(
        uuid=name,
        trial_id=trial_id,
        run_id=1,
        total_batches=batches,
        state=state,
        location=f"/ckpts/{name}",
        files={"models.pt": 1},
        user_metadata={"validation_metrics": metrics},
    )


# Trial 1: a10 0.5, a20 0.3 (its best), a30 0.4, a40 without a validation (its latest).
# Trial 2: b10 0.1 (the experiment's best), b20 0.2.
A = [
    ckpt("a10", 1, 10, 0.5),
    ckpt("a20", 1, 20, 0.3),
    ckpt("a30", 1, 30, 0.4),
    ckpt("a40", 1, 40, None),
]
B = [ckpt("b10", 2, 10, 0.1), ckpt("b20", 2, 20, 0.2)]


def run(
    a_ended: bool = True,
    b_ended: bool = False,
    experiment_ended: bool = False,
    a: list[CheckpointRecord] | None = None,
    **policy: Any,
) -> set[str]:
    rule = GCPolicy(**{"metric": "val_loss", **policy})
    trials = [TrialCheckpoints(1, a or A, a_ended), TrialCheckpoints(2, B, b_ended)]
    return checkpoints_to_delete(rule, trials, experiment_ended=experiment_ended)


def test_defaults_keep_each_ended_trials_latest_and_best() -> None:
    assert run() == {"a10", "a30"}


def test_trials_that_have_not_ended_are_untouched() -> None:
    assert run(a_ended=False, b_ended=False) == set()
    assert run(save_trial_best=0, save_trial_latest=0) == {"a10", "a20", "a30", "a40"}


def test_experiment_end_makes_every_trial_a_candidate() -> None:
    assert run(a_ended=False, experiment_ended=True) == {"a10", "a30"}
    assert run(experiment_ended=True, save_trial_best=0) == {"a10", "a20", "a30", "b10"}


def test_more_latest_keeps_the_newest_n() -> None:
    assert run(save_trial_latest=2) == {"a10"}
    assert run(save_trial_latest=4) == set()


def test_without_best_only_the_latest_survives() -> None:
    assert run(save_trial_best=0) == {"a10", "a20", "a30"}


def test_a_checkpoint_without_the_metric_is_kept_only_as_a_latest() -> None:
    assert run(save_trial_best=5) == set()  # a40 survives as the latest
    assert run(save_trial_best=5, save_trial_latest=0) == {"a40"}


def test_larger_is_better() -> None:
    assert run(smaller_is_better=False) == {"a20", "a30"}  # a10 (0.5) is the best now


def test_experiment_best_ranks_across_trials() -> None:
    everything = {"a10", "a20", "a30", "a40", "b10", "b20"}
    kept = everything - run(
        experiment_ended=True, save_trial_best=0, save_trial_latest=0, save_experiment_best=3
    )
    assert kept == {"b10", "b20", "a20"}
    # A trial ending early keeps what is among the experiment's best so far.
    assert run(save_trial_best=0, save_trial_latest=0, save_experiment_best=3) == {
        "a10",
        "a30",
        "a40",
    }


def test_deleted_checkpoints_neither_count_nor_return() -> None:
    a = [A[0], ckpt("a20", 1, 20, 0.3, state="DELETED"), A[2], A[3]]
    assert run(a=a) == {"a10"}  # a30 is the best left


def test_equal_batches_share_a_latest_rank() -> None:
    a = [*A, ckpt("a40bis", 1, 40, None)]
    assert run(a=a, save_trial_best=0) == {"a10", "a20", "a30"}


def test_equal_metrics_keep_exactly_n_the_earlier_first() -> None:
    a = [ckpt("x", 1, 10, 0.3), ckpt("y", 1, 20, 0.3), ckpt("z", 1, 30, 0.9)]
    assert run(a=a) == {"y"}


def test_nan_and_non_numbers_count_as_no_metric() -> None:
    a = [ckpt("n", 1, 10, math.nan), ckpt("s", 1, 20, None), ckpt("z", 1, 30, None)]
    a[1] = CheckpointRecord(
        **{**a[1].__dict__, "user_metadata": {"validation_metrics": {"val_loss": "x"}}}
    )
    assert run(a=a, save_trial_latest=0) == {"n", "s", "z"}


def test_counts_are_checked() -> None:
    with pytest.raises(ValueError, match="save_trial_best must be an integer >= 0, got -1"):
        GCPolicy(save_trial_best=-1)


# --- a simulation: collecting at each trial's end, then at the experiment's end, deletes
# exactly what one collection at the experiment's end would. -----------------------------

events = st.lists(
    st.tuples(
        st.integers(0, 3),  # trial
        st.one_of(st.none(), st.integers(0, 5).map(float)),  # metric (ties likely)
    ),
    min_size=1,
    max_size=30,
)
policies = st.builds(
    GCPolicy,
    save_trial_best=st.integers(0, 2),
    save_trial_latest=st.integers(0, 2),
    save_experiment_best=st.integers(0, 3),
    metric=st.just("val_loss"),
    smaller_is_better=st.booleans(),
)


@settings(max_examples=300, deadline=None)
@given(events=events, policy=policies)
def test_incremental_collection_equals_one_at_the_end(
    events: list[tuple[int, float | None]], policy: GCPolicy
) -> None:
    stored: dict[int, list[CheckpointRecord]] = {t: [] for t in range(4)}
    batches = dict.fromkeys(range(4), 0)
    for n, (trial, metric) in enumerate(events):
        batches[trial] += 10
        stored[trial].append(ckpt(f"c{n}", trial, batches[trial], metric))
    every = {t: list(cs) for t, cs in stored.items()}
    last_event = {trial: n for n, (trial, _) in enumerate(events)}

    live: dict[int, list[CheckpointRecord]] = {t: [] for t in range(4)}
    ended: set[int] = set()
    for n, (trial, _) in enumerate(events):
        live[trial].append(next(c for c in every[trial] if c.uuid == f"c{n}"))
        if last_event[trial] == n:
            ended.add(trial)
            doomed = checkpoints_to_delete(
                policy,
                [TrialCheckpoints(t, live[t], t in ended) for t in range(4)],
                experiment_ended=False,
            )
            assert all(c.trial_id in ended for cs in live.values() for c in cs if c.uuid in doomed)
            live = {t: [c for c in cs if c.uuid not in doomed] for t, cs in live.items()}
    doomed = checkpoints_to_delete(
        policy, [TrialCheckpoints(t, live[t], True) for t in range(4)], experiment_ended=True
    )
    incremental = {c.uuid for cs in live.values() for c in cs} - doomed

    once = checkpoints_to_delete(
        policy, [TrialCheckpoints(t, every[t], True) for t in range(4)], experiment_ended=True
    )
    assert incremental == {c.uuid for cs in every.values() for c in cs} - once
