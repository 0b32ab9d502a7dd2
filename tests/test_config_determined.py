"""Determined 0.38 configs as users bring them: every key is honoured, or accepted with a
warning when it changes nothing, or refused with what Assay does instead."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from assay.agent._allocation import Allocation
from assay.cli.main import cli
from assay.common.tls import ClientTls
from assay.config import Const, ExperimentConfig, parse_config, searcher_in_batches
from assay.config._search import search_spec
from assay.errors import InvalidConfigError
from assay.proto import agent_pb2

MNIST_TRAINER = """
name: mnist_pytorch_trainer
description: the Trainer API tutorial
entrypoint: python3 train.py
records_per_epoch: 60000
hyperparameters:
  global_batch_size: 64
  learning_rate: 1.0
  n_filters1: 32
  n_filters2: 64
  dropout1: 0.25
  dropout2: 0.5
searcher:
  name: single
  metric: validation_loss
  max_length:
    epochs: 1
  smaller_is_better: true
resources:
  slots_per_trial: 1
min_validation_period:
  records: 6400
checkpoint_policy: all
perform_initial_validation: true
max_restarts: 0
workspace: Uncategorized
project: Uncategorized
data:
  url: https://example.com/pytorch_mnist.tar.gz
labels: [mnist, tutorial]
"""

ADAPTIVE_TIME = """
name: mnist_adaptive
entrypoint: model_def:MNistTrial
hyperparameters:
  global_batch_size: 64
  learning_rate: {type: double, minval: 0.0001, maxval: 1.0}
  n_filters1: {type: int, minval: 8, maxval: 64}
searcher:
  name: adaptive_asha
  metric: validation_loss
  smaller_is_better: true
  max_trials: 16
  time_metric: batches
  max_time: 100
"""

# Determined's Core API tutorial (examples/tutorials/core_api), stages 0 to 4.
CORE_API = {
    "0_start": """
name: core-api-stage-0
entrypoint: python3 0_start.py
searcher:
   name: single
   metric: x
   max_length: 1
max_restarts: 0
""",
    "1_metrics": """
name: core-api-stage-1
entrypoint: python3 1_metrics.py
searcher:
   name: single
   metric: x
   max_length: 1
max_restarts: 5
""",
    "2_checkpoints": """
name: core-api-stage-2
entrypoint: python3 2_checkpoints.py
searcher:
   name: single
   metric: x
   max_length: 1
max_restarts: 0
""",
    "3_hpsearch": """
name: core-api-stage-3
entrypoint: python3 3_hpsearch.py
hyperparameters:
  increment_by:
    type: int
    minval: 1
    maxval: 8
searcher:
   name: adaptive_asha
   metric: x
   max_trials: 10
   time_metric: batches
   max_time: 100
max_restarts: 0
""",
    "4_distributed": """
name: core-api-stage-4
entrypoint: python3 -m determined.launch.torch_distributed python3 4_distributed.py
resources:
  slots_per_trial: 8
hyperparameters:
  increment_by:
    type: int
    minval: 1
    maxval: 8
searcher:
   name: single
   metric: x
   max_length: 100
