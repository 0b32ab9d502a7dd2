"""Determined 0.38's config keys that Assay has no counterpart for, and Determined's forms
of keys it does have (`environment.environment_variables`).

A key of Determined 0.38's experiment config is never met with "unknown key" and never
half-read: a value that is what Assay does anyway is accepted as it is, one that changes
nothing here is accepted with a warning that says so, and one whose meaning Assay cannot
honour is refused with what Assay does instead. Warnings and problems both carry the key
path (`environment.image: ...`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from assay.config._reader import Section, type_name
from assay.errors import InvalidConfigError

# What the agent and the local launcher set for every rank; a config may not change them.
RESERVED_VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    # the rest of what torchrun sets, and so the launcher too
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_NAME",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
)
RESERVED_PREFIXES = ("ASSAY_", "TORCHELASTIC_")
DEVICES = ("cpu", "cuda", "rocm")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

_NO_CONTAINERS = (
    "Assay runs trials as processes in the agents' own Python environment, not in containers"
)
_CONTAINER_KEYS = {
    "image": "install what the image held on the agents (e.g. into the agents' virtualenv) "
    "and remove it",
    "force_pull_image": "remove it",
    "registry_auth": "remove it",
    "pod_spec": "remove it (agents are placed by `assay-agent`, not Kubernetes pods)",
    "add_capabilities": "remove it",
    "drop_capabilities": "remove it",
}
_NO_HOROVOD = (
    "a Horovod setting: under Assay gradients are all-reduced by torch "
    "DistributedDataParallel (the Trial API's, or a script's own)"
)
# Horovod's tuning keys under `optimizations`: none changes what is computed.
_HOROVOD_KEYS = {
    "tensor_fusion_threshold": "DDP buckets gradients itself (bucket_cap_mb)",
    "tensor_fusion_cycle_time": "DDP starts each bucket's all-reduce as soon as it is ready",
    "auto_tune_tensor_fusion": "DDP buckets gradients itself (bucket_cap_mb)",
    "grad_updates_size_file": "no file of gradient update sizes is written",
    "gradient_compression": "gradients are all-reduced uncompressed, in their own precision",
}
_NO_CONTAINERS_AT_ALL = "trials run on the agents without containers"


@dataclass(frozen=True)
class Environment:
    """`environment.environment_variables`: for every device, and per device kind."""

    variables: Mapping[str, str] = field(default_factory=dict)
    by_device: Mapping[str, Mapping[str, str]] = field(default_factory=dict)


def parse_environment(s: Section, warnings: list[str]) -> Environment:
    """Read `environment`: its variables, and Determined's container keys refused."""
    for key, fix in _CONTAINER_KEYS.items():
        if key not in s.data:
            continue
        value = s.raw(key)
        if value in (None, False, "", [], {}):
            warnings.append(f"{s.key_path(key)}: has no effect: {_NO_CONTAINERS}")
        else:
            s.error(key, f"{_NO_CONTAINERS}: {fix}")
    _check_ports(s, warnings)
    env = environment_variables(s.raw("environment_variables"), s, warnings)
    s.finish()
    return env


def _check_ports(s: Section, warnings: list[str]) -> None:
    if "ports" in s.data:
        ports = s.raw("ports")
        if ports not in (None, {}) and not isinstance(ports, Mapping):
            s.error("ports", f"expected a mapping of names to port numbers, got {type_name(ports)}")
        elif ports:
            warnings.append(
                f"{s.key_path('ports')}: not needed: {_NO_CONTAINERS_AT_ALL} and listen on "
                "the agent's own ports, so nothing is exposed or mapped"
            )
    if "proxy_ports" in s.data:
        proxied = s.raw("proxy_ports")
        if proxied in (None, []):
            warnings.append(
                f"{s.key_path('proxy_ports')}: has no effect: the master proxies no ports to trials"
            )
        else:
            s.error(
                "proxy_ports",
                "the master does not proxy to a trial's ports: reach a service a trial "
                "starts at its agent's address and port directly; remove it",
            )


