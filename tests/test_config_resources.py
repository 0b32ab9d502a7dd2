"""`resources.weight`, `resources.max_slots` and `resources.memory`: accepted, defaulted,
refused with one message; the master's user_slot_quota and a pool's own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from assay.common.settings import SettingsError
from assay.config import parse_config
from assay.errors import InvalidConfigError
from assay.master._config import load_master_config

WEIGHT = (
    "resources.weight: must be a number from 0.001 to 1e+06 (a share relative to other "
    "experiments' weights; default 1), "
)


def config(**resources: Any) -> dict[str, Any]:
    return {
        "entrypoint": "model_def:T",
        "hyperparameters": {"global_batch_size": 64},
        "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 100}},
        "resources": resources,
    }


def only_problem(data: dict[str, Any]) -> str:
    with pytest.raises(InvalidConfigError) as info:
        parse_config(data)
    problems = info.value.problems
    assert len(problems) == 1, problems
    return problems[0]


def test_defaults_are_weight_one_and_no_cap() -> None:
    resources = parse_config(config()).resources
    assert (resources.weight, resources.max_slots) == (1.0, None)


def test_weight_and_max_slots_are_read() -> None:
    resources = parse_config(config(slots_per_trial=2, weight=2.5, max_slots=4)).resources
    assert (resources.weight, resources.max_slots) == (2.5, 4)
    assert parse_config(config(weight=3)).resources.weight == 3.0


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        ({"weight": 0}, WEIGHT + "got 0"),
        ({"weight": -1.5}, WEIGHT + "got -1.5"),
        # Two such weights summed to infinity, and the pool's scheduling round failed.
        ({"weight": 1e308}, WEIGHT + "got 1e+308"),
        ({"weight": 1e-320}, WEIGHT + "got 1e-320"),
        ({"weight": "heavy"}, "resources.weight: expected a number, got"),
        ({"weight": True}, "resources.weight: expected a number, got"),
        ({"weight": float("nan")}, WEIGHT + "got nan"),
        ({"max_slots": 0}, "resources.max_slots: must be at least 1, got 0"),
        ({"max_slots": 1.5}, "resources.max_slots: expected an integer"),
        (
            {"slots_per_trial": 4, "max_slots": 2},
            "resources.max_slots: must be at least slots_per_trial (4)",
        ),
    ],
)
def test_bad_values_get_one_message(resources: dict[str, Any], expected: str) -> None:
    assert only_problem(config(**resources)).startswith(expected)


@pytest.mark.parametrize(
    ("memory", "size"),
    [
        ("8G", 8 << 30),
        ("512Mi", 512 << 20),
        ("4GiB", 4 << 30),
        ("1.5g", 3 << 29),
        ("64 MB", 64 << 20),  # powers of 1024, as docker, Slurm and systemd read them
        (1 << 30, 1 << 30),
    ],
)
def test_memory_is_a_size_per_slot(memory: object, size: int) -> None:
    assert parse_config(config(memory=memory)).resources.memory == size
    assert parse_config(config()).resources.memory is None


@pytest.mark.parametrize(
    ("memory", "expected"),
    [
        ("lots", "expected a size such as 8G, 512Mi, 4GiB (powers of 1024) or a number of"),
        ("8X", "expected a size such as 8G"),
        ("-1G", "expected a size such as 8G"),
        (True, "expected a size such as 8G"),
        ([8], "expected a size such as 8G"),
        ("1.5", "expected a whole number of bytes, got '1.5'"),
        (float("inf"), "expected a whole number of bytes"),
        ("1M", "must be from 16 MiB to 1 EiB, got '1M' (1 MiB)"),
        (0, "must be from 16 MiB to 1 EiB, got 0"),
        (2**70, "must be from 16 MiB to 1 EiB"),
    ],
)
def test_a_memory_that_is_no_size_is_refused_with_its_key(memory: object, expected: str) -> None:
    problem = only_problem(config(memory=memory))
    assert problem.startswith("resources.memory: " + expected), problem
    assert problem.endswith("(the memory of each slot: a trial of N slots gets N times it)")


def test_a_pool_may_set_its_own_user_quota(tmp_path: Path) -> None:
    file = tmp_path / "master.yaml"
    file.write_text("user_slot_quota: 4\nresource_pools: [{name: default, user_slot_quota: 2}]\n")
    config = load_master_config(file, {}, {})
    assert config.user_slot_quota == 4
    assert config.pool_specs[0].user_slot_quota == 2
    file.write_text("resource_pools: [{name: default, user_slot_quota: 0}]\n")
    with pytest.raises(SettingsError, match=r"resource_pools\[0\] \(default\): user_slot_quota"):
        load_master_config(file, {}, {})
    file.write_text("user_slot_quota: none\n")
    with pytest.raises(SettingsError, match="user_slot_quota"):
        load_master_config(file, {}, {})