max_restarts: 0
""",
}


def parse(text: str) -> ExperimentConfig:
    return parse_config(yaml.safe_load(text))


def base(**overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "entrypoint": "model_def:T",
        "hyperparameters": {"global_batch_size": 64},
        "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 100}},
    }
    config.update(overrides)
    return config


def problems_of(data: dict[str, Any]) -> list[str]:
    with pytest.raises(InvalidConfigError) as info:
        parse_config(data)
    return info.value.problems


def one_problem(data: dict[str, Any], *fragments: str) -> str:
    problems = problems_of(data)
    matching = [p for p in problems if all(f in p for f in fragments)]
    assert len(matching) == 1, problems
    assert len(problems) == 1, problems  # and nothing else, e.g. no "unknown key"
    return matching[0]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


# --- the tutorials ----------------------------------------------------------------------


def test_mnist_trainer_tutorial_config() -> None:
    config = parse(MNIST_TRAINER)

    assert config.command == ("python3", "train.py")
    assert config.records_per_epoch == 60000
    assert config.checkpoint_policy == "all"
    assert config.perform_initial_validation is True
    assert config.min_validation_period is not None
    assert config.min_validation_period.to_dict() == {"batches": 100}  # 6400 / 64
    assert config.searcher.max_length.to_dict() == {"epochs": 1}
    assert searcher_in_batches(config).max_length.to_dict() == {"batches": 938}  # ceil(937.5)
    assert config.hyperparameters["n_filters1"] == Const(32)
    assert config.warnings == ()
    assert (config.workspace, config.project) == ("Uncategorized", "Uncategorized")


def test_adaptive_asha_with_time_metric() -> None:
    config = parse(ADAPTIVE_TIME)

    assert config.searcher.time_metric == "batches"
    assert config.searcher.max_length.to_dict() == {"batches": 100}
    spec = search_spec(config.searcher, config.hyperparameters)
    assert spec.brackets[0].lengths[-1] == 100


@pytest.mark.parametrize("stage", sorted(CORE_API))
def test_core_api_tutorial_configs(stage: str) -> None:
    config = parse(CORE_API[stage])

    assert config.is_script
    assert config.command is not None
    assert config.command[-1].endswith(".py")
    assert config.warnings == ()
    search_spec(config.searcher, config.hyperparameters)


def test_core_api_distributed_launcher_command() -> None:
    config = parse(CORE_API["4_distributed"])

    assert config.command == (
        "python3",
        "-m",
        "determined.launch.torch_distributed",
        "python3",
        "4_distributed.py",
    )
    assert config.resources.slots_per_trial == 8
    assert config.searcher.max_length.to_dict() == {"batches": 100}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (MNIST_TRAINER, "single; max_length 938 batches"),
        (ADAPTIVE_TIME, "adaptive_asha; max_length 100 batches"),
        *((CORE_API[s], "max_length") for s in sorted(CORE_API)),
    ],
)
def test_preview_search_on_determined_configs(tmp_path: Path, text: str, expected: str) -> None:
    result = CliRunner().invoke(cli, ["preview-search", str(write(tmp_path, text))])

    assert result.exit_code == 0, result.output
    assert expected in result.stdout
    if text is MNIST_TRAINER:
        assert "workspace" not in result.stderr
        assert "is 938 batches on a cluster" in result.stderr


def test_preview_of_epochs_without_records_per_epoch_says_why(tmp_path: Path) -> None:
    text = MNIST_TRAINER.replace("records_per_epoch: 60000\n", "")

    result = CliRunner().invoke(cli, ["preview-search", str(write(tmp_path, text))])

    assert result.exit_code == 0, result.output
    assert "max_length 1 epochs" in result.stdout
    assert "records_per_epoch" in result.stderr


# --- lengths ------------------------------------------------------------------------------


def test_lengths_in_records_become_global_batches() -> None:
    config = parse_config(
        base(
            searcher={"name": "single", "metric": "loss", "max_length": {"records": 1000}},
            min_validation_period={"records": 64},
            min_checkpoint_period={"epochs": 2},
        )
    )

    assert config.searcher.max_length.to_dict() == {"batches": 16}  # ceil(1000 / 64)
    assert config.min_validation_period is not None
    assert config.min_validation_period.to_dict() == {"batches": 1}
    assert config.min_checkpoint_period is not None
    assert config.min_checkpoint_period.to_dict() == {"epochs": 2}


def test_records_without_a_global_batch_size_are_refused() -> None:
    data = base(
        entrypoint="python3 train.py",
        hyperparameters={},
        searcher={"name": "single", "metric": "loss", "max_length": {"records": 1000}},
    )

    one_problem(data, "searcher.max_length: ", "hyperparameters.global_batch_size")


def test_a_bare_length_is_for_scripts_only() -> None:
    data = base(searcher={"name": "single", "metric": "loss", "max_length": 10})

    one_problem(data, "searcher.max_length: expected {batches: int} or {epochs: int}")


@pytest.mark.parametrize("value", [0, -1, "many", 2.5, True])
def test_records_per_epoch_must_be_a_positive_integer(value: Any) -> None:
    one_problem(base(records_per_epoch=value), "records_per_epoch: ")


def test_epochs_on_a_cluster_need_records_per_epoch() -> None:
    config = parse_config(
        base(searcher={"name": "single", "metric": "loss", "max_length": {"epochs": 2}})
    )

    with pytest.raises(InvalidConfigError, match="records_per_epoch"):
        searcher_in_batches(config)
    with_records = parse_config({**config.raw, "records_per_epoch": 100})
    assert searcher_in_batches(with_records).max_length.to_dict() == {"batches": 4}  # 200/64


# --- parsed only (the training loop honours them) ---------------------------------------


@pytest.mark.parametrize("policy", ["best", "all", "none"])
def test_checkpoint_policy(policy: str) -> None:
    assert parse_config(base(checkpoint_policy=policy)).checkpoint_policy == policy


def test_checkpoint_policy_and_initial_validation_defaults_and_errors() -> None:
    config = parse_config(base())
    assert (config.checkpoint_policy, config.perform_initial_validation) == ("best", False)
    one_problem(base(checkpoint_policy="latest"), "checkpoint_policy: ", "best | all | none")
    one_problem(base(perform_initial_validation="yes"), "perform_initial_validation: ")


# --- the searcher -------------------------------------------------------------------------

ASYNC = {
    "name": "async_halving",
    "metric": "loss",
    "max_length": {"batches": 1000},
    "num_rungs": 3,
    "divisor": 4,
    "max_trials": 16,
    "max_concurrent_trials": 4,
}


def test_async_halving_is_asha() -> None:
    config = parse_config(base(searcher=ASYNC))

    assert config.searcher.name == "asha"
    assert search_spec(config.searcher, config.hyperparameters).brackets[0].lengths == (
        62,
        250,
        1000,
    )


def test_async_halving_takes_only_asha_keys() -> None:
    one_problem(
        base(searcher={**ASYNC, "mode": "standard"}),
        "searcher.mode: is not a setting of the async_halving searcher",
    )


def test_stop_once() -> None:
    assert parse_config(base(searcher={**ASYNC, "stop_once": False})).warnings == ()
    (warning,) = parse_config(base(searcher={**ASYNC, "stop_once": True})).warnings
    assert warning.startswith("searcher.stop_once: ")
    assert "promote and resume" in warning
    one_problem(base(searcher={**ASYNC, "stop_once": "yes"}), "searcher.stop_once: expected")
    random = {"name": "random", "metric": "loss", "max_length": {"batches": 10}, "max_trials": 2}
    one_problem(
        base(searcher={**random, "stop_once": True}),
        "searcher.stop_once: is not a setting of the random searcher",
    )


def test_empty_bracket_rungs_is_the_default() -> None:
    adaptive = {
        "name": "adaptive_asha",
        "metric": "loss",
        "max_length": {"batches": 1000},
        "max_trials": 16,
    }
    plain = parse_config(base(searcher=adaptive))
    empty = parse_config(base(searcher={**adaptive, "bracket_rungs": []}))

    assert search_spec(empty.searcher, empty.hyperparameters) == search_spec(
        plain.searcher, plain.hyperparameters
    )


def test_float_divisor() -> None:
    config = parse_config(base(searcher={**ASYNC, "divisor": 2.5, "max_length": {"batches": 100}}))

    assert search_spec(config.searcher, config.hyperparameters).brackets[0].lengths == (
        16,
        40,
        100,
    )


@pytest.mark.parametrize("key", ["source_trial_id", "source_checkpoint_uuid"])
def test_searching_from_a_checkpoint_is_refused(key: str) -> None:
    one_problem(base(searcher={**ASYNC, key: 12}), f"searcher.{key}: ", "not in this release")


def test_unknown_searcher_key_lists_the_searchers_own_keys() -> None:
    message = one_problem(base(searcher={**ASYNC, "divisr": 3}), "searcher.divisr: unknown key")

    assert "did you mean 'divisor'" in message
    for key in ("num_rungs", "max_rungs", "sampler", "stop_once", "time_metric", "max_trials"):
        assert key in message
    assert "mode" not in message.split("allowed:")[1]


# --- optimizations ------------------------------------------------------------------------


def test_apex_o0_is_off() -> None:
    config = parse_config(base(optimizations={"mixed_precision": "O0"}))
    assert config.optimizations.mixed_precision == "off"


@pytest.mark.parametrize("level", ["O1", "O2", "O3"])
def test_apex_levels_point_to_autocast(level: str) -> None:
    one_problem(
        base(optimizations={"mixed_precision": level}),
        "optimizations.mixed_precision: ",
        "fp16",
        "bf16",
    )


# --- environment variables ----------------------------------------------------------------


def test_environment_variables_as_a_list() -> None:
    config = parse_config(
        base(environment={"environment_variables": ["NCCL_DEBUG=INFO", "EMPTY=", "A=b=c"]})
    )

    assert config.environment_variables == {"NCCL_DEBUG": "INFO", "EMPTY": "", "A": "b=c"}
    assert config.environment_for("cpu") == config.environment_for("cuda")


def test_environment_variables_as_a_mapping() -> None:
    config = parse_config(base(environment={"environment_variables": {"N": 4, "X": "y"}}))

    assert config.environment_variables == {"N": "4", "X": "y"}


def test_environment_variables_per_device() -> None:
    config = parse_config(
        base(
            environment={
                "environment_variables": {
                    "cpu": ["OMP_NUM_THREADS=2"],
                    "cuda": {"NCCL_DEBUG": "WARN"},
                    "rocm": [],
                }
            }
        )
    )

    assert config.environment_for("cpu") == {"OMP_NUM_THREADS": "2"}
    assert config.environment_for("cuda") == {"NCCL_DEBUG": "WARN"}
    assert config.warnings == ()


def test_rocm_variables_are_never_set_and_say_so() -> None:
    config = parse_config(base(environment={"environment_variables": {"rocm": ["A=1"]}}))

    (warning,) = config.warnings
    assert warning.startswith("environment.environment_variables.rocm: ")


@pytest.mark.parametrize(
    ("value", "fragments"),
    [
        (["NOEQUALS"], ("environment.environment_variables[0]: ", "NAME=value")),
        (["RANK=3"], ("environment_variables[0]: ", "RANK is set by Assay")),
        ({"WORLD_SIZE": "2"}, ("environment_variables.WORLD_SIZE: ", "set by Assay")),
        (["ASSAY_TOKEN=x"], ("environment_variables[0]: ", "ASSAY_TOKEN is set by Assay")),
        (["CUDA_VISIBLE_DEVICES=0"], ("environment_variables[0]: ", "CUDA_VISIBLE_DEVICES")),
        (["GROUP_RANK=0"], ("environment_variables[0]: ", "GROUP_RANK is set by Assay")),
        (["TORCHELASTIC_RUN_ID=x"], ("environment_variables[0]: ", "TORCHELASTIC_RUN_ID")),
        ({"cuda": ["MASTER_PORT=1"]}, ("environment_variables.cuda[0]: ", "MASTER_PORT")),
        (["1X=2"], ("environment_variables[0]: ", "not a variable name")),
        (["A=1", "A=2"], ("environment_variables[1]: ", "A is set twice")),
        ({"FLAG": True}, ("environment_variables.FLAG: ", "quote it")),
        ("A=1", ("environment.environment_variables: ", "expected a list")),
    ],
)
def test_bad_environment_variables(value: Any, fragments: tuple[str, ...]) -> None:
    one_problem(base(environment={"environment_variables": value}), *fragments)


def _allocation(tmp_path: Path, config: dict[str, Any]) -> Allocation:
    """A two-slot allocation on a CPU agent, as the agent builds it from StartAllocation."""
    start = agent_pb2.StartAllocation(
        allocation_id="a1",
        config_json=json.dumps(config),
        slots=[0, 1],
        ranks=[0, 1],
        world_size=2,
        master_port=29500,
    )
    return Allocation(
        start,
        lambda message: None,
        lambda allocation_id: None,
        work_dir=tmp_path,
        harness_command=["true"],
        slot_kind="cpu",
        address="127.0.0.1",
        tls=ClientTls(),
        grace=30.0,
    )


def test_agent_sets_the_variables_in_every_rank(tmp_path: Path) -> None:
    config = base(
        environment={"environment_variables": {"cpu": ["SEEN=cpu"], "cuda": ["SEEN=cuda"]}}
    )
    allocation = _allocation(tmp_path, config)

    envs = [allocation._env(k, k, k, 29500, tmp_path / "trial.json") for k in (0, 1)]

    assert [(e["SEEN"], e["RANK"], e["WORLD_SIZE"]) for e in envs] == [
        ("cpu", "0", "2"),
        ("cpu", "1", "2"),
    ]


def test_agent_passes_nccl_and_gloo_variables_and_torchruns_to_every_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "eth1")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth2")
    monkeypatch.setenv("ASSAY_JOIN_TOKEN", "the-agents-own")
    allocation = _allocation(tmp_path, base())

    envs = [allocation._env(k, k, k, 29501, tmp_path / "trial.json") for k in (0, 1)]

    for rank, env in enumerate(envs):
        assert (env["NCCL_SOCKET_IFNAME"], env["GLOO_SOCKET_IFNAME"]) == ("eth1", "eth2")
        assert "ASSAY_JOIN_TOKEN" not in env
        torchrun = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT")
        assert [env[k] for k in torchrun] == [str(rank), "2", str(rank), "2", "29501"]
        assert env["MASTER_ADDR"] == "127.0.0.1"


# --- keys Assay does not have -------------------------------------------------------------


@pytest.mark.parametrize(
    "key", ["image", "pod_spec", "force_pull_image", "registry_auth", "add_capabilities"]
)
def test_container_keys_are_refused(key: str) -> None:
    value: Any = {"image": "determinedai/pytorch-ngc:0.38.0", "pod_spec": {"spec": {}}}.get(
        key, True if key == "force_pull_image" else ["NET_ADMIN"]
    )
    if key == "registry_auth":
        value = {"username": "u", "password": "p"}
    one_problem(base(environment={key: value}), f"environment.{key}: ", "not in containers")


def test_container_keys_that_are_off_warn() -> None:
    config = parse_config(
        base(environment={"force_pull_image": False, "drop_capabilities": [], "image": None})
    )

    assert [w.split(":")[0] for w in config.warnings] == [
        "environment.image",
        "environment.force_pull_image",
        "environment.drop_capabilities",
    ]


def test_bind_mounts() -> None:
    same = {"host_path": "/data", "container_path": "/data", "read_only": True}
    (warning,) = parse_config(base(bind_mounts=[same])).warnings
    assert warning.startswith("bind_mounts[0]: not needed")
    moved = {"host_path": "/data", "container_path": "/mnt/data"}
    one_problem(base(bind_mounts=[same, moved]), "bind_mounts[1]: ", "'/data'", "/mnt/data")
    one_problem(base(bind_mounts=["/data"]), "bind_mounts[0]: expected a mapping")
    one_problem(base(bind_mounts={"host_path": "/data"}), "bind_mounts: expected a list")


def test_profiling() -> None:
    (warning,) = parse_config(base(profiling={"enabled": False})).warnings
    assert warning.startswith("profiling: has no effect")
    one_problem(base(profiling={"enabled": True, "begin_on_batch": 0}), "profiling: ", "profiler")


def test_debug_warns_and_workspace_and_project_are_kept() -> None:
    config = parse_config(base(debug=True, workspace="w", project="p"))

    assert [w.split(":")[0] for w in config.warnings] == ["debug"]
    assert (config.workspace, config.project) == ("w", "p")


def test_workspace_and_project_must_be_strings() -> None:
    one_problem(base(workspace=3), "workspace: expected a string", "int")


def test_tensorboard_storage_is_refused() -> None:
    problem = one_problem(
        base(tensorboard_storage={"type": "shared_fs", "host_path": "/tmp"}),
        "tensorboard_storage: ",
        "assay trial metrics",
    )

    assert "get_tensorboard_path()" in problem
    assert "tensorboard/trial-<id>" in problem


@pytest.mark.parametrize(
    "storage",
    [
        {"type": "gcs", "bucket": "b", "prefix": "p"},
        {"type": "azure", "container": "c", "connection_string": "x"},
        {"type": "directory", "container_path": "/ckpt"},
    ],
)
def test_other_checkpoint_storage_types_are_refused(storage: dict[str, Any]) -> None:
    one_problem(base(checkpoint_storage=storage), "checkpoint_storage.type: ", "shared_fs", "s3")


def test_pool_keys_are_read() -> None:
    resources = {"slots_per_trial": 1, "resource_pool": "gpu", "agent_label": "a100"}
    config = parse_config(base(resources=resources))

    assert (config.resources.resource_pool, config.resources.agent_label) == ("gpu", "a100")
    assert parse_config(base()).resources.resource_pool is None  # the master's default


@pytest.mark.parametrize("key", ["resource_pool", "agent_label"])
@pytest.mark.parametrize("value", ["", " gpu", 3])
def test_bad_pool_names_are_refused(key: str, value: Any) -> None:
    one_problem(base(resources={"slots_per_trial": 1, key: value}), f"resources.{key}: ")


def with_key(section: str | None, key: str, value: Any) -> tuple[dict[str, Any], str]:
    """`base()` with `key: value` in `section` (None: top level), and the key's path."""
    data = base()
    if section is None:
        data[key] = value
    elif section == "checkpoint_storage":
        data[section] = {"type": "shared_fs", "host_path": "/tmp", key: value}
    else:
        data[section] = {key: value}
    return data, key if section is None else f"{section}.{key}"