def environment_variables(value: Any, s: Section, warnings: list[str]) -> Environment:
    """Determined's forms: a list of `NAME=value`, a mapping of names to values, or either
    of those per device kind (`{cpu: [...], cuda: [...]}`)."""
    key = "environment_variables"
    if value is None:
        return Environment()
    if isinstance(value, Mapping) and value and all(k in DEVICES for k in value):
        by_device: dict[str, Mapping[str, str]] = {}
        for device, entries in value.items():
            path = f"{key}.{device}"
            if device == "rocm" and entries:
                warnings.append(
                    f"{s.key_path(path)}: Assay has no ROCm slots; these variables are never set"
                )
            by_device[device] = _variables(entries, s, path)
        return Environment(by_device=by_device)
    return Environment(variables=_variables(value, s, key))


def environment_of(raw: Any, device: str) -> dict[str, str]:
    """The variables a rank on a `device` slot ("cpu" or "cuda") gets from a stored config
    (its `environment.environment_variables` alone is read); `InvalidConfigError` if bad."""
    problems: list[str] = []
    section = raw.get("environment") if isinstance(raw, Mapping) else None
    s = Section(section if isinstance(section, Mapping) else {}, "environment", problems)
    env = environment_variables(s.raw("environment_variables"), s, [])
    if problems:
        raise InvalidConfigError(problems)
    return {**env.variables, **env.by_device.get(device, {})}


def _variables(value: Any, s: Section, path: str) -> dict[str, str]:
    out: dict[str, str] = {}
    if value is None:
        return out
    if isinstance(value, list):
        for i, entry in enumerate(value):
            where = f"{path}[{i}]"
            if not isinstance(entry, str) or "=" not in entry:
                s.error(where, f"expected 'NAME=value', got {entry!r}")
                continue
            name, _, text = entry.partition("=")
            if _check_name(name, s, where):
                if name in out:
                    s.error(where, f"{name} is set twice")
                out[name] = text
        return out
    if isinstance(value, Mapping):
        for name, text in value.items():
            where = f"{path}.{name}"
            if not isinstance(name, str) or not _check_name(name, s, where):
                continue
            if isinstance(text, bool) or not isinstance(text, str | int | float):
                s.error(where, f"expected a string value, got {type_name(text)} (quote it)")
                continue
            out[name] = str(text)
        return out
    s.error(
        path,
        "expected a list of 'NAME=value' strings, a mapping of names to values, or either "
        f"per device ({{cpu: [...], cuda: [...]}}), got {type_name(value)}",
    )
    return out


def _check_name(name: str, s: Section, where: str) -> bool:
    if not _NAME.match(name):
        s.error(where, f"{name!r} is not a variable name (letters, digits and _)")
        return False
    if name in RESERVED_VARIABLES or name.startswith(RESERVED_PREFIXES):
        s.error(
            where,
            f"{name} is set by Assay for every rank (the torch.distributed variables such "
            "as RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT, "
            "CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER, ASSAY_* and TORCHELASTIC_*); a config "
            "cannot change it",
        )
        return False
    return True


def check_top_level(top: Section, warnings: list[str]) -> None:
    """Determined's top-level keys that Assay does not have."""
    if "debug" in top.data:
        top.raw("debug")
        warnings.append(
            "debug: has no effect: Assay has no debug mode (set your own log levels, e.g. "
            "through environment.environment_variables)"
        )
    if "tensorboard_storage" in top.data:
        top.raw("tensorboard_storage")
        top.error(
            "tensorboard_storage",
            "Assay has no separate TensorBoard storage: the metrics trials report are kept "
            "by the master (web UI, `assay trial metrics`), and the event files written to "
            "get_tensorboard_path() (Trial and Core API) are kept in the checkpoint storage "
            "under tensorboard/trial-<id> (`assay trial download-tensorboard`); remove it",
        )
    _check_profiling(top, warnings)
    _check_bind_mounts(top, warnings)
    _check_policies(top, warnings)
    _check_launchers(top, warnings)


def _empty(value: Any) -> bool:
    return value in (None, False, "", [], {})


