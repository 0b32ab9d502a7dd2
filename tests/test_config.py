"""The experiment config: typed values and defaults, the hyperparameter space, and errors
that name the key path of every problem at once."""

from __future__ import annotations

import copy
import datetime as dt
import math
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from assay.config import (
    MAX_CONFIG_DEPTH,
    MAX_DESCRIPTION_CHARS,
    MAX_LABEL_CHARS,
    MAX_LABELS,
    MAX_NAME_CHARS,
    Categorical,
    Const,
    Double,
    ExperimentConfig,
    HParam,
    Int,
    Length,
    LengthUnit,
    Log,
    load_config,
    parse_config,
    sample_hparams,
)
from assay.errors import InvalidConfigError

FULL_YAML = """
name: mnist-asha
description: every section, Determined's keys
labels: [vision, smoke]
entrypoint: model_def:MNistTrial
hyperparameters:
  global_batch_size: 64
  lr:
    type: log
    minval: -4
    maxval: -1
    base: 10
  dropout: {type: double, minval: 0.1, maxval: 0.5}
  n_filters: {type: int, minval: 8, maxval: 64, count: 4}
  optimizer: {type: categorical, vals: [sgd, adam]}
  momentum: {type: const, val: 0.9}
  arch:
    depth: 3
    width: {type: int, minval: 16, maxval: 32}
searcher:
  name: adaptive_asha
  metric: accuracy
  smaller_is_better: false
  max_length: {epochs: 10}
  max_trials: 16
  max_concurrent_trials: 4
  divisor: 4
  max_rungs: 5
  mode: standard
resources:
  slots_per_trial: 4
  priority: 10
optimizations:
  aggregation_frequency: 2
  mixed_precision: bf16
min_validation_period: {batches: 500}
min_checkpoint_period: {epochs: 1}
checkpoint_storage:
  type: shared_fs
  host_path: /mnt/checkpoints
  storage_path: assay
  save_trial_best: 2
  save_trial_latest: 3
  save_experiment_best: 1
max_restarts: 2
reproducibility:
  experiment_seed: 1234
scheduling_unit: 50
data:
  url: https://example.com/mnist.tar.gz
  workers: 2
"""


def minimal() -> dict[str, Any]:
    """The smallest valid config; tests copy it and break one thing."""
    return {
        "entrypoint": "model_def:MyTrial",
        "hyperparameters": {"global_batch_size": 32},
        "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 100}},
    }


def problems_of(data: Any) -> list[str]:
    """Parse `data`, expecting failure; return the problems (and check the message lists them)."""
    with pytest.raises(InvalidConfigError) as info:
        parse_config(data)
    error = info.value
    assert error.problems, "InvalidConfigError raised with no problems"
    for problem in error.problems:
        assert problem in str(error)
    return error.problems


def assert_problem(problems: list[str], *fragments: str) -> None:
    """Some single problem contains every fragment (e.g. the key path and the rule)."""
    matching = [p for p in problems if all(f in p for f in fragments)]
    assert matching, f"no problem contains {fragments!r}; problems: {problems!r}"


# --- valid configs ---------------------------------------------------------------------


def test_full_config_parses_into_typed_values() -> None:
    config = parse_config(yaml.safe_load(FULL_YAML))

    assert isinstance(config, ExperimentConfig)
    assert config.name == "mnist-asha"
    assert config.description == "every section, Determined's keys"
    assert config.labels == ("vision", "smoke")
    assert config.entrypoint == "model_def:MNistTrial"
    assert config.global_batch_size == 64

    s = config.searcher
    assert s.name == "adaptive_asha"
    assert s.metric == "accuracy"
    assert s.smaller_is_better is False
    assert s.max_length == Length(LengthUnit.EPOCHS, 10)
    assert s.max_trials == 16
    assert s.max_concurrent_trials == 4
    assert dict(s.options) == {"divisor": 4, "max_rungs": 5, "mode": "standard"}

    assert config.resources.slots_per_trial == 4
    assert config.resources.priority == 10
    assert config.optimizations.aggregation_frequency == 2
    assert config.optimizations.mixed_precision == "bf16"
    assert config.min_validation_period == Length.batches(500)
    assert config.min_checkpoint_period == Length.epochs(1)

    storage = config.checkpoint_storage
    assert storage.type == "shared_fs"
    assert storage.host_path == "/mnt/checkpoints"
    assert storage.storage_path == "assay"
    assert (storage.save_trial_best, storage.save_trial_latest) == (2, 3)
    assert storage.save_experiment_best == 1

    assert config.max_restarts == 2
    assert config.experiment_seed == 1234
    assert config.scheduling_unit == 50
    assert dict(config.data) == {"url": "https://example.com/mnist.tar.gz", "workers": 2}
    assert config.raw["name"] == "mnist-asha"


def test_full_config_hyperparameter_types() -> None:
    hp = parse_config(yaml.safe_load(FULL_YAML)).hyperparameters

    assert hp["global_batch_size"] == Const(64)
    assert hp["lr"] == Log(-4.0, -1.0, 10.0, None)
    assert hp["dropout"] == Double(0.1, 0.5, None)
    assert hp["n_filters"] == Int(8, 64, 4)
    assert hp["optimizer"] == Categorical(("sgd", "adam"))
    assert hp["momentum"] == Const(0.9)
    arch = hp["arch"]
    assert isinstance(arch, Mapping)
    assert dict(arch) == {"depth": Const(3), "width": Int(16, 32, None)}
    lr = hp["lr"]
    assert isinstance(lr, Log)
    assert isinstance(lr.minval, float)
    assert isinstance(lr.maxval, float)


