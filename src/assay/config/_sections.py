"""The `resources`, `optimizations` and `checkpoint_storage` sections of the experiment
config: what a trial runs on, how it is distributed, and where its checkpoints go."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from assay.config import _determined
from assay.config._reader import Section
from assay.config._size import parse_memory

Precision = Literal["off", "fp16", "bf16", "auto"]

# The weights an experiment may have (`resources.weight`): wide enough for any sharing
# policy, narrow enough that no sum or ratio of them overflows or vanishes.
MIN_WEIGHT = 1e-3
MAX_WEIGHT = 1e6


@dataclass(frozen=True)
class ResourcesConfig:
    """`resources`: what a trial asks for, and the experiment's place among others.

    `weight` is the experiment's share under the fair_share policy (its slots are in
    proportion to it among experiments that want slots); `max_slots` caps the slots
    its trials hold together, under every policy (None: no cap).
    """

    slots_per_trial: int = 1
    priority: int = 42
    weight: float = 1.0
    max_slots: int | None = None
    # The master's resource pool to run in (None: its default pool), and the agent label
    # its trials are restricted to (None: any agent of the pool).
    resource_pool: str | None = None
    agent_label: str | None = None
    # The memory each slot's share of an allocation may use, in bytes (None: the agent's
    # default); an allocation of N slots on an agent is limited to N times it there.
    memory: int | None = None


StrategyName = Literal["ddp", "fsdp"]
FSDPSharding = Literal["full_shard", "shard_grad_op", "hybrid_shard"]


@dataclass(frozen=True)
class FSDPConfig:
    """`optimizations.fsdp`: how FSDP shards the model (with `strategy: fsdp`).

    `wrap` names module classes sharded as units of their own; `min_num_params` instead
    makes a unit of every submodule holding at least that many parameters not yet in a
    unit. The root module is always a unit. `reshard_after_forward` None: as `sharding`
    says (full_shard and hybrid_shard free parameters after forward, shard_grad_op keeps
    them until backward).
    """

    sharding: FSDPSharding = "full_shard"
    wrap: tuple[str, ...] = ()
    min_num_params: int | None = None
    cpu_offload: bool = False
    reshard_after_forward: bool | None = None


@dataclass(frozen=True)
class OptimizationsConfig:
    aggregation_frequency: int = 1
    mixed_precision: Precision = "off"
    # Module class names whose instances recompute their activations in backward.
    activation_checkpointing: tuple[str, ...] = ()
    # How the model is distributed over several slots (one slot needs no wrapper).
    strategy: StrategyName = "ddp"
    fsdp: FSDPConfig = FSDPConfig()


@dataclass(frozen=True)
class CheckpointStorageConfig:
    """`checkpoint_storage`: where checkpoints go, and how many survive garbage collection.

    `shared_fs` writes into `host_path/storage_path` (a path every agent and the master
    mount at the same place); `s3` uploads to `s3://bucket/prefix/<uuid>` on AWS or any
    S3-compatible store at `endpoint_url`. Without `access_key`/`secret_key`, boto3's usual
    chain (AWS_* environment variables, ~/.aws, an instance role) supplies the credentials.
    `save_*` are Determined's garbage-collection counts (see `assay.master.checkpoints`).
    """

    type: Literal["shared_fs", "s3"] = "shared_fs"
    host_path: str | None = None
    storage_path: str | None = None
    bucket: str | None = None
    prefix: str = ""
    endpoint_url: str | None = None
    region: str | None = None
    access_key: str | None = None
    secret_key: str | None = None
    save_trial_best: int = 1
    save_trial_latest: int = 1
    save_experiment_best: int = 0

    @property
    def host_directory(self) -> Path | None:
        """`host_path/storage_path` of shared_fs storage; None without a host_path."""
        if self.type != "shared_fs" or self.host_path is None:
            return None
        return Path(self.host_path) / (self.storage_path or "")


def parse_resources(s: Section) -> ResourcesConfig:
    slots = s.get_int("slots_per_trial", 1, minimum=1) or 1
    priority = s.get_int("priority", 42, minimum=1, maximum=99) or 42
    weight = s.get_number("weight", 1.0)
    if weight is not None and not (MIN_WEIGHT <= weight <= MAX_WEIGHT):
        s.error(
            "weight",
            f"must be a number from {MIN_WEIGHT:g} to {MAX_WEIGHT:g} (a share relative to "
            f"other experiments' weights; default 1), got {s.raw('weight')!r}",
        )
        weight = None
    max_slots = s.get_int("max_slots", None, minimum=1)
    if max_slots is not None and 1 <= max_slots < slots:
        s.error(
            "max_slots",
            f"must be at least slots_per_trial ({slots}), or no trial could ever start; "
            f"got {max_slots}",
        )
    pool = _name(s, "resource_pool")
    label = _name(s, "agent_label")
    memory = _memory(s)
    _determined.check_resources(s)
    s.finish()
    return ResourcesConfig(
        slots_per_trial=slots,
        priority=priority,
        weight=1.0 if weight is None else weight,
        max_slots=max_slots if max_slots is not None and max_slots >= 1 else None,
        resource_pool=pool,
        agent_label=label,
        memory=memory,
    )


def _memory(s: Section) -> int | None:
    """`resources.memory`: a size per slot, or None when not set."""
    if not s.has("memory"):
        return None
    try:
        return parse_memory(s.raw("memory"))
    except ValueError as e:
        s.error("memory", f"{e} (the memory of each slot: a trial of N slots gets N times it)")
        return None


def _name(s: Section, key: str) -> str | None:
    """An optional pool or label name: a non-empty string without surrounding spaces."""
    value = s.get_str(key, None)
    if value is not None and (not value.strip() or value != value.strip()):
        s.error(key, f"must be a non-empty name without surrounding spaces, got {value!r}")
        return None
    return value


def parse_optimizations(s: Section, warnings: list[str]) -> OptimizationsConfig:
    freq = s.get_int("aggregation_frequency", 1, minimum=1) or 1
    _determined.check_optimizations(s, warnings)
    apex = s.data.get("mixed_precision")
    if apex == "O0":  # Apex's "off", as Determined configs write it
        precision = "off"
        s.raw("mixed_precision")
    elif apex in ("O1", "O2", "O3"):
        s.raw("mixed_precision")
        s.error(
            "mixed_precision",
            f"{apex} is an Apex level; Assay uses torch.autocast: write fp16 (with a gradient "
            "scaler) or bf16",
        )
        precision = "off"
    else:
        precision = s.get_choice("mixed_precision", ("off", "fp16", "bf16", "auto"), "off")
    checkpointed = _activation_checkpointing(s)
    strategy, fsdp = _parse_strategy(s)
    s.finish()
    return OptimizationsConfig(
        aggregation_frequency=freq,
        mixed_precision=precision,  # type: ignore[arg-type]
        activation_checkpointing=checkpointed,
        strategy=strategy,  # type: ignore[arg-type]
        fsdp=fsdp,
    )


def _parse_strategy(s: Section) -> tuple[str, FSDPConfig]:
    """`strategy: ddp | fsdp` and the `fsdp` block, which only fsdp reads."""
    strategy = s.get_choice("strategy", ("ddp", "fsdp"), "ddp")
    f = s.section("fsdp")
    if f.data and strategy != "fsdp":
        s.error("fsdp", "applies to strategy: fsdp; set optimizations.strategy: fsdp or remove it")
    sharding = f.get_choice(
        "sharding", ("full_shard", "shard_grad_op", "hybrid_shard"), "full_shard"
    )
    wrap = f.get_str_list("wrap")
    for name in wrap:
        if not name.isidentifier():
            f.error("wrap", f"{name!r} is not a Python class name")
    min_params = f.get_int("min_num_params", None, minimum=1)
    if wrap and min_params is not None:
        f.error(
            "min_num_params",
            "give either wrap (module classes) or min_num_params (a size policy), not both",
        )
    cpu_offload = f.get_bool("cpu_offload", False)
    reshard: bool | None = None
    if f.has("reshard_after_forward"):
        reshard = f.get_bool("reshard_after_forward", True)
    f.finish()
    fsdp = FSDPConfig(
        sharding=sharding,  # type: ignore[arg-type]
        wrap=tuple(wrap),
        min_num_params=min_params,
        cpu_offload=cpu_offload,
        reshard_after_forward=reshard,
    )
    return strategy, fsdp


def _activation_checkpointing(s: Section) -> tuple[str, ...]:
    """`activation_checkpointing: [TransformerBlock, ...]`: module class names."""
    names = s.get_str_list("activation_checkpointing")
    for name in names:
        if not name.isidentifier():
            s.error("activation_checkpointing", f"{name!r} is not a Python class name")
    return tuple(names)


_SHARED_FS_KEYS = ("host_path", "storage_path")
_S3_KEYS = ("bucket", "prefix", "endpoint_url", "region", "access_key", "secret_key")


def parse_storage(s: Section, warnings: list[str]) -> CheckpointStorageConfig:
    if not _determined.check_storage_type(s):
        return CheckpointStorageConfig()  # refused: its other keys belong to that type
    _determined.check_storage_keys(s, warnings)
    kind = s.get_choice("type", ("shared_fs", "s3"), "shared_fs")
    values = {key: s.get_str(key, None) for key in (*_SHARED_FS_KEYS, *_S3_KEYS)}
    best = s.get_int("save_trial_best", 1, minimum=0)
    latest = s.get_int("save_trial_latest", 1, minimum=0)
    exp_best = s.get_int("save_experiment_best", 0, minimum=0)
    s.finish()
    others = _S3_KEYS if kind == "shared_fs" else _SHARED_FS_KEYS
    type_is_valid = s.data.get("type") in (None, "shared_fs", "s3")
    for key in others:
        if type_is_valid and s.has(key):
            other = "s3" if kind == "shared_fs" else "shared_fs"
            s.error(key, f"is a setting of {other} storage, not {kind}")
    if kind == "s3":
        _check_s3(s, values)
    else:
        _check_shared_fs(s, values)
    return CheckpointStorageConfig(
        type=kind,  # type: ignore[arg-type]
        host_path=values["host_path"],
        storage_path=values["storage_path"],
        bucket=values["bucket"],
        prefix=(values["prefix"] or "").strip("/"),
        endpoint_url=values["endpoint_url"],
        region=values["region"],
        access_key=values["access_key"],
        secret_key=values["secret_key"],
        save_trial_best=1 if best is None else best,
        save_trial_latest=1 if latest is None else latest,
        save_experiment_best=0 if exp_best is None else exp_best,
    )


def _check_shared_fs(s: Section, values: Mapping[str, str | None]) -> None:
    host, below = values["host_path"], values["storage_path"]
    if host is not None and not host.startswith("/"):
        s.error(
            "host_path", f"expected an absolute path (a directory every agent mounts), got {host!r}"
        )
    if below is not None and (below.startswith("/") or ".." in Path(below).parts):
        s.error(
            "storage_path",
            f"expected a relative path under host_path without '..', got {below!r}",
        )


_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")


def _check_s3(s: Section, values: Mapping[str, str | None]) -> None:
    bucket = values["bucket"]
    if bucket is None:
        if not s.has("bucket"):
            s.error("bucket", "is required for s3 storage (the name of an existing bucket)")
    elif not _BUCKET.match(bucket):
        s.error(
            "bucket",
            f"{bucket!r} is not a bucket name: 3-63 lowercase letters, digits, '.' and '-', "
            "starting and ending with a letter or digit",
        )
    prefix = values["prefix"]
    if prefix and ".." in prefix.split("/"):
        s.error("prefix", f"must not contain '..', got {prefix!r}")
    endpoint = values["endpoint_url"]
    if endpoint is not None and not endpoint.startswith(("http://", "https://")):
        s.error("endpoint_url", f"expected an http:// or https:// URL, got {endpoint!r}")
    if (values["access_key"] is None) != (values["secret_key"] is None):
        given, missing = (
            ("access_key", "secret_key")
            if values["secret_key"] is None
            else ("secret_key", "access_key")
        )
        s.error(
            missing,
            f"is required with {s.key_path(given)} (or give neither and let boto3 find "
            "credentials in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or ~/.aws)",
        )


__all__ = [
    "MAX_WEIGHT",
    "MIN_WEIGHT",
    "CheckpointStorageConfig",
    "FSDPConfig",
    "FSDPSharding",
    "OptimizationsConfig",
    "Precision",
    "ResourcesConfig",
    "StrategyName",
    "parse_optimizations",
    "parse_resources",
    "parse_storage",
]