# Determined 0.38 keys whose value Assay cannot honour: (section, key, value, what the
# message says to do instead).
REFUSED = [
    ("optimizations", "average_aggregated_gradients", False, "multiply your loss"),
    ("environment", "proxy_ports", [{"proxy_port": 8888}], "directly"),
    ("resources", "is_single_node", True, "spreads it over agents"),
    ("resources", "native_parallel", True, "one process per slot"),
    ("checkpoint_storage", "checkpoint_path", "/ckpt", "write storage_path"),
    ("checkpoint_storage", "tensorboard_path", "/tb", "tensorboard/trial-<id>"),
    (None, "retention_policy", {"log_retention_days": 10}, "save_trial_best"),
    (None, "preemption_timeout", 3600, "kill_grace_s"),
    (None, "integrations", {"pachyderm": {"dataset": {}}}, "under data"),
    (None, "slurm", {"slots_per_node": 8}, "assay-agent"),
    (None, "pbs", {"pbsbatch_args": ["-l walltime=1:00:00"]}, "assay-agent"),
]


@pytest.mark.parametrize(("section", "key", "value", "instead"), REFUSED)
def test_determined_keys_assay_cannot_honour_are_refused_with_what_to_do(
    section: str | None, key: str, value: Any, instead: str
) -> None:
    data, path = with_key(section, key, value)

    problem = one_problem(data, f"{path}: ", instead)

    assert "unknown key" not in problem
    assert "remove it" in problem or "write" in problem or "multiply" in problem