def test_minimal_config_gets_the_defaults() -> None:
    config = parse_config(minimal())

    assert config.resources.slots_per_trial == 1
    assert config.resources.priority == 42
    assert config.optimizations.aggregation_frequency == 1
    assert config.optimizations.mixed_precision == "off"
    assert config.max_restarts == 5
    assert config.scheduling_unit == 100
    assert config.experiment_seed == 0
    assert config.name == "experiment"
    assert config.description == ""
    assert config.labels == ()
    assert config.min_validation_period is None
    assert config.min_checkpoint_period is None
    assert config.checkpoint_storage.type == "shared_fs"
    assert config.checkpoint_storage.host_path is None
    assert config.checkpoint_storage.save_trial_best == 1
    assert config.checkpoint_storage.save_trial_latest == 1
    assert config.checkpoint_storage.save_experiment_best == 0
    assert config.searcher.smaller_is_better is True
    assert config.searcher.max_trials is None
    assert config.searcher.max_concurrent_trials == 0
    assert dict(config.searcher.options) == {}
    assert dict(config.data) == {}
    assert config.global_batch_size == 32


def test_zero_values_are_kept_not_replaced_by_defaults() -> None:
    data = minimal()
    data["max_restarts"] = 0
    data["checkpoint_storage"] = {"save_trial_best": 0, "save_trial_latest": 0}
    config = parse_config(data)

    assert config.max_restarts == 0
    assert config.checkpoint_storage.save_trial_best == 0
    assert config.checkpoint_storage.save_trial_latest == 0


@pytest.mark.parametrize("spelling", ["off", "false", "'off'", "fp16", "bf16"])
def test_mixed_precision_yaml_spellings(spelling: str) -> None:
    text = yaml.safe_dump(minimal()) + f"optimizations:\n  mixed_precision: {spelling}\n"
    config = parse_config(yaml.safe_load(text))

    expected = {"false": "off", "'off'": "off"}.get(spelling, spelling)
    assert config.optimizations.mixed_precision == expected


def test_bare_off_is_read_by_yaml_as_false_and_accepted() -> None:
    data = yaml.safe_load("optimizations: {mixed_precision: off}")
    assert data["optimizations"]["mixed_precision"] is False  # the YAML 1.1 trap itself

    config = parse_config({**minimal(), **data})

    assert config.optimizations.mixed_precision == "off"


def test_global_batch_size_as_const_mapping() -> None:
    data = minimal()
    data["hyperparameters"] = {"global_batch_size": {"type": "const", "val": 16}}

    assert parse_config(data).global_batch_size == 16


def test_hyperparameter_types_parse() -> None:
    data = minimal()
    data["hyperparameters"] = {
        "global_batch_size": 32,
        "c": {"type": "const", "val": [1, 2]},
        "bare_list": [1, 2, 3],
        "bare_str": "adam",
        "i": {"type": "int", "minval": -2, "maxval": 2},
        "d": {"type": "double", "minval": 0, "maxval": 1, "count": 3},
        "l": {"type": "log", "minval": -3, "maxval": 0, "base": 2},
        "cat": {"type": "categorical", "vals": [1, "two", None]},
        "nested": {"inner": {"deeper": {"type": "int", "minval": 1, "maxval": 1}}, "k": 5},
    }
    hp = parse_config(data).hyperparameters

    assert hp["c"] == Const([1, 2])
    assert hp["bare_list"] == Const([1, 2, 3])
    assert hp["bare_str"] == Const("adam")
    assert hp["i"] == Int(-2, 2)
    assert hp["d"] == Double(0.0, 1.0, 3)
    assert hp["l"] == Log(-3.0, 0.0, 2.0)
    assert hp["cat"] == Categorical((1, "two", None))
    nested = hp["nested"]
    assert isinstance(nested, Mapping)
    assert nested["k"] == Const(5)
    inner = nested["inner"]
    assert isinstance(inner, Mapping)
    assert inner["deeper"] == Int(1, 1)


# --- sampling --------------------------------------------------------------------------

SPACE: dict[str, HParam] = {
    "global_batch_size": Const(32),
    "i": Int(-3, 7),
    "d": Double(0.25, 0.75),
    "l": Log(-4.0, -1.0, 10.0),
    "l2": Log(1.0, 3.0, 2.0),
    "cat": Categorical(("a", "b", "c")),
    "nested": {"x": Int(0, 1), "y": Const("z"), "deep": {"p": Double(-1.0, 1.0)}},
}


def test_sample_hparams_is_deterministic_for_a_seed() -> None:
    first = sample_hparams(SPACE, random.Random(7))
    second = sample_hparams(SPACE, random.Random(7))
    others = [sample_hparams(SPACE, random.Random(seed)) for seed in range(8, 16)]

    assert first == second
    assert any(o != first for o in others), "different seeds never gave a different point"


def test_sample_hparams_shape_and_bounds() -> None:
    for seed in range(50):
        point = sample_hparams(SPACE, random.Random(seed))
        assert point["global_batch_size"] == 32
        assert isinstance(point["i"], int)
        assert -3 <= point["i"] <= 7
        assert 0.25 <= point["d"] <= 0.75
        assert 1e-4 * (1 - 1e-12) <= point["l"] <= 1e-1 * (1 + 1e-12)
        assert 2.0 * (1 - 1e-12) <= point["l2"] <= 8.0 * (1 + 1e-12)
        assert point["cat"] in ("a", "b", "c")
        assert set(point["nested"]) == {"x", "y", "deep"}
        assert point["nested"]["x"] in (0, 1)
        assert point["nested"]["y"] == "z"
        assert -1.0 <= point["nested"]["deep"]["p"] <= 1.0


def test_sample_hparams_from_parsed_config_is_deterministic() -> None:
    space = parse_config(yaml.safe_load(FULL_YAML)).hyperparameters

    assert sample_hparams(space, random.Random(3)) == sample_hparams(space, random.Random(3))


_finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)


