"""What the CLI and the SDK read from a stored config: the metric trials are ranked by."""

from __future__ import annotations

from typing import Any

import pytest

from assay.client import best_trial, searcher_objective
from assay.proto import common_pb2


@pytest.mark.parametrize(
    ("searcher", "expected"),
    [
        ({"metric": "val_loss"}, ("val_loss", True)),
        ({"metric": "accuracy", "smaller_is_better": False}, ("accuracy", False)),
        (
            {"metrics": [{"name": "accuracy", "smaller_is_better": False}, "latency"]},
            ("accuracy", False),
        ),
        (
            {"metrics": ["latency", {"name": "accuracy", "smaller_is_better": False}]},
            ("latency", True),
        ),
        ({}, (None, True)),
    ],
)
def test_searcher_objective_is_the_metric_or_the_first_of_several(
    searcher: dict[str, Any], expected: tuple[str | None, bool]
) -> None:
    assert searcher_objective({"searcher": searcher}) == expected


def test_best_trial_follows_the_first_metric_of_a_multi_objective_search() -> None:
    trials = [
        common_pb2.Trial(id=1, best_validation=0.9),
        common_pb2.Trial(id=2, best_validation=0.7),
    ]
    config = {"searcher": {"metrics": [{"name": "accuracy", "smaller_is_better": False}, "ms"]}}

    assert best_trial(trials, config) == {"id": 1, "best_validation": 0.9}
