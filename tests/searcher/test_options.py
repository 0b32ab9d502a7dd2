"""The searcher options are refused with their key path and the rule, by the config parser
(with every other problem) and by `make_searcher` for a config built in code."""

from __future__ import annotations

from typing import Any

import pytest

from assay.config import (
    Categorical,
    Const,
    Double,
    Int,
    Log,
    grid_points,
    grid_values,
    parse_config,
)
from assay.errors import InvalidConfigError
from assay.master.searcher import make_searcher

from ._support import SPACE, config


def parse(searcher: dict[str, Any], hparams: dict[str, Any] | None = None) -> list[str]:
    data = {
        "entrypoint": "model_def:T",
        "hyperparameters": {"global_batch_size": 32, **(hparams or {})},
        "searcher": {"metric": "loss", "max_length": {"batches": 1000}, **searcher},
    }
    try:
        parse_config(data)
    except InvalidConfigError as e:
        return e.problems
    return []


@pytest.mark.parametrize(
    ("searcher", "expected"),
    [
        ({"name": "random"}, "searcher.max_trials: is required for the random searcher"),
        ({"name": "asha"}, "searcher.max_trials: is required for the asha searcher"),
        ({"name": "adaptive_asha"}, "searcher.max_trials: is required for the adaptive_asha"),
        ({"name": "bayesian"}, "searcher.max_trials: is required for the bayesian"),
        (
            {"name": "asha", "max_trials": 4, "divisor": 1},
            "searcher.divisor: must be greater than 1",
        ),
        (
            {"name": "asha", "max_trials": 4, "divisor": 0.5},
            "searcher.divisor: must be greater than 1",
        ),
        (
            {"name": "asha", "max_trials": 4, "divisor": ".nan"},
            "searcher.divisor: expected a number greater than 1",
        ),
        (
            {"name": "asha", "max_trials": 4, "divisor": True},
            "searcher.divisor: expected a number",
        ),
        (
            {"name": "asha", "max_trials": 4, "num_rungs": 65},
            "searcher.num_rungs: must be at most 64, got 65",
        ),
        (
            {"name": "asha", "max_trials": 4, "num_rungs": 0},
            "searcher.num_rungs: must be at least 1, got 0",
        ),
        (
            {"name": "adaptive_asha", "max_trials": 4, "max_rungs": "5"},
            "searcher.max_rungs: expected an integer",
        ),
        (
            {"name": "adaptive_asha", "max_trials": 4, "mode": "wild"},
            "searcher.mode: expected one of aggressive | standard | conservative, got 'wild'",
        ),
        (
            {"name": "random", "max_trials": 4, "sampler": "cmaes"},
            "searcher.sampler: expected one of random | tpe | bohb, got 'cmaes'",
        ),
        (
            {"name": "bayesian", "max_trials": 4, "sampler": "random"},
            "searcher.sampler: bayesian is random search with the tpe sampler",
        ),
        (
            {"name": "asha", "max_trials": 4, "random_fraction": 0.5},
            "searcher.random_fraction: is a setting of the bohb sampler; add sampler: bohb",
        ),
        (
            {"name": "asha", "max_trials": 4, "sampler": "tpe", "random_fraction": 0.5},
            "searcher.random_fraction: is a setting of the bohb sampler",
        ),
        (
            {"name": "asha", "max_trials": 4, "sampler": "bohb", "random_fraction": 1.5},
            "searcher.random_fraction: expected a number from 0 to 1 (the share of trials "
            "sampled at random; default 1/3), got 1.5",
        ),
        (
            {"name": "adaptive_asha", "max_trials": 4, "sampler": "bohb", "random_fraction": -0.1},
            "searcher.random_fraction: expected a number from 0 to 1",
        ),
        (
            {"name": "asha", "max_trials": 4, "sampler": "bohb", "random_fraction": "1/3"},
            "searcher.random_fraction: expected a number from 0 to 1",
        ),
        (
            {"name": "random", "max_trials": 4, "sampler": "bohb", "random_fraction": True},
            "searcher.random_fraction: expected a number from 0 to 1",
        ),
        (
            {"name": "asha", "max_trials": 4, "sampler": "bohb", "random_fraction": ".nan"},
            "searcher.random_fraction: expected a number from 0 to 1",
        ),
        (
            {"name": "asha", "max_trials": 4, "num_rungs": 3, "max_rungs": 2},
            "searcher.num_rungs: (3) must not exceed max_rungs (2)",
        ),
        # 6 rungs of divisor 4 need 4**5 = 1024 batches; 1000 would repeat the bottom rung
        (
            {"name": "asha", "max_trials": 4, "num_rungs": 6},
            "searcher.num_rungs: 6 rungs with divisor 4 need max_length >= 1024 batches",
        ),
        (
            {"name": "adaptive_asha", "max_trials": 4, "bracket_rungs": [0]},
            "searcher.bracket_rungs: expected a list of integers from 1 to 64",
        ),
        (
            {"name": "adaptive_asha", "max_trials": 4, "bracket_rungs": [2, 2]},
            "searcher.bracket_rungs: has a bracket twice",
        ),
        (
            {"name": "adaptive_asha", "max_trials": 4, "bracket_rungs": [7]},
            "searcher.bracket_rungs: 7 rungs with divisor 4 need max_length >= 4096",
        ),
        (
            {"name": "adaptive_asha", "max_trials": 2, "bracket_rungs": [1, 2, 3]},
            "searcher.bracket_rungs: 3 brackets need max_trials >= 3",
        ),
    ],
)
def test_bad_option(searcher: dict[str, Any], expected: str) -> None:
    problems = parse(searcher)

    assert any(expected in p for p in problems), problems
    cfg = config(
        searcher["name"],
        max_trials=searcher.get("max_trials"),
        **{k: v for k, v in searcher.items() if k not in ("name", "max_trials")},
    )
    with pytest.raises(ValueError, match="searcher."):
        make_searcher(cfg, SPACE, 0)