# Determined 0.38 keys that change nothing here: (section, key, value, what the warning
# says).
WARNED = [
    ("optimizations", "average_training_metrics", False, "averaged over every slot"),
    ("optimizations", "gradient_compression", True, "uncompressed"),
    ("optimizations", "tensor_fusion_threshold", 64, "bucket_cap_mb"),
    ("optimizations", "tensor_fusion_cycle_time", 5, "as soon as it is ready"),
    ("optimizations", "auto_tune_tensor_fusion", True, "bucket_cap_mb"),
    ("optimizations", "grad_updates_size_file", "/tmp/sizes", "no file"),
    ("environment", "ports", {"web": 8080}, "the agent's own ports"),
    ("environment", "proxy_ports", [], "proxies no ports"),
    ("checkpoint_storage", "propagation", "rprivate", "nothing is mounted"),
    ("checkpoint_storage", "container_path", "/ckpt", "host_path/storage_path"),
    (None, "log_policies", [], "the list is empty"),
    (None, "retention_policy", {"log_retention_days": -1}, "as long as its experiment"),
    (None, "integrations", {}, "no integrations"),
    (None, "slurm", {}, "does not launch through slurm"),
    (None, "security", {"kerberos": {"config_file": "/etc/krb5.conf"}}, "Kerberos"),
]


