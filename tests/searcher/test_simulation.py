"""Whole experiments played by the simulated master: thousands of synthetic trials per
searcher, in time order and in random interleavings, with early exits of every kind."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping
from typing import Any

import pytest

from assay.config import SearcherConfig, search_spec
from assay.master.searcher import (
    Close,
    Create,
    ExitedReason,
    Operation,
    Searcher,
    Shutdown,
    ValidateAfter,
    make_searcher,
)
from assay.master.searcher.simulate import ProtocolError, SimulatedMaster, SimulationResult

from ._support import SPACE, config, objective

CASES: dict[str, SearcherConfig] = {
    "single": config("single"),
    "grid": config("grid", max_concurrent_trials=16),
    "random": config("random", max_trials=2000, max_concurrent_trials=32),
    "random-unlimited": config("random", max_trials=500),
    "asha": config("asha", max_trials=3000, max_concurrent_trials=16),
    "asha-default-concurrency": config("asha", max_trials=2000, num_rungs=4),
    "asha-divisor-3": config("asha", max_length=2000, max_trials=2000, divisor=3, max_rungs=6),
    "asha-divisor-2.5": config("asha", max_length=2000, max_trials=1000, divisor=2.5),
    "adaptive-divisor-2.5": config(
        "adaptive_asha", max_trials=800, max_concurrent_trials=10, divisor=2.5
    ),
    "asha-larger-is-better": config(
        "asha", max_trials=1000, max_concurrent_trials=8, smaller_is_better=False
    ),
    "adaptive-standard": config("adaptive_asha", max_trials=2000, max_concurrent_trials=20),
    "adaptive-aggressive": config("adaptive_asha", max_trials=1000, mode="aggressive"),
    "adaptive-conservative": config(
        "adaptive_asha", max_trials=1000, max_concurrent_trials=3, mode="conservative"
    ),
    "adaptive-brackets": config(
        "adaptive_asha", max_trials=500, max_concurrent_trials=7, bracket_rungs=[1, 3, 4]
    ),
}


def concurrency_limit(cfg: SearcherConfig) -> int:
    """What the searcher must honour: the config's limit, else ASHA's default."""
    spec = search_spec(cfg, SPACE)
    if spec.max_concurrent_trials:
        return spec.max_concurrent_trials
    limits = [b.max_concurrent_trials for b in spec.brackets]
    return 0 if 0 in limits else sum(limits)


def exits(rate: float) -> Any:
    """An exit policy: errored, invalid_hp or user_canceled, each at `rate`, by trial."""

    def policy(rid: str, hparams: Mapping[str, Any], length: int) -> ExitedReason | None:
        draw = random.Random(f"{rid}:{length}").random()
        reasons: tuple[ExitedReason, ...] = ("errored", "invalid_hp", "user_canceled")
        for i, reason in enumerate(reasons):
            if draw < rate * (i + 1):
                return reason
        return None

    return policy


def play(cfg: SearcherConfig, *, order: str = "time", exit_rate: float = 0.0) -> SimulationResult:
    limit = concurrency_limit(cfg)
    master = SimulatedMaster(
        make_searcher(cfg, SPACE, seed=3),
        objective,
        max_live=limit,
        order=order,  # type: ignore[arg-type]
        exit_policy=exits(exit_rate) if exit_rate else None,
        seed=11,
    )
    return master.run()


def check_invariants(cfg: SearcherConfig, result: SimulationResult) -> None:
    spec = search_spec(cfg, SPACE)
    max_trials = sum(b.max_trials for b in spec.brackets)
    assert len(result.counted()) <= max_trials
    assert result.shutdowns == 1
    assert all(t.closed or t.exited for t in result.trials.values())
    limit = concurrency_limit(cfg)
    if limit:
        assert result.max_live <= limit
    assert result.progress[-1] == 1.0
    assert all(0.0 <= p <= 1.0 for p in result.progress)
    assert all(a <= b for a, b in zip(result.progress, result.progress[1:], strict=False))
    for trial in result.trials.values():
        assert trial.lengths == sorted(set(trial.lengths))  # promoted trials only grow


@pytest.mark.parametrize("name", sorted(CASES))
def test_simulated_experiment(name: str) -> None:
    cfg = CASES[name]
    result = play(cfg)

    check_invariants(cfg, result)
    spec = search_spec(cfg, SPACE)
    max_trials = sum(b.max_trials for b in spec.brackets)
    assert len(result.trials) == max_trials  # no exits: every trial was used
    if name == "single":
        (trial,) = result.trials.values()
        assert trial.lengths == [1000]
    if cfg.name in ("grid", "random", "single"):
        assert all(t.lengths == [cfg.max_length.value] for t in result.trials.values())
    if cfg.name == "grid":
        points = [tuple(sorted(str(t.hparams).split())) for t in result.trials.values()]
        assert len(set(points)) == len(points) == 72


@pytest.mark.parametrize("name", ["asha", "asha-default-concurrency", "adaptive-aggressive"])
def test_most_asha_trials_stop_at_the_bottom_rung(name: str) -> None:
    cfg = CASES[name]
    result = play(cfg)

    lowest = min(search_spec(cfg, SPACE).brackets[0].lengths)
    final = Counter(max(t.lengths) for t in result.trials.values())
    assert final[lowest] > 0.6 * len(result.trials)
    assert final[cfg.max_length.value] >= 1
    # and the budget is a small part of training every trial fully
    assert result.batches < 0.1 * len(result.trials) * cfg.max_length.value


def test_asha_finds_the_good_region() -> None:
    result = play(CASES["asha"])

    full = [t for t in result.trials.values() if t.lengths and t.lengths[-1] == 1000]
    assert full
    assert all(t.hparams["optimizer"] == "adam" for t in full)


@pytest.mark.parametrize("name", sorted(CASES))
def test_random_interleavings_with_exits(name: str) -> None:
    cfg = CASES[name]
    result = play(cfg, order="random", exit_rate=0.03)

    check_invariants(cfg, result)
    reasons = Counter(t.exited for t in result.trials.values())
    if len(result.trials) > 200:
        assert reasons["invalid_hp"]
        assert reasons["errored"]
        assert reasons["user_canceled"]
    # replacements make up for invalid_hp exits: as many counted trials as without exits
    # (a grid point is not replaced)
    if cfg.name != "grid":
        max_trials = sum(b.max_trials for b in search_spec(cfg, SPACE).brackets)
        assert len(result.counted()) == max_trials


def test_the_simulated_master_catches_too_many_live_trials() -> None:
    searcher = make_searcher(config("random", max_trials=10), SPACE, 0)  # unlimited
    master = SimulatedMaster(searcher, objective, max_live=3)

    with pytest.raises(ProtocolError, match=r"4 trials run at once; the limit is 3"):
        master.run()


class Scripted(Searcher):
    """A searcher that returns canned operations, to check the simulated master's checks."""

    def __init__(self, initial: list[Operation], after: list[Operation]) -> None:
        self.initial, self.after = initial, after

    def initial_operations(self) -> list[Operation]:
        return self.initial

    def on_trial_created(self, request_id: str) -> list[Operation]:
        return []

    def on_validation_completed(
        self, request_id: str, metric: float, length: int
    ) -> list[Operation]:
        return self.after

    def on_trial_closed(self, request_id: str) -> list[Operation]:
        return []

    def on_trial_exited_early(self, request_id: str, reason: ExitedReason) -> list[Operation]:
        return []

    def progress(self) -> float:
        return 0.0

    def snapshot(self) -> dict[str, Any]:
        return {}


@pytest.mark.parametrize(
    ("initial", "after", "message"),
    [
        ([Create("a", {}, 0)], [], "not followed by its ValidateAfter"),
        ([Create("a", {}, 0), ValidateAfter("a", 5)], [ValidateAfter("a", 5)], "already at 5"),
        ([Create("a", {}, 0), ValidateAfter("a", 5)], [Close("b")], "unknown request id b"),
        ([Create("a", {}, 0), ValidateAfter("a", 5)], [Shutdown()], "while trials are open"),
        ([Create("a", {}, 0), ValidateAfter("a", 5)], [], "stalled"),
        ([Shutdown(), Create("a", {}, 0)], [], "not the last operation"),
    ],
)
def test_the_simulated_master_catches_protocol_breaches(
    initial: list[Operation], after: list[Operation], message: str
) -> None:
    with pytest.raises(ProtocolError, match=message):
        SimulatedMaster(Scripted(initial, after), lambda h, n, s: 1.0).run()