@st.composite
def hparam(draw: st.DrawFn) -> HParam:
    kind = draw(st.sampled_from(["const", "int", "double", "log", "categorical"]))
    if kind == "const":
        return Const(draw(st.integers() | st.text(max_size=5)))
    if kind == "int":
        lo, hi = sorted(draw(st.lists(st.integers(-(10**9), 10**9), min_size=2, max_size=2)))
        return Int(lo, hi)
    if kind == "double":
        lo_f, hi_f = sorted(draw(st.lists(_finite, min_size=2, max_size=2)))
        return Double(lo_f, hi_f)
    if kind == "log":
        exponent = st.floats(min_value=-8, max_value=8, allow_nan=False)
        lo_f, hi_f = sorted(draw(st.lists(exponent, min_size=2, max_size=2)))
        base = draw(st.sampled_from([2.0, math.e, 10.0]))
        return Log(lo_f, hi_f, base)
    vals = draw(st.lists(st.integers() | st.text(max_size=3), min_size=1, max_size=5))
    return Categorical(tuple(vals))


spaces = st.recursive(
    st.dictionaries(st.text(min_size=1, max_size=6), hparam(), max_size=5),
    lambda children: st.dictionaries(
        st.text(min_size=1, max_size=6), hparam() | children, max_size=4
    ),
    max_leaves=12,
)


def _check_bounds(space: Mapping[str, HParam], point: Mapping[str, Any]) -> None:
    assert set(point) == set(space)
    for name, hp in space.items():
        value = point[name]
        if isinstance(hp, Const):
            assert value == hp.val
        elif isinstance(hp, Int):
            assert isinstance(value, int)
            assert hp.minval <= value <= hp.maxval
        elif isinstance(hp, Double):
            assert hp.minval <= value <= hp.maxval
        elif isinstance(hp, Log):
            lo, hi = hp.base**hp.minval, hp.base**hp.maxval
            assert lo * (1 - 1e-9) <= value <= hi * (1 + 1e-9)
        elif isinstance(hp, Categorical):
            assert value in hp.vals
        else:
            _check_bounds(hp, value)


@settings(max_examples=200, deadline=None)
@given(space=spaces, seed=st.integers(0, 2**32))
def test_sample_hparams_property(space: dict[str, HParam], seed: int) -> None:
    point = sample_hparams(space, random.Random(seed))

    assert point == sample_hparams(space, random.Random(seed))
    _check_bounds(space, point)


# --- missing sections ------------------------------------------------------------------


@pytest.mark.parametrize("key", ["entrypoint", "searcher", "hyperparameters"])
def test_missing_required_section(key: str) -> None:
    data = minimal()
    del data[key]

    problems = problems_of(data)

    assert_problem(problems, f"{key}: ", "is required")


def test_missing_global_batch_size() -> None:
    data = minimal()
    data["hyperparameters"] = {"lr": 0.1}

    problems = problems_of(data)

    assert_problem(problems, "hyperparameters.global_batch_size: ", "is required")


def test_every_problem_is_listed_at_once() -> None:
    data: dict[str, Any] = {
        "hyperparameters": {"lr": {"type": "double", "minval": 1, "maxval": 0}},
        "searcher": {"name": "single", "metric": "loss", "max_length": {"batch": 4}},
        "resources": {"priority": 0},
        "optimizations": {"mixed_precision": "fp8"},
        "scheduling_unit": "10",
    }

    problems = problems_of(data)

    assert_problem(problems, "entrypoint: ", "is required")
    assert_problem(problems, "hyperparameters.global_batch_size: ", "is required")
    assert_problem(problems, "hyperparameters.lr: ", "minval", "maxval")
    assert_problem(problems, "searcher.max_length: expected {batches: int} or {epochs: int}")
    assert_problem(problems, "resources.priority: ", "at least 1")
    assert_problem(problems, "optimizations.mixed_precision: ", "fp8")
    assert_problem(problems, "scheduling_unit: ", "expected an integer")
    assert len(problems) == 7, problems


def test_missing_everything_lists_every_required_key() -> None:
    problems = problems_of({})

    for key in ("entrypoint", "hyperparameters", "searcher"):
        assert_problem(problems, f"{key}: ", "is required")


# --- searcher.max_length ---------------------------------------------------------------


@pytest.mark.parametrize(
    "max_length",
    [
        {"batch": 4},
        {"batches": 0},
        {"batches": -3},
        {"batches": "x"},
        {"batches": True},
        {"batches": 1.5},
        {"batches": 4, "epochs": 1},
        {},
        10,
        "100 batches",
        [{"batches": 4}],
    ],
    ids=repr,
)
def test_max_length_wrong_shape(max_length: Any) -> None:
    data = minimal()
    data["searcher"]["max_length"] = max_length

    problems = problems_of(data)

    assert_problem(problems, "searcher.max_length: expected {batches: int} or {epochs: int}")


def test_max_length_in_epochs() -> None:
    data = minimal()
    data["searcher"]["max_length"] = {"epochs": 3}

    length = parse_config(data).searcher.max_length

    assert length == Length.epochs(3)
    assert length.to_batches(10) == 30
    with pytest.raises(InvalidConfigError, match="batches"):
        length.to_batches(None)


def test_min_validation_period_wrong_shape_names_its_key() -> None:
    data = minimal()
    data["min_validation_period"] = {"batches": 0}

    problems = problems_of(data)

    assert_problem(problems, "min_validation_period: expected {batches: int} or {epochs: int}")