@pytest.mark.parametrize(("section", "key", "value", "says"), WARNED)
def test_determined_keys_that_change_nothing_warn(
    section: str | None, key: str, value: Any, says: str
) -> None:
    data, path = with_key(section, key, value)

    (warning,) = parse_config(data).warnings

    assert warning.startswith(f"{path}: ")
    assert says in warning


# What Assay does anyway: accepted as it is, with no warning.
ACCEPTED: list[tuple[str | None, str, Any]] = [
    ("optimizations", "average_training_metrics", True),
    ("optimizations", "average_aggregated_gradients", True),
    ("optimizations", "gradient_compression", False),
    ("optimizations", "auto_tune_tensor_fusion", False),
    ("optimizations", "grad_updates_size_file", None),
    ("environment", "ports", {}),
    ("resources", "is_single_node", False),
    ("resources", "native_parallel", False),
    (None, "preemption_timeout", None),
]


@pytest.mark.parametrize(("section", "key", "value"), ACCEPTED)
def test_determined_keys_set_as_assay_works_are_accepted_quietly(
    section: str | None, key: str, value: Any
) -> None:
    data, _ = with_key(section, key, value)

    assert parse_config(data).warnings == ()


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ("resources", "is_single_node"),
        ("resources", "native_parallel"),
        ("optimizations", "average_training_metrics"),
        ("optimizations", "average_aggregated_gradients"),
    ],
)
def test_determined_flags_must_be_true_or_false(section: str, key: str) -> None:
    data, path = with_key(section, key, "yes")

    one_problem(data, f"{path}: expected true or false")