def _check_policies(top: Section, warnings: list[str]) -> None:
    """retention_policy, preemption_timeout, integrations (`log_policies` are read by
    `_log_policies`)."""
    if "retention_policy" in top.data:
        policy = top.raw("retention_policy")
        days = policy.get("log_retention_days") if isinstance(policy, Mapping) else policy
        if days in (None, -1) or _empty(policy):
            warnings.append(
                "retention_policy: has no effect: Assay keeps a trial's logs as long as "
                "its experiment"
            )
        else:
            top.error(
                "retention_policy",
                "Assay keeps a trial's logs as long as its experiment and deletes none "
                "after a number of days; remove it (checkpoints are kept by "
                "checkpoint_storage's save_trial_best, save_trial_latest and "
                "save_experiment_best)",
            )
    if "preemption_timeout" in top.data and top.raw("preemption_timeout") is not None:
        top.error(
            "preemption_timeout",
            "a trial's time to stop after should_preempt() turns True is the master's "
            "kill_grace_s (30 s unless the operator sets it in master.yaml), the same for "
            "every experiment; remove it (a trial that checkpoints and exits when asked is "
            "never killed)",
        )
    if "integrations" in top.data:
        if _empty(top.raw("integrations")):
            warnings.append("integrations: has no effect: Assay has no integrations")
        else:
            top.error(
                "integrations",
                "Assay has no Pachyderm or webhook integrations: put what your Trial reads "
                "(e.g. a dataset's repo and commit) under data, and follow an experiment "
                "with `assay experiment wait`; remove it",
            )


def _check_launchers(top: Section, warnings: list[str]) -> None:
    """Determined's Slurm, PBS and Kerberos settings."""
    for key in ("slurm", "pbs"):
        if key not in top.data:
            continue
        if _empty(top.raw(key)):
            warnings.append(f"{key}: has no effect: Assay does not launch through {key}")
        else:
            top.error(
                key,
                f"Assay does not launch trials through {key}: it runs them on its own agents "
                "(start `assay-agent` on the nodes, e.g. as a batch job); remove it",
            )
    if "security" in top.data:
        top.raw("security")
        warnings.append("security: has no effect: Assay reads no Kerberos settings")


def _check_profiling(top: Section, warnings: list[str]) -> None:
    if "profiling" not in top.data:
        return
    value = top.raw("profiling")
    enabled = value.get("enabled", False) if isinstance(value, Mapping) else value
    if enabled is True:
        top.error(
            "profiling",
            "Assay has no profiler in this release: run torch.profiler in your Trial and "
            "write its trace to a path of your own; remove profiling or set enabled: false",
        )
    else:
        warnings.append("profiling: has no effect: Assay has no profiler in this release")


def _check_bind_mounts(top: Section, warnings: list[str]) -> None:
    if "bind_mounts" not in top.data:
        return
    mounts = top.raw("bind_mounts")
    if mounts is None:
        return
    if not isinstance(mounts, list):
        top.error("bind_mounts", f"expected a list of mounts, got {type_name(mounts)}")
        return
    for i, mount in enumerate(mounts):
        where = f"bind_mounts[{i}]"
        host = mount.get("host_path") if isinstance(mount, Mapping) else None
        if not isinstance(host, str) or not host:
            top.error(where, f"expected a mapping with host_path and container_path, got {mount!r}")
            continue
        container = mount.get("container_path", host)
        if container == host:
            warnings.append(
                f"{where}: not needed: trials run on the agents without containers and read "
                f"{host} where it is"
            )
        else:
            top.error(
                where,
                f"trials run on the agents without containers, so nothing is mounted at "
                f"{container!r}: read {host!r} directly (or set container_path to the same "
                "path)",
            )


def check_resources(s: Section) -> None:
    """Determined's `resources` keys that Assay refuses (the schema reads the others)."""
    for key in ("shm_size", "devices"):
        if key in s.data:
            s.raw(key)
            s.error(key, f"{_NO_CONTAINERS}: remove it")
    if _flag(s, "is_single_node"):
        s.error(
            "is_single_node",
            "Assay cannot hold a trial to one agent: it puts a trial on one agent when one "
            "has slots_per_trial free slots, and spreads it over agents with equal slots "
            "on each otherwise; remove it, or set it to false",
        )
    if _flag(s, "native_parallel"):
        s.error(
            "native_parallel",
            "Assay starts one process per slot; to start your own processes, use a command "
            "entrypoint with slots_per_trial: 1; remove it, or set it to false",
        )