# --- unknown keys ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("where", "typo", "path", "suggestion"),
    [
        ((), "schedulng_unit", "schedulng_unit", "scheduling_unit"),
        (("resources",), "slot_per_trial", "resources.slot_per_trial", "slots_per_trial"),
        (("searcher",), "smaller_is_beter", "searcher.smaller_is_beter", "smaller_is_better"),
        (
            ("optimizations",),
            "mixed_precison",
            "optimizations.mixed_precison",
            "mixed_precision",
        ),
        (
            ("hyperparameters", "lr"),
            "maxvall",
            "hyperparameters.lr.maxvall",
            "maxval",
        ),
    ],
)
def test_unknown_key_with_suggestion(
    where: tuple[str, ...], typo: str, path: str, suggestion: str
) -> None:
    data = minimal()
    data["resources"] = {}
    data["optimizations"] = {}
    data["hyperparameters"]["lr"] = {"type": "double", "minval": 0.0, "maxval": 1.0}
    target = data
    for key in where:
        target = target[key]
    target[typo] = 1

    problems = problems_of(data)

    assert_problem(problems, f"{path}: unknown key", f"did you mean {suggestion!r}?")


def test_unknown_key_without_close_match_lists_allowed_keys() -> None:
    data = minimal()
    data["resources"] = {"zzzzzz": 1}

    problems = problems_of(data)

    assert_problem(problems, "resources.zzzzzz: unknown key", "slots_per_trial", "priority")
    assert not any("did you mean" in p for p in problems)


# --- wrong types -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("resources.slots_per_trial", "2", "expected an integer, got a string"),
        ("resources.slots_per_trial", True, "expected an integer, got a boolean"),
        ("resources.priority", 5.0, "expected an integer, got a number"),
        ("max_restarts", "3", "expected an integer, got a string"),
        ("max_restarts", False, "expected an integer, got a boolean"),
        ("scheduling_unit", True, "expected an integer, got a boolean"),
        ("optimizations.aggregation_frequency", "4", "expected an integer"),
        ("reproducibility.experiment_seed", "7", "expected an integer"),
        ("searcher.max_trials", True, "expected an integer, got a boolean"),
        ("searcher.smaller_is_better", "no", "expected true or false"),
        ("searcher.metric", 3, "expected a string, got an integer"),
        ("entrypoint", 3, "a command string or a list"),
        ("name", ["x"], "expected a string, got a list"),
        ("labels", "abc", "expected a list of strings"),
        ("data", "abc", "expected a mapping, got a string"),
        ("resources", 4, "expected a mapping, got an integer"),
        ("searcher", "single", "expected a mapping, got a string"),
        ("hyperparameters", [1, 2], "expected a mapping, got a list"),
    ],
)
def test_wrong_type(path: str, value: Any, expected: str) -> None:
    data = minimal()
    data["searcher"]["name"] = "random"
    *parents, last = path.split(".")
    target = data
    for key in parents:
        target = target.setdefault(key, {})
    target[last] = value

    problems = problems_of(data)

    assert_problem(problems, f"{path}: ", expected)


@pytest.mark.parametrize(
    ("hp", "path", "expected"),
    [
        ({"type": "int", "minval": "1", "maxval": 4}, "x.minval", "expected an integer"),
        ({"type": "int", "minval": 1.5, "maxval": 4}, "x.minval", "expected an integer"),
        ({"type": "int", "minval": 1, "maxval": True}, "x.maxval", "expected an integer"),
        ({"type": "double", "minval": "0", "maxval": 1}, "x.minval", "expected a number"),
        ({"type": "double", "minval": 0, "maxval": False}, "x.maxval", "expected a number"),
        ({"type": "int", "maxval": 4}, "x.minval", "is required"),
        ({"type": "log", "minval": -3}, "x.maxval", "is required"),
        ({"type": "const"}, "x.val", "is required"),
        ({"type": "int", "minval": 1, "maxval": 4, "count": 0}, "x.count", "at least 1"),
        ({"type": "log", "minval": -3, "maxval": -1, "base": 1}, "x.base", "not 1"),
        ({"type": "log", "minval": -3, "maxval": -1, "base": -2}, "x.base", "positive"),
        ({"type": "categorical", "vals": "abc"}, "x.vals", "non-empty list"),
    ],
    ids=repr,
)
def test_bad_hyperparameter_fields(hp: dict[str, Any], path: str, expected: str) -> None:
    data = minimal()
    data["hyperparameters"]["x"] = hp

    problems = problems_of(data)

    assert_problem(problems, f"hyperparameters.{path}: ", expected)


@pytest.mark.parametrize("kind", ["int", "double", "log"])
def test_minval_greater_than_maxval(kind: str) -> None:
    data = minimal()
    data["hyperparameters"]["x"] = {"type": kind, "minval": 5, "maxval": 2}

    problems = problems_of(data)

    assert_problem(problems, "hyperparameters.x: ", "minval (5", "must not exceed maxval (2")


def test_minval_equal_to_maxval_is_allowed() -> None:
    data = minimal()
    data["hyperparameters"]["x"] = {"type": "int", "minval": 3, "maxval": 3}

    assert parse_config(data).hyperparameters["x"] == Int(3, 3)


def test_empty_categorical() -> None:
    data = minimal()
    data["hyperparameters"]["opt"] = {"type": "categorical", "vals": []}

    problems = problems_of(data)

    assert_problem(problems, "hyperparameters.opt.vals: ", "expected a non-empty list")


def test_count_on_categorical() -> None:
    data = minimal()
    data["hyperparameters"]["opt"] = {"type": "categorical", "vals": ["a", "b"], "count": 2}

    problems = problems_of(data)

    assert_problem(problems, "hyperparameters.opt.count: ", "only allowed on int, double and log")


def test_nested_hyperparameter_problem_has_full_path() -> None:
    data = minimal()
    data["hyperparameters"]["model"] = {"encoder": {"depth": {"type": "int", "minval": 2}}}

    problems = problems_of(data)

    assert_problem(problems, "hyperparameters.model.encoder.depth.maxval: ", "is required")


def test_unknown_hyperparameter_type() -> None:
    data = minimal()
    data["hyperparameters"]["lr"] = {"type": "float", "minval": 0.0, "maxval": 1.0}

    problems = problems_of(data)

    assert_problem(
        problems, "hyperparameters.lr.type: ", "const | int | double | log | categorical", "float"
    )


