"""`searcher.metrics`: a multi-objective search's config, and one clear message for each
thing it refuses."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from assay.cli.main import cli
from assay.config import Objective, parse_config, preview
from assay.errors import InvalidConfigError

METRICS = [{"name": "val_loss"}, {"name": "accuracy", "smaller_is_better": False}]
BASE: dict[str, Any] = {
    "entrypoint": "model_def:Trial",
    "hyperparameters": {
        "global_batch_size": 4,
        "lr": {"type": "log", "minval": -4, "maxval": -1, "count": 3},
    },
    "searcher": {
        "name": "random",
        "metrics": METRICS,
        "max_trials": 6,
        "max_length": {"batches": 10},
    },
}


def with_searcher(**changes: Any) -> dict[str, Any]:
    raw = copy.deepcopy(BASE)
    for key, value in changes.items():
        if value is None:
            raw["searcher"].pop(key, None)
        else:
            raw["searcher"][key] = value
    return raw


def problems(raw: dict[str, Any]) -> list[str]:
    with pytest.raises(InvalidConfigError) as info:
        parse_config(raw)
    return info.value.problems


@pytest.mark.parametrize(
    ("name", "sampler"), [("random", None), ("grid", None), ("random", "tpe"), ("bayesian", None)]
)
def test_metrics_are_read(name: str, sampler: str | None) -> None:
    raw = with_searcher(name=name, sampler=sampler)
    if name == "grid":
        raw["searcher"].pop("max_trials")
    searcher = parse_config(raw).searcher

    assert searcher.objectives == (Objective("val_loss", True), Objective("accuracy", False))
    # The first metric is the searcher metric (checkpoint policies, the best value).
    assert (searcher.metric, searcher.smaller_is_better) == ("val_loss", True)
    assert preview(searcher, parse_config(raw).hyperparameters).total_trials in (3, 6)


def test_a_name_alone_is_a_smaller_is_better_metric() -> None:
    searcher = parse_config(with_searcher(metrics=["a", "b"])).searcher
    assert searcher.objectives == (Objective("a"), Objective("b"))


def test_metric_and_metrics_together_name_the_fix() -> None:
    (problem,) = problems(with_searcher(metric="val_loss"))
    assert problem.startswith("searcher.metrics: give metric")
    assert "not both" in problem
    (problem,) = problems(with_searcher(smaller_is_better=False))
    assert "not both" in problem


@pytest.mark.parametrize(
    ("name", "options", "reason"),
    [
        ("asha", {}, "early stopping ranks trials on one metric"),
        ("adaptive_asha", {}, "early stopping ranks trials on one metric"),
        ("single", {"max_trials": None}, "a single trial has no trade-off"),
        ("random", {"sampler": "bohb"}, "the bohb sampler models one metric"),
    ],
)
def test_searchers_that_need_one_order_are_refused(
    name: str, options: dict[str, Any], reason: str
) -> None:
    (problem,) = problems(with_searcher(name=name, **options))
    assert problem.startswith("searcher.metrics:")
    assert reason in problem


def test_pbt_is_refused() -> None:
    raw = with_searcher(
        name="pbt",
        max_trials=None,
        max_length=None,
        population_size=4,
        num_rounds=2,
        length_per_round={"batches": 5},
    )
    (problem,) = problems(raw)
    assert problem.startswith("searcher.metrics: the pbt searcher takes one metric")


@pytest.mark.parametrize(
    ("metrics", "expected"),
    [
        ([{"name": "val_loss"}], "expected a list of 2 to 8 metrics"),
        ("val_loss", "expected a list of 2 to 8 metrics"),
        ([{"name": f"m{i}"} for i in range(9)], "got 9 entries"),
        ([{"name": "a"}, {"name": "a"}], "searcher.metrics[1].name: 'a' is listed twice"),
        ([{"name": "a"}, {"name": ""}], "searcher.metrics[1].name: expected a validation"),
        ([{"name": "a"}, 3], "searcher.metrics[1]: expected {name, smaller_is_better}"),
        (
            [{"name": "a", "smaller_is_better": "yes"}, {"name": "b"}],
            "searcher.metrics[0].smaller_is_better: expected true or false",
        ),
        ([{"name": "a", "goal": "min"}, {"name": "b"}], "searcher.metrics[0].goal: unknown key"),
    ],
)
def test_bad_metrics_lists(metrics: Any, expected: str) -> None:
    found = problems(with_searcher(metrics=metrics))
    assert any(expected in p for p in found), found


def test_preview_search_shows_the_metrics(tmp_path: Path) -> None:
    path = tmp_path / "multi.yaml"
    path.write_text(yaml.safe_dump(with_searcher(sampler="tpe")))
    result = CliRunner().invoke(cli, ["preview-search", str(path)])
    assert result.exit_code == 0, result.output
    first = result.output.splitlines()[0]
    assert first == (
        "metrics: val_loss (lower is better), accuracy (higher is better); "
        "the experiment reports their Pareto front"
    )
    result = CliRunner().invoke(cli, ["preview-search", str(path), "--json"])
    plan = json.loads(result.output.splitlines()[-1])
    assert plan["metrics"] == [
        {"name": "val_loss", "smaller_is_better": True},
        {"name": "accuracy", "smaller_is_better": False},
    ]
    assert (plan["sampler"], plan["total_trials"]) == ("tpe", 6)


def test_preview_search_refuses_asha_with_metrics(tmp_path: Path) -> None:
    path = tmp_path / "asha.yaml"
    path.write_text(yaml.safe_dump(with_searcher(name="asha")))
    result = CliRunner().invoke(cli, ["preview-search", str(path)])
    assert result.exit_code != 0
    assert "searcher.metrics: the asha searcher takes one metric" in result.output
