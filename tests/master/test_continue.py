"""`experiment continue`'s config: which overrides a continued trial takes."""

from __future__ import annotations

from typing import Any

import pytest

from assay.master.errors import InvalidArgumentError
from assay.master.submission import continued_config, parse_overrides

STORED: dict[str, Any] = {
    "name": "c",
    "entrypoint": "model_def:T",
    "hyperparameters": {"lr": 0.1, "global_batch_size": 8},
    "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 4}},
    "max_restarts": 1,
}


def test_a_longer_length_and_the_unchanged_rest_are_taken() -> None:
    given = {**STORED, "searcher": {"max_length": {"batches": 8}}, "max_restarts": 3}
    raw, config = continued_config(7, STORED, given)
    assert config.searcher.max_length.value == 8
    assert raw["max_restarts"] == 3
    assert raw["searcher"]["metric"] == "loss"
    assert STORED["searcher"]["max_length"] == {"batches": 4}  # not changed in place


def test_a_length_in_another_unit_replaces_the_stored_one() -> None:
    stored = {**STORED, "records_per_epoch": 80}
    raw, _config = continued_config(7, stored, {"searcher": {"max_length": {"epochs": 2}}})
    assert raw["searcher"]["max_length"] == {"epochs": 2}


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"hyperparameters": {"lr": 0.2}}, "hyperparameters.lr"),
        ({"searcher": {"metric": "acc"}}, "searcher.metric"),
        ({"resources": {"slots_per_trial": 2}}, "resources.slots_per_trial"),
        ({"entrypoint": "other:T"}, "entrypoint"),
    ],
)
def test_a_change_a_continued_trial_cannot_take_is_refused(
    overrides: dict[str, Any], named: str
) -> None:
    with pytest.raises(InvalidArgumentError) as e:
        continued_config(7, STORED, overrides)
    assert str(e.value).startswith(f"continue cannot change {named}: a continued trial keeps")
    assert "`assay experiment fork 7 --config ...`" in str(e.value)


def test_an_invalid_length_is_the_config_error() -> None:
    with pytest.raises(InvalidArgumentError, match="searcher.max_length"):
        continued_config(7, STORED, {"searcher": {"max_length": {"batches": -1}}})


def test_overrides_must_be_a_mapping() -> None:
    assert parse_overrides(7, "") == {}
    with pytest.raises(InvalidArgumentError, match="must be a mapping of config keys"):
        parse_overrides(7, "- 1")
    with pytest.raises(InvalidArgumentError, match="not valid YAML"):
        parse_overrides(7, "a: [")


def test_a_continued_trial_keeps_its_experiments_seed_and_an_older_one_keeps_none() -> None:
    # `continue` goes on with the same experiment: the seed the master drew (stored with
    # the config) stays, and cannot be changed; an experiment stored before seeds were
    # drawn goes on with 0, as it ran.
    stored = {**STORED, "reproducibility": {"experiment_seed": 918273}}
    raw, config = continued_config(7, stored, {"searcher": {"max_length": {"batches": 8}}})
    assert config.experiment_seed == 918273
    assert raw["reproducibility"] == {"experiment_seed": 918273}
    with pytest.raises(InvalidArgumentError, match="cannot change reproducibility.experiment_seed"):
        continued_config(7, stored, {"reproducibility": {"experiment_seed": 1}})
    assert continued_config(7, STORED, {})[1].experiment_seed == 0
