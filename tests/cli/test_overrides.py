"""`--config` overrides and partial configs, as `experiment create` and `fork` apply them."""

from __future__ import annotations

from pathlib import Path

import pytest

from assay.cli._experiment_create import _masked_keys
from assay.cli._template import apply_overrides, compose, is_override
from assay.config._merge import merge
from assay.errors import AssayError

BASE = {
    "name": "a",
    "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 10}},
    "hyperparameters": {"lr": 0.1, "layers": [1, 2]},
}


def test_dotted_keys_set_yaml_values_and_keep_the_rest() -> None:
    got = apply_overrides(
        BASE,
        [
            "searcher.max_length.batches=200",
            "hyperparameters.lr={type: log, minval: -4, maxval: -1, base: 10}",
            "hyperparameters.layers=[3]",
            "resources.slots_per_trial=2",
            "description=two words",
        ],
    )
    assert got["searcher"] == {"name": "single", "metric": "loss", "max_length": {"batches": 200}}
    assert got["hyperparameters"]["lr"] == {"type": "log", "minval": -4, "maxval": -1, "base": 10}
    assert got["hyperparameters"]["layers"] == [3]  # lists are replaced, not merged
    assert got["resources"] == {"slots_per_trial": 2}
    assert got["description"] == "two words"
    assert BASE["searcher"]["max_length"] == {"batches": 10}  # type: ignore[index]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("lr", "is not KEY=VALUE"),
        ("=1", "is not KEY=VALUE"),
        ("a..b=1", "is not KEY=VALUE"),
        ("name.x=1", "name is 'a', not a mapping"),
        ("hyperparameters.lr.x=1", "hyperparameters.lr is 0.1, not a mapping"),
        ("lr=[1,", "not valid YAML"),
    ],
)
def test_bad_overrides_say_what_to_fix(override: str, message: str) -> None:
    with pytest.raises(AssayError, match=message.replace(".", r"\.").replace("[", r"\[")):
        apply_overrides(BASE, [override])


def test_files_merge_over_the_base_in_order(tmp_path: Path) -> None:
    partial = tmp_path / "p.yaml"
    partial.write_text("searcher: {metric: acc, smaller_is_better: false}\n")
    got = compose(BASE, [str(partial), "searcher.metric=f1"])
    assert got["searcher"]["metric"] == "f1"
    assert got["searcher"]["smaller_is_better"] is False
    assert got["searcher"]["max_length"] == {"batches": 10}
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(AssayError, match="must hold a mapping"):
        compose(BASE, [str(tmp_path / "list.yaml")])
    assert is_override("a.b=c")
    assert not is_override(str(partial))
    assert merge({"a": {"b": 1}}, {"a": 2}) == {"a": 2}


def test_masked_secrets_are_found_by_path() -> None:
    config = {"checkpoint_storage": {"secret_key": "********", "hosts": ["x", "********"]}}
    assert _masked_keys(config) == ["checkpoint_storage.secret_key", "checkpoint_storage.hosts.1"]
    assert _masked_keys(BASE) == []
