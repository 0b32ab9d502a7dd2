"""The pool settings: the master's resource_pools and default_resource_pool, the agent's
resource_pool and agent_label; bad values stop the daemon with one line that says what to
fix, and an agent the master refuses for its pool exits non-zero saying why."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from assay.agent._config import load_agent_settings
from assay.common.settings import SettingsError
from assay.master._config import MasterConfig, load_master_config
from assay.master.scheduler import PoolSpec


def _master(tmp_path: Path, text: str) -> MasterConfig:
    file = tmp_path / "master.yaml"
    file.write_text(text)
    return load_master_config(file, {}, {})


def test_nothing_configured_is_one_default_pool_with_the_priority_scheduler() -> None:
    config = load_master_config(None, {}, {})

    assert config.pool_specs == (PoolSpec("default", "", "priority"),)
    assert config.new_pools().names == ("default",)


def test_pools_from_the_file_and_from_the_environment(tmp_path: Path) -> None:
    config = _master(
        tmp_path,
        "resource_pools:\n"
        "  - {name: cpu, description: CPU boxes}\n"
        "  - {name: gpu, scheduler: fair_share}\n"
        "default_resource_pool: cpu\n",
    )
    env = {"ASSAY_RESOURCE_POOLS": "[{name: a}, {name: b}]", "ASSAY_DEFAULT_RESOURCE_POOL": "b"}
    from_env = load_master_config(None, {}, env)

    assert config.pool_specs == (
        PoolSpec("cpu", "CPU boxes", "priority"),
        PoolSpec("gpu", "", "fair_share"),
    )
    assert config.new_pools().default == "cpu"
    assert [s.name for s in from_env.pool_specs] == ["a", "b"]
    assert from_env.default_resource_pool == "b"


def test_a_default_pool_of_another_name_alone(tmp_path: Path) -> None:
    config = _master(tmp_path, "default_resource_pool: shared\n")

    assert config.new_pools().names == ("shared",)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "resource_pools: [{name: gpu}]\n",
            "default_resource_pool 'default' is not one of resource_pools (gpu): set it to one "
            "of them",
        ),
        (
            "resource_pools: [{name: a}, {name: a}]\ndefault_resource_pool: a\n",
            "resource_pools: resource pool names must be unique: a twice",
        ),
        (
            "resource_pools: [{name: default, scheduler: fifo}]\n",
            "resource_pools[0] (default): scheduler must be one of priority, fair_share, got "
            "'fifo'",
        ),
        (
            "resource_pools: [{name: default, weight: 2}]\n",
            "resource_pools[0] has unknown key 'weight': a pool takes name, description, scheduler",
        ),
        (
            "resource_pools: [{name: default, preemption: sometimes}]\n",
            "resource_pools[0] (default): preemption must be true or false",
        ),
        ("resource_pools: [{description: x}]\n", "resource_pools[0].name must be a non-empty"),
        ("resource_pools: [default]\n", "resource_pools[0] must be a mapping with a name"),
        ("resource_pools: gpu\n", "expected a list of {name, description, scheduler"),
    ],
)
def test_bad_pool_settings_say_what_to_fix(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(SettingsError) as error:
        _master(tmp_path, text)

    assert message in str(error.value)


def test_the_agents_pool_and_label() -> None:
    settings = load_agent_settings(None, {"master": "m:1"}, {})
    labelled = load_agent_settings(
        None, {"master": "m:1"}, {"ASSAY_RESOURCE_POOL": "gpu", "ASSAY_AGENT_LABEL": "a100"}
    )

    assert (settings.resource_pool, settings.agent_label) == ("default", None)
    assert (labelled.resource_pool, labelled.agent_label) == ("gpu", "a100")


@pytest.mark.parametrize("key", ["resource_pool", "agent_label"])
def test_a_blank_pool_or_label_is_refused(key: str) -> None:
    with pytest.raises(SettingsError, match=f"{key} must be a name without surrounding spaces"):
        load_agent_settings(None, {"master": "m:1", key: " "}, {})


def test_a_bad_pool_setting_stops_the_master_with_one_line(tmp_path: Path) -> None:
    file = tmp_path / "master.yaml"
    file.write_text("resource_pools: [{name: gpu, scheduler: fifo}]\n")

    done = subprocess.run(
        [sys.executable, "-m", "assay.master.main", "--config", str(file)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == 1
    assert done.stderr.strip() == (
        "error: resource_pools[0] (gpu): scheduler must be one of priority, fair_share, got 'fifo'"
    )


def test_fair_share_pools_preempt_unless_they_say_not_to(tmp_path: Path) -> None:
    config = _master(
        tmp_path,
        "resource_pools:\n"
        "  - {name: fair, scheduler: fair_share}\n"
        "  - {name: calm, scheduler: fair_share, preemption: false}\n"
        "  - {name: ranked}\n"
        "  - {name: eager, preemption: true}\n"
        "default_resource_pool: fair\n",
    )

    preempts = {name: config.preempts(name) for name in ("fair", "calm", "ranked", "eager")}
    assert preempts == {"fair": True, "calm": False, "ranked": False, "eager": True}