def test_a_bad_max_trials_is_reported_once() -> None:
    problems = parse({"name": "random", "max_trials": "8"})

    assert [p for p in problems if "max_trials" in p] == [
        "searcher.max_trials: expected an integer, got a string ('8')"
    ]


def test_rung_rules_wait_for_lengths_in_batches() -> None:
    # In epochs the master refuses the experiment anyway; the config stays valid for run-local.
    assert (
        parse({"name": "asha", "max_trials": 4, "num_rungs": 6, "max_length": {"epochs": 2}}) == []
    )


def test_grid_needs_count_on_continuous_hyperparameters() -> None:
    problems = parse(
        {"name": "grid"},
        {
            "lr": {"type": "log", "minval": -4, "maxval": -1},
            "arch": {"dropout": {"type": "double", "minval": 0, "maxval": 0.5}},
            "width": {"type": "int", "minval": 8, "maxval": 12},  # every integer: fine
        },
    )

    assert sorted(problems) == [
        "hyperparameters.arch.dropout: grid search needs `count` on a double hyperparameter "
        "(how many evenly spaced values to try)",
        "hyperparameters.lr: grid search needs `count` on a log hyperparameter "
        "(how many evenly spaced values to try)",
    ]


def test_grid_too_large_is_refused() -> None:
    problems = parse({"name": "grid"}, {"seed": {"type": "int", "minval": 0, "maxval": 10**9}})

    assert problems == [
        "hyperparameters: the grid has 1,000,000,001 points, more than 100,000; lower the "
        "counts (an int without count is every integer of its range)"
    ]


def test_grid_values() -> None:
    assert grid_values(Int(1, 10, 4)) == [1, 4, 7, 10]
    assert grid_values(Int(0, 3, 10)) == [0, 1, 2, 3]  # count beyond the range: every int
    assert grid_values(Int(0, 2, 4)) == [0, 1, 2]  # 0, 0.67, 1.33, 2 round to 0, 1, 1, 2
    assert grid_values(Int(0, 9, 1)) == [5]  # the midpoint, 4.5, rounds half up
    assert grid_values(Double(0.0, 1.0, 3)) == [0.0, 0.5, 1.0]
    assert grid_values(Double(2.0, 2.0, 3)) == [2.0]
    assert grid_values(Log(-3.0, -1.0, 10.0, 3)) == pytest.approx([1e-3, 1e-2, 1e-1])
    assert grid_values(Categorical(("a", None))) == ["a", None]
    with pytest.raises(ValueError, match="needs `count`"):
        grid_values(Double(0.0, 1.0))


def test_grid_points_are_the_nested_cartesian_product() -> None:
    points = grid_points(
        {"b": Categorical((1, 2)), "a": {"x": Int(0, 1), "empty": {}}, "c": Const("k")}
    )

    # names sorted at every level, the first varying slowest
    assert points == [
        {"a": {"x": 0, "empty": {}}, "b": 1, "c": "k"},
        {"a": {"x": 0, "empty": {}}, "b": 2, "c": "k"},
        {"a": {"x": 1, "empty": {}}, "b": 1, "c": "k"},
        {"a": {"x": 1, "empty": {}}, "b": 2, "c": "k"},
    ]
    assert grid_points({}) == [{}]
