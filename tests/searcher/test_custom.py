"""The custom searcher's master side: the event queue a runner reads, the batches of
operations it answers with (checked whole), and restart safety as a property: a snapshot
through JSON at any point, restored, queues the same events and takes the same batches."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from assay.config import Length, SearcherConfig
from assay.master.searcher import (
    MAX_METHOD_STATE,
    Close,
    Create,
    CustomSearcher,
    Operation,
    OperationsError,
    Shutdown,
    ValidateAfter,
    make_searcher,
    restore_searcher,
)

from ._support import SPACE

POINT = {"lr": 0.01, "optimizer": "adam", "model": {"width": 32, "dropout": 0.1}}


def custom(max_trials: int | None = None, max_length: int = 2**62) -> SearcherConfig:
    return SearcherConfig(
        name="custom",
        metric="loss",
        max_length=Length.batches(max_length),
        max_trials=max_trials,
    )


def searcher(**kwargs: Any) -> CustomSearcher:
    s = make_searcher(custom(**kwargs), SPACE, 7)
    assert isinstance(s, CustomSearcher)
    return s


def started(**kwargs: Any) -> CustomSearcher:
    """A search whose runner created t0 and t1 (length 4 each), both created."""
    s = searcher(**kwargs)
    assert s.initial_operations() == []
    ops = s.apply(
        1,
        [
            Create("t0", POINT, 5),
            ValidateAfter("t0", 4),
            Create("t1", POINT, -1),
            ValidateAfter("t1", 4),
        ],
    )
    for op in ops:
        if isinstance(op, Create):
            s.on_trial_created(op.request_id)
    return s


def test_events_queue_in_order_until_a_batch_answers_them() -> None:
    s = searcher()
    assert s.initial_operations() == []
    assert s.initial_operations() == []
    assert s.events_after(0) == [{"id": 1, "kind": "initial_operations"}]
    ops = s.apply(
        1,
        [Create("t0", POINT, 5), ValidateAfter("t0", 4)],
        method_state=b"mine",
        progress=0.25,
    )
    full = {"global_batch_size": 32, **POINT}  # the constant filled in
    assert ops == [Create("t0", full, 5), ValidateAfter("t0", 4)]
    assert (s.acknowledged, s.events_after(0), s.method_state) == (1, [], b"mine")
    assert s.progress() == 0.25
    s.on_trial_created("t0")
    s.on_validation_completed("t0", math.nan, 4)
    s.on_trial_exited_early("t0", "errored")
    assert [(e["id"], e["kind"]) for e in s.events_after(1)] == [
        (2, "trial_created"),
        (3, "validation_completed"),
        (4, "trial_exited_early"),
    ]
    assert s.events_after(2)[0]["metric"] == "nan"  # JSON keeps no NaN
    assert s.events_after(3) == [
        {"id": 4, "kind": "trial_exited_early", "request_id": "t0", "reason": "errored"}
    ]


def test_a_missing_seed_is_derived_from_the_experiment_seed() -> None:
    s = searcher()
    s.initial_operations()
    [create, _] = s.apply(1, [Create("a", POINT, -1), ValidateAfter("a", 1)])
    again = searcher()
    again.initial_operations()
    [other, _] = again.apply(1, [Create("b", POINT, -1), ValidateAfter("b", 1)])
    assert isinstance(create, Create)
    assert isinstance(other, Create)
    assert other.seed == create.seed >= 0


def test_operations_for_a_trial_that_exited_meanwhile_are_dropped_not_refused() -> None:
    """The runner answers t0's validation; t0 crashes before that batch arrives. Its Close
    and a ValidateAfter are dropped, the batch is taken, and a Close of a trial already
    closed is taken again without a word."""
    s = started()
    s.on_validation_completed("t0", 0.5, 4)
    validated = s.next_event - 1
    s.on_trial_exited_early("t0", "errored")
    exited = s.next_event - 1
    assert s.apply(validated, [Close("t0"), ValidateAfter("t1", 8)]) == [ValidateAfter("t1", 8)]
    assert s.apply(exited, [ValidateAfter("t0", 8), Close("t1")]) == [Close("t1")]
    s.on_trial_closed("t1")
    assert s.apply(s.next_event - 1, [Close("t1")]) == []


def test_shutdown_closes_every_open_trial_first() -> None:
    s = started()
    s.on_trial_exited_early("t1", "invalid_hp")
    assert s.apply(4, [Shutdown()]) == [Close("t0"), Shutdown()]
    assert s.shutdown
    assert s.progress() == 1.0
    s.on_trial_closed("t0")
    with pytest.raises(OperationsError, match="has shut down"):
        s.apply(5, [ValidateAfter("t0", 8)])
    s.apply(5, [])  # acknowledging the last events is still fine


BAD_BATCHES: list[tuple[int, list[Operation], str]] = [
    (3, [ValidateAfter("t9", 8)], "unknown trial 't9'"),
    (3, [ValidateAfter("t0", 0)], "length must be a positive number"),
    (3, [ValidateAfter("t0", -3)], "length must be a positive number"),
    (3, [ValidateAfter("t0", 4)], "does not go past the trial's previous length 4"),
    (3, [ValidateAfter("t0", 10**4)], "past searcher.max_length"),
    (3, [Close("t0"), ValidateAfter("t0", 8)], "trial 't0' is closed"),
    (3, [Shutdown(), Close("t0")], "Shutdown must be the last operation"),
    (3, [Create("t0", POINT, 1), ValidateAfter("t0", 1)], "trial 't0' already exists"),
    (3, [Create("t2", POINT, 1)], "created without a ValidateAfter"),
    (3, [Create("", POINT, 1), ValidateAfter("", 1)], "a request id is 1 to 64"),
    (
        3,
        [Create("t2", {**POINT, "lr": 2.0}, 1), ValidateAfter("t2", 1)],
        "hyperparameter lr: expected a number from 1e-05 to 1",
    ),
    (
        3,
        [Create("t2", {**POINT, "model": {"width": 99, "dropout": 0.1}}, 1)],
        "hyperparameter model.width: expected an integer from 16 to 64, got 99",
    ),
    (
        3,
        [Create("t2", {**POINT, "optimizer": "lion"}, 1), ValidateAfter("t2", 1)],
        "hyperparameter optimizer: expected one of",
    ),
    (
        3,
        [Create("t2", {**POINT, "momentum": 0.9}, 1), ValidateAfter("t2", 1)],
        "hyperparameter momentum is not in the config's hyperparameters",
    ),
    (
        3,
        [Create("t2", {"lr": 0.01}, 1), ValidateAfter("t2", 1)],
        "hyperparameter model.dropout is missing",
    ),
    (
        3,
        [Create("t2", {**POINT, "global_batch_size": 64}, 1), ValidateAfter("t2", 1)],
        "global_batch_size: is the constant 32",
    ),
    (3, [Create("t2", POINT, 1), ValidateAfter("t2", 1)], "max_trials is 2: no more trials"),
    (1, [], "event 1 was already answered"),
    (9, [], "event 9 has not happened"),
]


@pytest.mark.parametrize(("triggered_by", "ops", "message"), BAD_BATCHES)
def test_a_bad_batch_is_refused_whole_with_the_reason(
    triggered_by: int, ops: list[Operation], message: str
) -> None:
    s = started(max_trials=2, max_length=1000)
    if "max_trials" not in message and "t2" in str(ops):
        s.max_trials = None
    before = json.dumps(s.snapshot())
    with pytest.raises(OperationsError, match=_escape(message)):
        s.apply(triggered_by, ops)
    assert json.dumps(s.snapshot()) == before


def test_a_method_state_too_large_or_a_progress_out_of_range_is_refused() -> None:
    s = started()
    with pytest.raises(OperationsError, match="keep large state in the runner's own storage"):
        s.apply(3, [], method_state=b"x" * (MAX_METHOD_STATE + 1))
    with pytest.raises(OperationsError, match="progress must be from 0 to 1"):
        s.apply(3, [], progress=1.5)


def test_a_snapshot_of_another_searcher_is_refused() -> None:
    with pytest.raises(ValueError, match="config gives custom"):
        restore_searcher(custom(), SPACE, 7, {"version": 1, "searcher": "pbt"})


def test_the_config_takes_one_metric_and_bounds_only() -> None:
    from assay.config import parse_config, preview
    from assay.errors import InvalidConfigError

    base: dict[str, Any] = {
        "entrypoint": "model_def:T",
        "hyperparameters": {
            "global_batch_size": 8,
            "lr": {"type": "log", "minval": -3, "maxval": -1},
        },
    }
    config = parse_config({**base, "searcher": {"name": "custom", "metric": "val_loss"}})
    assert (config.searcher.name, config.searcher.max_trials) == ("custom", None)
    with pytest.raises(ValueError, match="the plan comes from user code"):
        preview(config.searcher, config.hyperparameters)
    bad = {
        "name": "custom",
        "metrics": [{"name": "a"}, {"name": "b"}],
        "divisor": 3,
    }
    with pytest.raises(InvalidConfigError) as refused:
        parse_config({**base, "searcher": bad})
    text = str(refused.value)
    assert "searcher.metrics: the custom searcher's SearchMethod is told one metric" in text
    assert "searcher.divisor: is not a setting of the custom searcher" in text


def _escape(text: str) -> str:
    import re

    return re.escape(text)


# --- restart safety --------------------------------------------------------------------------


class Master:
    """The master's part, played in memory: it creates trials, validates live ones, stops
    closed ones and fails some, as the drawn steps say, telling the searcher each time."""

    def __init__(self, s: CustomSearcher) -> None:
        self.s = s
        self.live: dict[str, int] = {}  # request id -> target length
        self.closing: list[str] = []

    def carry_out(self, ops: list[Operation]) -> None:
        for op in ops:
            if isinstance(op, Create):
                self.s.on_trial_created(op.request_id)
            elif isinstance(op, ValidateAfter):
                self.live[op.request_id] = op.length
            elif isinstance(op, Close):
                self.live.pop(op.request_id, None)
                self.closing.append(op.request_id)


def runner_batch(s: CustomSearcher) -> tuple[int, list[Operation]] | None:
    """A runner's policy, a pure function of the events: two trials first; a trial
    that validates below 0.5 trains 3 more batches, else is closed and replaced (up to
    6 trials); an exit is replaced likewise; with none open, Shutdown."""
    events = s.events_after(s.acknowledged)
    if not events or s.shutdown:
        return None
    ops: list[Operation] = []
    created = len(s.trials)

    def create() -> None:
        nonlocal created
        if created < 6:
            ops.extend([Create(f"r{created}", POINT, -1), ValidateAfter(f"r{created}", 2)])
            created += 1

    for e in events:
        if e["kind"] == "initial_operations":
            create()
            create()
        elif e["kind"] == "validation_completed":
            metric = float(e["metric"])
            if metric < 0.5 and e["length"] < 12:
                ops.append(ValidateAfter(e["request_id"], e["length"] + 3))
            else:
                ops.append(Close(e["request_id"]))
                create()
        elif e["kind"] == "trial_exited_early":
            create()
    open_after = {rid for rid, t in s.trials.items() if t["state"] == "open"}
    open_after |= {op.request_id for op in ops if isinstance(op, Create)}
    open_after -= {op.request_id for op in ops if isinstance(op, Close)}
    if not open_after and created >= 6:
        ops.append(Shutdown())
    return events[-1]["id"], ops


def play(s: CustomSearcher, master: Master, step: tuple[str, int, float]) -> Any:
    """One drawn step; returns what it produced (for comparison)."""
    kind, pick, metric = step
    if kind == "runner":
        batch = runner_batch(s)
        if batch is None:
            return None
        ops = s.apply(batch[0], batch[1], method_state=str(batch).encode(), progress=0.5)
        master.carry_out(ops)
        return ops
    if kind == "validate" and master.live:
        rid = sorted(master.live)[pick % len(master.live)]
        length = master.live.pop(rid)
        return s.on_validation_completed(rid, metric, length)
    if kind == "exit" and master.live:
        rid = sorted(master.live)[pick % len(master.live)]
        del master.live[rid]
        return s.on_trial_exited_early(rid, "errored")
    if kind == "closed" and master.closing:
        return s.on_trial_closed(master.closing.pop(0))
    return None


STEPS = st.tuples(
    st.sampled_from(["runner", "runner", "validate", "validate", "exit", "closed"]),
    st.integers(0, 10),
    st.one_of(st.floats(0, 1), st.just(math.nan), st.just(math.inf)),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(STEPS, max_size=60), cut=st.integers(0, 60))
def test_restored_custom_searcher_queues_and_applies_like_the_original(
    steps: list[tuple[str, int, float]], cut: int
) -> None:
    original = searcher(max_trials=6)
    original.initial_operations()
    master = Master(original)
    cut = min(cut, len(steps))
    for step in steps[:cut]:
        play(original, master, step)
    saved = json.loads(json.dumps(original.snapshot(), allow_nan=False))
    restored = restore_searcher(custom(max_trials=6), SPACE, 7, saved)
    assert isinstance(restored, CustomSearcher)
    assert restored.initial_operations() == []  # started once, not again after a restart
    assert restored.snapshot() == original.snapshot()
    twin = Master(restored)
    twin.live, twin.closing = dict(master.live), list(master.closing)
    for step in steps[cut:]:
        assert play(restored, twin, step) == play(original, master, step)
        assert restored.events_after(0) == original.events_after(0)
        assert restored.acknowledged == original.acknowledged
        assert restored.method_state == original.method_state
    assert restored.snapshot() == original.snapshot()