def test_environment_ports_must_be_a_mapping() -> None:
    one_problem(base(environment={"ports": [8080]}), "environment.ports: expected a mapping")


def test_a_config_exported_from_determined_with_every_default_parses() -> None:
    """`det experiment describe --json` writes every key with its default."""
    config = parse_config(
        base(
            optimizations={
                "aggregation_frequency": 1,
                "auto_tune_tensor_fusion": False,
                "average_aggregated_gradients": True,
                "average_training_metrics": True,
                "grad_updates_size_file": None,
                "gradient_compression": False,
                "mixed_precision": "O0",
                "tensor_fusion_cycle_time": 5,
                "tensor_fusion_threshold": 64,
            },
            environment={"ports": {}, "proxy_ports": None, "force_pull_image": False},
            resources={"slots_per_trial": 1, "is_single_node": None, "native_parallel": False},
            checkpoint_storage={
                "type": "shared_fs",
                "host_path": "/tmp",
                "storage_path": "ckpt",
                "propagation": "rprivate",
                "container_path": None,
            },
            log_policies=[],
            retention_policy={"log_retention_days": None},
            preemption_timeout=None,
            integrations=None,
        )
    )

    assert [w.split(":")[0] for w in config.warnings] == [
        "optimizations.tensor_fusion_threshold",
        "optimizations.tensor_fusion_cycle_time",
        "checkpoint_storage.propagation",
        "environment.force_pull_image",
        "environment.proxy_ports",
        "log_policies",
        "retention_policy",
        "integrations",
    ]


