"""Checks the shell (`_core.Master`) asks of plain data before it changes anything: a
continue's new config and searcher, a deletion of rows made live again, which agent
speaks for which run."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from assay.config import parse_config
from assay.master.errors import ConflictError, InvalidArgumentError
from assay.master.lifecycle import ExperimentState, ExperimentStatus, Run
from assay.master.lifecycle import agent as agent_life
from assay.master.lifecycle import experiment as experiment_life
from assay.master.store import ExperimentRecord
from assay.master.submission import intake, new_searcher

STORED: dict[str, Any] = {
    "name": "c",
    "entrypoint": "model_def:T",
    "hyperparameters": {"lr": 0.1, "global_batch_size": 8},
    "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 4}},
}


def _record(state: str) -> ExperimentRecord:
    now = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
    return ExperimentRecord(
        7, "c", "", "admin", state, (), 42, 1.0, False, STORED, None, now, now, now
    )


def test_a_continuation_is_the_longer_config_and_a_new_searcher_for_it() -> None:
    overrides = {"searcher": {"max_length": {"batches": 9}}}
    raw, config, searcher = intake.continuation(_record("COMPLETED"), overrides)
    assert raw["searcher"]["max_length"] == {"batches": 9}
    assert config.searcher.max_length.value == 9
    assert searcher.snapshot() == new_searcher(config).snapshot()
    assert STORED["searcher"]["max_length"] == {"batches": 4}  # not changed in place


def test_a_continuation_is_refused_for_a_live_state_or_a_key_it_cannot_change() -> None:
    with pytest.raises(ConflictError, match="cannot continue experiment 7: it is ACTIVE"):
        intake.continuation(_record("ACTIVE"), {})
    with pytest.raises(InvalidArgumentError, match="continue cannot change name"):
        intake.continuation(_record("COMPLETED"), {"name": "other"})


def test_rows_of_an_experiment_live_again_are_not_deleted() -> None:
    experiment_life.check_deletable(7, None)
    config = parse_config(STORED)
    live = ExperimentState(7, config, ExperimentStatus.ACTIVE, 42, new_searcher(config))
    with pytest.raises(ConflictError) as info:
        experiment_life.check_deletable(7, live)
    assert str(info.value) == (
        "experiment 7 is ACTIVE again (continued): kill it first, or wait for it to end"
    )


def test_an_agent_speaks_only_for_its_own_parts() -> None:
    run = Run("a.1", 1, 1, 7, (("a0", (0,)), ("a1", (0,))), "tok")
    runs = {run.allocation_id: run}
    assert agent_life.part_on(runs, "a.1", "a1") is run
    assert agent_life.part_on(runs, "a.1", "a2") is None
    assert agent_life.part_on(runs, "b.1", "a0") is None