def test_unknown_hyperparameter_type_reports_only_the_type() -> None:
    # An unknown `type` must not be parsed as if it were `const`: the user wrote a range and
    # would be told that `val` is required and `minval`/`maxval` are unknown keys.
    data = minimal()
    data["hyperparameters"]["lr"] = {"type": "float", "minval": 0.0, "maxval": 1.0}

    problems = problems_of(data)

    assert [p for p in problems if p.startswith("hyperparameters.lr")] == [
        "hyperparameters.lr.type: expected one of const | int | double | log | categorical, "
        "got 'float'"
    ]


# --- global_batch_size -----------------------------------------------------------------


@pytest.mark.parametrize(("gbs", "slots"), [(30, 4), (7, 2), (1, 3)])
def test_global_batch_size_not_divisible_by_slots(gbs: int, slots: int) -> None:
    data = minimal()
    data["hyperparameters"]["global_batch_size"] = gbs
    data["resources"] = {"slots_per_trial": slots}

    problems = problems_of(data)

    assert_problem(
        problems,
        "hyperparameters.global_batch_size: ",
        f"{gbs} is not divisible by resources.slots_per_trial ({slots})",
        f"multiple of {slots}",
    )


def test_global_batch_size_divisible_by_slots() -> None:
    data = minimal()
    data["hyperparameters"]["global_batch_size"] = 24
    data["resources"] = {"slots_per_trial": 3}

    config = parse_config(data)

    assert (config.global_batch_size, config.resources.slots_per_trial) == (24, 3)


@pytest.mark.parametrize(
    "hp",
    [
        {"type": "int", "minval": 16, "maxval": 64},
        {"type": "categorical", "vals": [16, 32]},
        {"type": "double", "minval": 16, "maxval": 64},
    ],
    ids=repr,
)
def test_global_batch_size_as_a_range(hp: dict[str, Any]) -> None:
    data = minimal()
    data["hyperparameters"]["global_batch_size"] = hp

    problems = problems_of(data)

    assert_problem(problems, "hyperparameters.global_batch_size: ", "constant integer")


@pytest.mark.parametrize("value", [0, -8, "32", 32.0, True, None, [32]], ids=repr)
def test_global_batch_size_not_a_positive_integer(value: Any) -> None:
    data = minimal()
    data["hyperparameters"]["global_batch_size"] = value

    problems = problems_of(data)

    assert_problem(problems, "hyperparameters.global_batch_size: ")


# --- resources, optimizations, searcher ------------------------------------------------


@pytest.mark.parametrize(("priority", "rule"), [(0, "at least 1"), (100, "at most 99")])
def test_priority_out_of_range(priority: int, rule: str) -> None:
    data = minimal()
    data["resources"] = {"priority": priority}

    problems = problems_of(data)

    assert_problem(problems, "resources.priority: ", rule, str(priority))


@pytest.mark.parametrize("priority", [1, 99])
def test_priority_bounds_are_inclusive(priority: int) -> None:
    data = minimal()
    data["resources"] = {"priority": priority}

    assert parse_config(data).resources.priority == priority


def test_slots_per_trial_zero() -> None:
    data = minimal()
    data["resources"] = {"slots_per_trial": 0}

    problems = problems_of(data)

    assert_problem(problems, "resources.slots_per_trial: ", "at least 1")


@pytest.mark.parametrize("value", ["fp32", "on", True, 16, "FP16"], ids=repr)
def test_mixed_precision_invalid(value: Any) -> None:
    data = minimal()
    data["optimizations"] = {"mixed_precision": value}

    problems = problems_of(data)

    assert_problem(problems, "optimizations.mixed_precision: ", "off | fp16 | bf16")


def test_aggregation_frequency_zero() -> None:
    data = minimal()
    data["optimizations"] = {"aggregation_frequency": 0}

    problems = problems_of(data)

    assert_problem(problems, "optimizations.aggregation_frequency: ", "at least 1")


@pytest.mark.parametrize(
    ("name", "key", "value"),
    [
        ("single", "divisor", 4),
        ("single", "max_trials", 4),
        ("single", "max_concurrent_trials", 2),
        ("grid", "max_trials", 4),
        ("random", "divisor", 4),
        ("asha", "mode", "standard"),
        ("bayesian", "num_rungs", 3),
    ],
)
def test_searcher_key_not_valid_for_that_searcher(name: str, key: str, value: Any) -> None:
    data = minimal()
    data["searcher"].update({"name": name, key: value})

    problems = problems_of(data)

    assert_problem(problems, f"searcher.{key}: ", f"not a setting of the {name} searcher")


@pytest.mark.parametrize(
    ("name", "extra"),
    [
        ("grid", {"max_concurrent_trials": 2}),
        ("random", {"max_trials": 8, "sampler": "tpe"}),
        ("asha", {"max_trials": 8, "divisor": 3, "num_rungs": 3, "max_rungs": 4}),
        ("adaptive_asha", {"max_trials": 8, "mode": "aggressive", "bracket_rungs": [2, 3]}),
        ("bayesian", {"max_trials": 8}),
    ],
)
def test_searcher_specific_keys_are_accepted(name: str, extra: dict[str, Any]) -> None:
    data = minimal()
    data["searcher"].update({"name": name, **extra})

    searcher = parse_config(data).searcher

    assert searcher.name == name


def test_unknown_searcher_name() -> None:
    data = minimal()
    data["searcher"]["name"] = "hyperband"

    problems = problems_of(data)

    assert_problem(problems, "searcher.name: ", "single | grid | random", "hyperband")


