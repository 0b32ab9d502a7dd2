"""The pbt searcher's config: Determined's keys, their defaults, and one clear message for
each bad value."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from assay.config import PBTSpec, parse_config, pbt_spec, preview
from assay.errors import InvalidConfigError

BASE: dict[str, Any] = {
    "entrypoint": "model_def:Trial",
    "hyperparameters": {
        "global_batch_size": 4,
        "lr": {"type": "log", "minval": -4, "maxval": -1},
    },
    "searcher": {
        "name": "pbt",
        "metric": "validation_loss",
        "population_size": 4,
        "num_rounds": 3,
        "length_per_round": {"batches": 5},
        "replace_function": {"truncate_fraction": 0.25},
        "explore_function": {"resample_probability": 0.2, "perturb_factor": 0.1},
    },
}


def with_searcher(**changes: Any) -> dict[str, Any]:
    raw = copy.deepcopy(BASE)
    for key, value in changes.items():
        if value is None:
            raw["searcher"].pop(key)
        else:
            raw["searcher"][key] = value
    return raw


def test_determined_keys_are_read() -> None:
    config = parse_config(BASE)

    assert pbt_spec(config.searcher) == PBTSpec(
        population_size=4,
        num_rounds=3,
        length_per_round=5,
        truncate_fraction=0.25,
        resample_probability=0.2,
        perturb_factor=0.1,
    )


def test_the_functions_have_defaults() -> None:
    config = parse_config(with_searcher(replace_function=None, explore_function=None))

    spec = pbt_spec(config.searcher)
    assert (spec.truncate_fraction, spec.resample_probability, spec.perturb_factor) == (
        0.25,
        0.25,
        0.2,
    )


def test_the_preview_is_rounds_by_population() -> None:
    config = parse_config(with_searcher(population_size=8))

    plan = preview(config.searcher, config.hyperparameters)

    assert plan.brackets == ()
    assert [(r.round, r.trials, r.new_trials, r.length) for r in plan.rounds] == [
        (0, 8, 8, 5),
        (1, 8, 2, 10),
        (2, 8, 2, 15),
    ]
    assert (plan.total_trials, plan.total_budget) == (12, 8 * 3 * 5)


def test_epochs_per_round_are_batches_on_a_cluster() -> None:
    from assay.config import searcher_in_batches

    raw = with_searcher(length_per_round={"epochs": 2})
    raw["records_per_epoch"] = 40
    config = parse_config(raw)

    assert searcher_in_batches(config).max_length.value == 20  # 2 * 40 / 4


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"population_size": 1}, "searcher.population_size: expected an integer from 2"),
        ({"population_size": None}, "searcher.population_size: is required"),
        ({"num_rounds": 0}, "searcher.num_rounds: expected an integer from 1"),
        ({"num_rounds": "3"}, "searcher.num_rounds: expected an integer"),
        ({"length_per_round": None}, "searcher.length_per_round: is required"),
        ({"length_per_round": {"batches": 0}}, "searcher.length_per_round: expected"),
        ({"max_length": {"batches": 10}}, "searcher.max_length: pbt trains length_per_round"),
        ({"max_trials": 10}, "searcher.max_trials: is not a setting of the pbt searcher"),
        (
            {"replace_function": {"truncate_fraction": 0.6}},
            "searcher.replace_function.truncate_fraction: expected a number in (0, 0.5]",
        ),
        (
            {"replace_function": {"truncate_fraction": 0.1}},
            "replaces no trial: 0.1 of a population of 4 is less than one",
        ),
        ({"replace_function": 0.2}, "searcher.replace_function: expected a mapping"),
        (
            {"explore_function": {"resample_probability": 1.5}},
            "searcher.explore_function.resample_probability: expected a number in [0, 1]",
        ),
        (
            {"explore_function": {"perturb_factor": True}},
            "searcher.explore_function.perturb_factor: expected a number in (0, 1)",
        ),
        (
            {"explore_function": {"perturb": 0.2}},
            "searcher.explore_function.perturb: unknown key; explore_function takes",
        ),
    ],
)
def test_bad_values_get_one_clear_message(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidConfigError) as raised:
        parse_config(with_searcher(**changes))

    assert message in str(raised.value)


def test_pbt_keys_belong_to_pbt_only() -> None:
    raw = copy.deepcopy(BASE)
    raw["searcher"] = {
        "name": "random",
        "metric": "loss",
        "max_trials": 2,
        "max_length": {"batches": 5},
        "population_size": 4,
        "length_per_round": {"batches": 5},
    }
    with pytest.raises(InvalidConfigError) as raised:
        parse_config(raw)

    assert "searcher.population_size: is not a setting of the random searcher" in str(raised.value)
    assert "length_per_round" in str(raised.value)