@pytest.mark.parametrize("command", [["experiment", "create"], ["trial", "run-local"]])
def test_warnings_reach_create_and_run_local(tmp_path: Path, command: list[str]) -> None:
    data, _ = with_key("optimizations", "tensor_fusion_threshold", 32)
    config = write(tmp_path, yaml.safe_dump(data))

    result = CliRunner().invoke(cli, [*command, str(config), str(tmp_path / "missing")])

    assert (
        "warning: optimizations.tensor_fusion_threshold: has no effect: a Horovod setting"
        in result.stderr
    )
    assert result.exit_code != 0  # the model directory does not exist


def test_const_hyperparameters_hold_nested_values() -> None:
    config = parse_config(
        base(
            hyperparameters={
                "global_batch_size": 64,
                "optimizer": {"type": "const", "val": {"name": "adam", "betas": [0.9, 0.99]}},
                "model": {"width": 64, "depth": {"type": "int", "minval": 1, "maxval": 3}},
            },
            description="ported",
            labels=["a"],
            data={"url": "x"},
            max_restarts=2,
            scheduling_unit=10,
        )
    )

    assert config.hyperparameters["optimizer"] == Const({"name": "adam", "betas": [0.9, 0.99]})
    model = config.hyperparameters["model"]
    assert isinstance(model, dict)
    assert model["width"] == Const(64)