def test_unknown_searcher_name_reports_only_the_name() -> None:
    # With an unknown (or missing) name the parser must not judge the other keys as if the
    # searcher were `single`: max_trials is fine for the searcher the user meant.
    data = minimal()
    data["searcher"].update({"name": "randum", "max_trials": 8})

    problems = problems_of(data)

    assert [p for p in problems if p.startswith("searcher")] == [
        "searcher.name: expected one of single | grid | random | asha | adaptive_asha | "
        "bayesian | async_halving | pbt | custom, got 'randum'"
    ]


def test_s3_storage_needs_a_bucket() -> None:
    data = minimal()
    data["checkpoint_storage"] = {"type": "s3", "prefix": "runs"}

    problems = problems_of(data)

    assert_problem(problems, "checkpoint_storage.bucket: ", "is required")


def test_s3_storage_parses_every_key() -> None:
    data = minimal()
    data["checkpoint_storage"] = {
        "type": "s3",
        "bucket": "my-bucket.v2",
        "prefix": "/team/a/",
        "endpoint_url": "http://minio:9000",
        "region": "eu-west-1",
        "access_key": "AK",
        "secret_key": "SK",
        "save_experiment_best": 2,
    }

    storage = parse_config(data).checkpoint_storage

    assert (storage.type, storage.bucket, storage.prefix) == ("s3", "my-bucket.v2", "team/a")
    assert (storage.endpoint_url, storage.region) == ("http://minio:9000", "eu-west-1")
    assert (storage.access_key, storage.secret_key) == ("AK", "SK")
    assert (storage.save_trial_best, storage.save_trial_latest) == (1, 1)
    assert storage.save_experiment_best == 2
    assert storage.host_directory is None


def test_s3_prefix_defaults_to_empty() -> None:
    data = minimal()
    data["checkpoint_storage"] = {"type": "s3", "bucket": "b-1"}

    assert parse_config(data).checkpoint_storage.prefix == ""


@pytest.mark.parametrize(
    ("storage", "fragments"),
    [
        (
            {"type": "shared_fs", "host_path": "/x", "bucket": "b-1"},
            ("checkpoint_storage.bucket: ", "is a setting of s3 storage, not shared_fs"),
        ),
        (
            {"type": "s3", "bucket": "b-1", "host_path": "/x"},
            ("checkpoint_storage.host_path: ", "is a setting of shared_fs storage, not s3"),
        ),
        (
            {"type": "s3", "bucket": "Bad_Bucket"},
            ("checkpoint_storage.bucket: ", "'Bad_Bucket' is not a bucket name"),
        ),
        (
            {"type": "s3", "bucket": "b-1", "endpoint_url": "minio:9000"},
            ("checkpoint_storage.endpoint_url: ", "http:// or https://", "'minio:9000'"),
        ),
        (
            {"type": "s3", "bucket": "b-1", "access_key": "AK"},
            ("checkpoint_storage.secret_key: ", "required with checkpoint_storage.access_key"),
        ),
        (
            {"type": "s3", "bucket": "b-1", "secret_key": "SK"},
            ("checkpoint_storage.access_key: ", "required with checkpoint_storage.secret_key"),
        ),
        (
            {"type": "s3", "bucket": "b-1", "prefix": "a/../b"},
            ("checkpoint_storage.prefix: ", "must not contain '..'"),
        ),
        (
            {"type": "s3", "bucket": "b-1", "regoin": "x"},
            ("checkpoint_storage.regoin: ", "did you mean 'region'"),
        ),
        (
            {"type": "gcs", "bucket": "b-1"},
            ("checkpoint_storage.type: ", "gcs storage is not in this release", "shared_fs", "s3"),
        ),
        (
            {"save_trial_latest": -1},
            ("checkpoint_storage.save_trial_latest: ", "must be at least 0, got -1"),
        ),
    ],
)
def test_storage_problems_name_their_key(
    storage: dict[str, Any], fragments: tuple[str, ...]
) -> None:
    data = minimal()
    data["checkpoint_storage"] = storage

    problems = problems_of(data)

    assert_problem(problems, *fragments)
    assert len(problems) == 1, problems


# --- entrypoint, non-mapping config ----------------------------------------------------


@pytest.mark.parametrize(
    "entrypoint",
    [
        "model_def",
        "model_def.MyTrial",
        "model_def:",
        ":MyTrial",
        "model_def:My-Trial",
        "1model:MyTrial",
        "a:b:c",
        "",
    ],
)
def test_entrypoint_malformed(entrypoint: str) -> None:
    data = minimal()
    data["entrypoint"] = entrypoint

    problems = problems_of(data)

    assert_problem(problems, "entrypoint: ", "module:ClassName", repr(entrypoint))


@pytest.mark.parametrize("entrypoint", ["model_def:MyTrial", "pkg.sub.mod:Outer.Inner", "_m:_T"])
def test_entrypoint_well_formed(entrypoint: str) -> None:
    data = minimal()
    data["entrypoint"] = entrypoint

    assert parse_config(data).entrypoint == entrypoint


@pytest.mark.parametrize(
    ("entrypoint", "argv"),
    [
        ("python3 train.py", ("python3", "train.py")),
        ("python3 train.py --epochs 1", ("python3", "train.py", "--epochs", "1")),
        (["python3", "train.py"], ("python3", "train.py")),
        (
            "python3 -m assay.launch.torch_distributed python3 train.py",
            ("python3", "-m", "assay.launch.torch_distributed", "python3", "train.py"),
        ),
        ("./run.sh 'a b'", ("./run.sh", "a b")),
    ],
)
def test_entrypoint_command(entrypoint: Any, argv: tuple[str, ...]) -> None:
    data = minimal()
    data["entrypoint"] = entrypoint
    del data["hyperparameters"]["global_batch_size"]  # a script batches its own data

    config = parse_config(data)

    assert config.command == argv
    assert config.is_script