def _flag(s: Section, key: str) -> bool:
    """Whether a true/false key is true; a value of another type is reported."""
    if key not in s.data:
        return False
    value = s.raw(key)
    if value is not None and not isinstance(value, bool):
        s.error(key, f"expected true or false, got {type_name(value)} ({value!r})")
        return False
    return value is True


def check_optimizations(s: Section, warnings: list[str]) -> None:
    """Determined's Horovod keys under `optimizations` (what Assay does anyway passes)."""
    key = "average_training_metrics"
    if key in s.data and not _flag(s, key) and s.data[key] is False:
        warnings.append(
            f"{s.key_path('average_training_metrics')}: Assay reports a Trial's "
            "training metrics averaged over every slot, not the chief's alone"
        )
    key = "average_aggregated_gradients"
    if key in s.data and not _flag(s, key) and s.data[key] is False:
        s.error(
            key,
            "Assay averages the gradients of the aggregation_frequency batches of one "
            "optimizer step (context.backward divides the loss by it); to sum them, "
            "multiply your loss by aggregation_frequency and remove the key",
        )
    for key, instead in _HOROVOD_KEYS.items():
        if key not in s.data:
            continue
        value = s.raw(key)
        if value is None or value is False:
            continue  # off, as in Assay
        warnings.append(f"{s.key_path(key)}: has no effect: {_NO_HOROVOD}; {instead}")


def check_searcher(s: Section, warnings: list[str], *, stop_once: bool) -> None:
    """Determined's searcher keys that Assay reads differently or not at all."""
    for key in ("source_trial_id", "source_checkpoint_uuid"):
        if key in s.data:
            s.raw(key)
            s.error(
                key,
                "starting a search from another trial's checkpoint is not in this release: "
                "load the weights in your Trial (e.g. from a path given under `data`)",
            )
    if stop_once and "stop_once" in s.data:
        value = s.raw("stop_once")
        if not isinstance(value, bool):
            s.error("stop_once", f"expected true or false, got {type_name(value)} ({value!r})")
        elif value:
            warnings.append(
                f"{s.key_path('stop_once')}: Assay's ASHA pauses a trial that is not "
                "promoted at once and may promote and resume it later (stop_once: false); "
                "the search runs that way"
            )


def check_storage_keys(s: Section, warnings: list[str]) -> None:
    """Determined's shared_fs keys for containers and its older path keys."""
    if s.raw("propagation") is not None:
        warnings.append(
            f"{s.key_path('propagation')}: has no effect: {_NO_CONTAINERS_AT_ALL}, so "
            "nothing is mounted"
        )
    if s.raw("container_path") is not None:
        warnings.append(
            f"{s.key_path('container_path')}: has no effect: {_NO_CONTAINERS_AT_ALL} and "
            "write checkpoints to host_path/storage_path directly"
        )
    if s.raw("checkpoint_path") is not None:
        s.error(
            "checkpoint_path",
            "is Determined's older name: write storage_path (a directory under host_path, "
            "or a path relative to it)",
        )
    if s.raw("tensorboard_path") is not None:
        s.error(
            "tensorboard_path",
            "TensorBoard event files are kept in the checkpoint storage itself, under "
            "tensorboard/trial-<id> (`assay trial download-tensorboard` fetches them); "
            "remove it",
        )


CHECKPOINT_TYPES = ("shared_fs", "s3")
_OTHER_STORAGE = ("gcs", "azure", "directory")


def check_storage_type(s: Section) -> bool:
    """Refuse Determined's storage types that Assay lacks; False when one was refused."""
    kind = s.data.get("type")
    if kind not in _OTHER_STORAGE:
        return True
    s.raw("type")
    s.error(
        "type",
        f"{kind} storage is not in this release: use shared_fs (host_path: a directory every "
        "agent and the master mount at the same path) or s3 (bucket, with endpoint_url for "
        "any S3-compatible store)",
    )
    return False