# --- run-local sets the variables ---------------------------------------------------------

ENV_TRIAL = """
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import assay


class EnvTrial(assay.Trial):
    def __init__(self, context):
        self.context = context
        self.model = context.wrap_model(nn.Linear(1, 1))
        self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.0))
        self.flag = float(os.environ["PORTED_FLAG"])

    def build_training_data_loader(self):
        return DataLoader(TensorDataset(torch.zeros(8, 1)), batch_size=2)

    def build_validation_data_loader(self):
        return DataLoader(TensorDataset(torch.zeros(2, 1)), batch_size=1)

    def train_batch(self, batch, epoch_idx, batch_idx):
        loss = self.model(batch[0]).sum()
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        return loss

    def evaluate_batch(self, batch):
        return {"flag": self.flag}
"""


@pytest.mark.parametrize("slots", [1, 2])
def test_run_local_sets_the_variables(tmp_path: Path, slots: int) -> None:
    import assay

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "env_def.py").write_text(ENV_TRIAL)
    config = base(
        entrypoint="env_def:EnvTrial",
        hyperparameters={"global_batch_size": 2 * slots},
        searcher={"name": "single", "metric": "flag", "max_length": {"batches": 1}},
        resources={"slots_per_trial": slots},
        environment={"environment_variables": ["PORTED_FLAG=7"]},
    )

    result = assay.run_local(
        config=config, model_dir=tmp_path / "model", checkpoint_dir=tmp_path / "ckpt"
    )

    assert result.validation_metrics["flag"] == 7.0
    assert "PORTED_FLAG" not in os.environ  # the in-process slot's change is undone