@pytest.mark.parametrize(
    ("entrypoint", "fragment"),
    [
        ("train.py", "write 'python3 train.py'"),
        ([], "non-empty strings"),
        (["python3", ""], "non-empty strings"),
        ("python3 'train.py", "cannot split"),
        ("   ", "is empty"),
    ],
)
def test_entrypoint_bad_command(entrypoint: Any, fragment: str) -> None:
    data = minimal()
    data["entrypoint"] = entrypoint

    assert_problem(problems_of(data), "entrypoint: ", fragment)


def test_trial_entrypoint_still_needs_global_batch_size() -> None:
    data = minimal()
    del data["hyperparameters"]["global_batch_size"]

    assert_problem(problems_of(data), "hyperparameters.global_batch_size", "is required")


def test_time_metric_and_max_time() -> None:
    data = minimal()
    data["entrypoint"] = "python3 train.py"
    del data["searcher"]["max_length"]
    data["searcher"].update(time_metric="batches", max_time=100)

    config = parse_config(data)

    assert config.searcher.time_metric == "batches"
    assert config.searcher.max_length.value == 100


def test_max_time_needs_time_metric_and_excludes_max_length() -> None:
    data = minimal()
    data["searcher"]["max_time"] = 100

    problems = problems_of(data)

    assert_problem(problems, "searcher.max_time", "not both")
    assert_problem(problems, "searcher.time_metric", "is required with max_time")


@pytest.mark.parametrize("data", [None, [], ["entrypoint"], "entrypoint: x", 3], ids=repr)
def test_non_mapping_config(data: Any) -> None:
    problems = problems_of(data)

    assert_problem(problems, "<config>: expected a mapping")


def test_parse_config_does_not_modify_its_input() -> None:
    data = yaml.safe_load(FULL_YAML)
    before = copy.deepcopy(data)

    parse_config(data)

    assert data == before


# --- load_config -----------------------------------------------------------------------


def test_load_config_reads_yaml(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(FULL_YAML)

    assert load_config(path) == parse_config(yaml.safe_load(FULL_YAML))
    assert load_config(str(path)).name == "mnist-asha"


def test_load_config_invalid_yaml(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("entrypoint: model_def:T\nsearcher: {name: single\n  metric: [\n")

    with pytest.raises(InvalidConfigError) as info:
        load_config(path)

    assert len(info.value.problems) == 1
    assert str(path) in info.value.problems[0]
    assert "is not valid YAML" in info.value.problems[0]
    assert "line" in info.value.problems[0]


def test_load_config_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"

    with pytest.raises(InvalidConfigError) as info:
        load_config(path)

    assert len(info.value.problems) == 1
    assert "cannot read config file" in info.value.problems[0]
    assert str(path) in info.value.problems[0]


def test_load_config_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("")

    with pytest.raises(InvalidConfigError) as info:
        load_config(path)

    assert_problem(info.value.problems, "<config>: expected a mapping")


def test_load_config_reports_schema_problems_with_paths(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        yaml.safe_dump(minimal())
        + "resources: {slots_per_trial: 3}\n"
        + "optimizations: {mixed_precision: off}\n"
    )

    with pytest.raises(InvalidConfigError) as info:
        load_config(path)

    assert info.value.problems == [
        "hyperparameters.global_batch_size: 32 is not divisible by "
        "resources.slots_per_trial (3); use a multiple of 3"
    ]


@pytest.mark.parametrize("name", ["single", "random", "grid", "bayesian"])
def test_a_script_may_leave_out_max_length_where_nothing_is_halved(name: str) -> None:
    from assay.config._length import UNBOUNDED_LENGTH

    data: dict[str, Any] = {
        "entrypoint": "python3 2_checkpoints.py",
        "searcher": {"name": name, "metric": "x"},
    }
    if name in ("random", "bayesian"):
        data["searcher"]["max_trials"] = 2
    if name == "grid":
        data["hyperparameters"] = {"a": {"type": "categorical", "vals": [1, 2]}}

    config = parse_config(data)

    assert config.searcher.max_length.value == UNBOUNDED_LENGTH


def test_asha_and_trials_still_need_max_length() -> None:
    script = {
        "entrypoint": "python3 t.py",
        "searcher": {"name": "asha", "metric": "x", "max_trials": 4},
    }
    assert_problem(problems_of(script), "searcher.max_length", "is required")
    trial = minimal()
    del trial["searcher"]["max_length"]
    assert_problem(problems_of(trial), "searcher.max_length", "is required")


# --- limits: what the master's store and every client can hold ------------------------------


def limit_problems_of(data: Any) -> list[str]:
    """`problems_of`, with the limits the master applies to a submission."""
    with pytest.raises(InvalidConfigError) as info:
        parse_config(data, limits=True)
    return info.value.problems


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"k": value}
    return value


def test_nesting_is_bounded_with_the_config_counted_as_the_first_level() -> None:
    at_limit = {**minimal(), "data": _nested(MAX_CONFIG_DEPTH - 1)}  # data is level 2
    assert parse_config(at_limit, limits=True).data == at_limit["data"]

    deeper = {**minimal(), "data": _nested(MAX_CONFIG_DEPTH)}
    problems = limit_problems_of(deeper)

    assert len(problems) == 1  # nothing else is parsed once something nests too deep
    assert_problem(problems, "data" + ".k" * (MAX_CONFIG_DEPTH - 1) + ":", "more than 32 deep")


def test_a_list_counts_as_a_level_and_deep_hyperparameters_are_not_recursed_into() -> None:
    lists: Any = 1
    for _ in range(MAX_CONFIG_DEPTH):
        lists = [lists]
    assert_problem(
        limit_problems_of({**minimal(), "data": {"x": lists}}), "data.x" + "[0]" * 30 + ":"
    )

    config = minimal()
    config["hyperparameters"]["deep"] = _nested(5000)  # would exhaust a recursive parser
    assert_problem(limit_problems_of(config), "hyperparameters.deep.k", "flatten it")


@pytest.mark.parametrize(
    ("value", "fragments"),
    [
        ("a\x00b", ("data.v:", "NUL")),
        (float("nan"), ("data.v:", "not a finite number")),
        (float("-inf"), ("data.v:", "not a finite number")),
        (2**63, ("data.v:", "64 bits")),
        (-(2**63) - 1, ("data.v:", "64 bits")),
        (b"x", ("data.v:", "binary")),
        ({"a"}, ("data.v:", "a set", "write a list")),
        (dt.date(2001, 12, 14), ("data.v:", "a date", "quote it")),
        (dt.datetime(2001, 12, 14, 1, 2), ("data.v:", "a date")),
        (object(), ("data.v:", "a object")),
    ],
)
def test_values_json_and_postgresql_cannot_hold_are_refused(
    value: Any, fragments: tuple[str, ...]
) -> None:
    assert_problem(limit_problems_of({**minimal(), "data": {"v": value}}), *fragments)


def test_values_they_can_hold_are_accepted() -> None:
    data = {
        "text": "tab\tnewline\n\x1bescape é \U0001f600",  # only NUL is unstorable in data
        "ints": [2**63 - 1, -(2**63)],
        "floats": [1e308, -0.0],
        "keys": {2: "int", 1.5: "float", True: "bool", None: "null"},
    }
    assert parse_config({**minimal(), "data": data}, limits=True).data == data


def test_keys_are_checked_and_shown_safely() -> None:
    problems = limit_problems_of({**minimal(), "data": {"a\x00": 1, dt.date(2001, 1, 1): 2}})
    assert_problem(problems, "data:", "the key 'a\\x00'", "NUL")
    assert_problem(problems, "data:", "the key datetime.date(2001, 1, 1)", "quote it")
    long_key = {"k" * 100: {"x": float("nan")}}
    assert_problem(
        limit_problems_of({**minimal(), "data": long_key}), "data." + "k" * 40 + "....x:"
    )


@pytest.mark.parametrize(
    ("key", "value", "fragments"),
    [
        ("name", "n" * (MAX_NAME_CHARS + 1), ("name:", "256 characters", "at most 255")),
        ("name", "a\x1b[31mb", ("name:", "U+001B", "plain text")),
        ("name", "a\nb", ("name:", "U+000A")),
        ("name", "a\x9bb", ("name:", "U+009B")),  # C1's one-byte escape
        ("name", "a\x00b", ("name:", "NUL")),
        ("description", "d" * (MAX_DESCRIPTION_CHARS + 1), ("description:", "at most 4096")),
        ("description", "bell\x07", ("description:", "U+0007", "tabs and newlines")),
        ("labels", ["ok", "l" * (MAX_LABEL_CHARS + 1)], ("labels[1]:", "at most 255")),
        ("labels", ["a\tb"], ("labels[0]:", "U+0009")),
        ("labels", [str(i) for i in range(MAX_LABELS + 1)], ("labels:", "65 labels", "64")),
    ],
)
def test_names_descriptions_and_labels_are_bounded(
    key: str, value: Any, fragments: tuple[str, ...]
) -> None:
    assert_problem(limit_problems_of({**minimal(), key: value}), *fragments)


def test_names_descriptions_and_labels_at_their_limits_are_accepted() -> None:
    config = parse_config(
        {
            **minimal(),
            "name": "n" * MAX_NAME_CHARS,
            "description": "line one\n\tline two " + "d" * (MAX_DESCRIPTION_CHARS - 20),
            "labels": ["é" * MAX_LABEL_CHARS] + [str(i) for i in range(MAX_LABELS - 1)],
        },
        limits=True,
    )
    assert len(config.name) == MAX_NAME_CHARS
    assert len(config.labels) == MAX_LABELS


def test_limits_apply_only_where_asked_for() -> None:
    """A config the master accepted before, or a local run's (nothing stored), is read
    without them."""
    stored = {**minimal(), "name": "n" * 1000, "data": {"deep": _nested(40), "x": float("inf")}}
    assert parse_config(stored).name == "n" * 1000
    assert_problem(limit_problems_of(stored), "data.deep.k", "more than 32 deep")


@pytest.mark.parametrize(
    ("hparam", "fragments"),
    [
        ({"type": "log", "minval": 300, "maxval": 400, "base": 10}, ("overflows", "exponents")),
        ({"type": "log", "minval": -2000, "maxval": 0, "base": 0.5}, ("overflows",)),
        ({"type": "double", "minval": -1.7e308, "maxval": 1.7e308}, ("overflows a float",)),
    ],
)
def test_hyperparameter_ranges_whose_samples_overflow_are_refused(
    hparam: dict[str, Any], fragments: tuple[str, ...]
) -> None:
    config = minimal()
    config["hyperparameters"]["lr"] = hparam
    assert_problem(limit_problems_of(config), "hyperparameters.lr:", *fragments)


def test_a_log_hyperparameter_with_bounds_that_look_like_values_is_warned_about() -> None:
    """Optuna's and Ray's log-uniform take values (1e-4, 0.1); Determined's `log` takes
    exponents, so those bounds search 1.0002 to 1.26 without a word."""
    config = parse_config(
        {
            "entrypoint": "python3 train.py",
            "hyperparameters": {
                "lr": {"type": "log", "minval": 0.0001, "maxval": 0.1},
                "wd": {"type": "log", "minval": -5, "maxval": -1},
                "n": {"type": "log", "minval": 1, "maxval": 3, "base": 2},
            },
            "searcher": {"name": "random", "metric": "loss", "max_length": 10, "max_trials": 2},
        }
    )
    assert config.warnings == (
        "hyperparameters.lr: type log takes exponents of base 10, so it searches 1.00023 to "
        "1.25893; for values from 0.0001 to 0.1 give minval: -4, maxval: -1",
    )
