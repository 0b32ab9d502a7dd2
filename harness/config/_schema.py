"""The experiment config schema (Determined's keys where they exist) and its parser."""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import yaml

from assay.config import _determined, _limits
from assay.config._hparams import Const, HParam, overflow_problems, parse_hparams
from assay.config._length import UNBOUNDED_LENGTH, Length, LengthUnit
from assay.config._reader import REQUIRED, Section, type_name
from assay.config._search import (
    PBT_KEYS,
    Objective,
    SearcherConfig,
    parse_objectives,
    searcher_problems,
)
from assay.errors import InvalidConfigError

Precision = Literal["off", "fp16", "bf16", "auto"]
# `bayesian` is an alias: random search with the tpe sampler; `async_halving` is
# Determined's name of ASHA.
SEARCHER_NAMES = (
    "single",
    "grid",
    "random",
    "asha",
    "adaptive_asha",
    "bayesian",
    "async_halving",
    "pbt",
    "custom",
)
_ALIASES = {"async_halving": "asha"}
# Keys each searcher accepts besides the common ones; their values are checked by
# `assay.config._search.searcher_problems`, shared with the searchers themselves.
_SEARCHER_KEYS: dict[str, tuple[str, ...]] = {
    "single": (),
    "grid": ("max_concurrent_trials",),
    "random": ("max_trials", "max_concurrent_trials", "sampler", "random_fraction"),
    "asha": (
        "max_trials",
        "max_concurrent_trials",
        "divisor",
        "num_rungs",
        "max_rungs",
        "sampler",
        "random_fraction",
        "stop_once",
    ),
    "adaptive_asha": (
        "max_trials",
        "max_concurrent_trials",
        "divisor",
        "max_rungs",
        "mode",
        "bracket_rungs",
        "sampler",
        "random_fraction",
        "stop_once",
    ),
    "bayesian": ("max_trials", "max_concurrent_trials", "sampler"),
    # Determined's keys; `length_per_round` is read as the length (max_length) of a round.
    "pbt": ("length_per_round", *PBT_KEYS),
    # Operations come from user code (assay.client.searcher); max_trials and max_length,
    # when given, bound what that code may ask for.
    "custom": ("max_trials",),
}
_SEARCHER_KEYS["async_halving"] = _SEARCHER_KEYS["asha"]
# Every searcher reads these (besides its own keys).
_COMMON_SEARCHER_KEYS = (
    "name",
    "metric",
    "smaller_is_better",
    "max_length",
    "time_metric",
    "max_time",
    "metrics",
)


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
    `save_*` are Determined's garbage-collection counts (see `assay.master._gc`).
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


@dataclass(frozen=True)
class ExperimentConfig:
    """A validated experiment config. `raw` keeps the mapping it was parsed from.

    `entrypoint` is `module:Class` (a Trial) or a command; for a command, `command` holds
    its arguments (`entrypoint` then is the command as one shell-quoted string).
    """

    entrypoint: str
    hyperparameters: Mapping[str, HParam]
    searcher: SearcherConfig
    name: str = "experiment"
    description: str = ""
    labels: tuple[str, ...] = ()
    # Where the experiment is filed (Determined's keys); None: Default / Uncategorized.
    workspace: str | None = None
    project: str | None = None
    resources: ResourcesConfig = ResourcesConfig()
    optimizations: OptimizationsConfig = OptimizationsConfig()
    min_validation_period: Length | None = None
    min_checkpoint_period: Length | None = None
    checkpoint_storage: CheckpointStorageConfig = CheckpointStorageConfig()
    max_restarts: int = 5
    experiment_seed: int = 0
    scheduling_unit: int = 100
    data: Mapping[str, Any] = field(default_factory=dict)
    command: tuple[str, ...] | None = None
    # Determined's keys: filled in by the parser when given.
    records_per_epoch: int | None = None
    checkpoint_policy: Literal["best", "all", "none"] = "best"
    perform_initial_validation: bool = False
    environment_variables: Mapping[str, str] = field(default_factory=dict)
    # Determined's per-device form (`{cpu: [...], cuda: [...]}`): set on slots of that kind.
    device_environment_variables: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    # `key.path: message` for keys that were accepted but change nothing (see _determined).
    warnings: tuple[str, ...] = ()
    raw: Mapping[str, Any] = field(default_factory=dict)

    def environment_for(self, device: str) -> dict[str, str]:
        """The variables every rank on a `device` slot ("cpu" or "cuda") gets."""
        return {
            **self.environment_variables,
            **self.device_environment_variables.get(device, {}),
        }

    @property
    def is_script(self) -> bool:
        """Whether the entrypoint is a command (a script) rather than a Trial class."""
        return self.command is not None

    @property
    def global_batch_size(self) -> int:
        hp = self.hyperparameters["global_batch_size"]
        assert isinstance(hp, Const)  # guaranteed by parse_config for Trials
        return int(hp.val)


_ENTRYPOINT = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def load_config(path: str | Path) -> ExperimentConfig:
    """Read and validate a YAML experiment config file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise InvalidConfigError([f"cannot read config file {path}: {e.strerror}"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise InvalidConfigError([f"{path} is not valid YAML: {e}"]) from None
    return parse_config(data)


def parse_config(data: Any, *, limits: bool = False) -> ExperimentConfig:
    """Validate a config mapping; raise `InvalidConfigError` listing every problem.

    `limits`: also refuse what the master's store or the clients of its API cannot hold
    (see `assay.config._limits`: nesting deeper than 32, NUL characters, NaN, dates,
    names over 255 characters, ...; ranges whose samples overflow a float), as the master
    does for every submission. Off
    elsewhere: a config read back from the store was accepted before (a limit added
    since must not stop its experiment from resuming), and a local run stores nothing.
    """
    if not isinstance(data, Mapping):
        raise InvalidConfigError([f"<config>: expected a mapping, got {type_name(data)}"])
    problems: list[str] = []
    if limits:
        problems, too_deep = _limits.value_problems(data)
        if too_deep:  # the parsers below recurse into nested hyperparameters
            raise InvalidConfigError(problems)
    warnings: list[str] = []
    top = Section(data, "", problems)

    entrypoint, command, script = _parse_entrypoint(top)
    # A script (Determined's Core API) may search nothing: its hyperparameters are optional.
    hparams = parse_hparams(top.section("hyperparameters", required=not script))
    if limits:
        problems.extend(overflow_problems(hparams, "hyperparameters"))
    resources = _parse_resources(top.section("resources"))
    _check_global_batch_size(top, hparams, resources.slots_per_trial, script=script)
    units = _Units(_records_per_batch(hparams), script)
    searcher = _parse_searcher(top.section("searcher", required=True), hparams, units, warnings)
    optimizations = _parse_optimizations(top.section("optimizations"), warnings)
    min_val = _parse_length(top, "min_validation_period", required=False, units=units)
    min_ckpt = _parse_length(top, "min_checkpoint_period", required=False, units=units)
    storage = _parse_storage(top.section("checkpoint_storage"), warnings)
    repro = top.section("reproducibility")
    seed = repro.get_int("experiment_seed", 0, minimum=0, maximum=2**31 - 1)
    repro.finish()
    env = _determined.parse_environment(top.section("environment"), warnings)
    _determined.check_top_level(top, warnings)
    policy = top.get_choice("checkpoint_policy", ("best", "all", "none"), "best")
    name, description, labels = _parse_shown_text(top, limits=limits)
    config = ExperimentConfig(
        entrypoint=entrypoint or "",
        hyperparameters=hparams,
        searcher=searcher,
        name=name,
        description=description,
        labels=labels,
        workspace=top.get_str("workspace", None),
        project=top.get_str("project", None),
        resources=resources,
        optimizations=optimizations,
        min_validation_period=min_val,
        min_checkpoint_period=min_ckpt,
        checkpoint_storage=storage,
        max_restarts=top.get_int("max_restarts", 5, minimum=0) or 0,
        experiment_seed=seed or 0,
        scheduling_unit=top.get_int("scheduling_unit", 100, minimum=1) or 100,
        data=dict(top.get_mapping("data") or {}),
        command=command,
        records_per_epoch=top.get_int("records_per_epoch", None, minimum=1),
        checkpoint_policy=policy,  # type: ignore[arg-type]
        perform_initial_validation=top.get_bool("perform_initial_validation", False),
        environment_variables=env.variables,
        device_environment_variables=env.by_device,
        warnings=tuple(warnings),
        raw=data,
    )
    top.finish()
    if problems:
        raise InvalidConfigError(problems)
    return config


def _parse_shown_text(top: Section, *, limits: bool) -> tuple[str, str, tuple[str, ...]]:
    """The name, description and labels: shown in every experiment list, so bounded."""
    name = top.get_str("name", "experiment") or "experiment"
    description = top.get_str("description", "") or ""
    labels = tuple(top.get_str_list("labels"))
    if limits:
        top.problems.extend(_limits.text_problems(name, "name", "name"))
        top.problems.extend(_limits.text_problems(description, "description", "description"))
        too_many = _limits.labels_problem(len(labels), "labels")
        if too_many is not None:
            top.problems.append(too_many)
        for i, label in enumerate(labels):
            top.problems.extend(_limits.text_problems(label, f"labels[{i}]", "label"))
    return name, description, labels


def _parse_entrypoint(top: Section) -> tuple[str | None, tuple[str, ...] | None, bool]:
    """`module:Class`, or a command as a string (`python3 train.py --epochs 1`) or a list;
    and whether the config is a script's.

    A command that is wrong but clearly a command (`train.py`, a list, a string that does
    not split) is still a script's: the rules for a Trial (`global_batch_size` is required)
    would add problems that are not the user's. Otherwise (missing, empty, not a Trial's
    `module:ClassName`) the Trial's rules apply, as for any config that names no command.
    """
    value = top.raw("entrypoint")
    if value is None:
        top.error(
            "entrypoint", "is required: 'module:ClassName' or a command such as 'python3 train.py'"
        )
        return None, None, False
    if isinstance(value, list):
        if not value or not all(isinstance(v, str) and v for v in value):
            top.error("entrypoint", f"a command list must hold non-empty strings, got {value!r}")
            return None, None, True
        argv = tuple(value)
    elif isinstance(value, str):
        if _ENTRYPOINT.match(value.strip()):
            return value.strip(), None, False
        try:
            argv = tuple(shlex.split(value))
        except ValueError as e:
            top.error("entrypoint", f"cannot split {value!r} into a command: {e}")
            return None, None, True
        if not argv:
            top.error("entrypoint", f"is empty ({value!r}): give 'module:ClassName' or a command")
            return None, None, False
    else:
        top.error(
            "entrypoint",
            f"expected 'module:ClassName', a command string or a list, got {type_name(value)}",
        )
        return None, None, False
    if len(argv) == 1 and argv[0].endswith(".py"):
        top.error("entrypoint", f"{argv[0]!r} is a file, not a command: write 'python3 {argv[0]}'")
        return None, None, True
    if len(argv) == 1 and (":" in argv[0] or re.fullmatch(r"[A-Za-z_][\w.]*", argv[0])):
        top.error(
            "entrypoint",
            f"expected 'module:ClassName' (e.g. model_def:MyTrial) or a command (e.g. "
            f"'python3 train.py'), got {argv[0]!r}",
        )
        return None, None, False
    return shlex.join(argv), argv, True


def _check_global_batch_size(
    top: Section, hparams: Mapping[str, HParam], slots: int, *, script: bool
) -> None:
    path = "hyperparameters.global_batch_size"
    if "hyperparameters" not in top.data or not isinstance(top.data["hyperparameters"], Mapping):
        return
    hp = hparams.get("global_batch_size")
    if hp is None:
        if script:
            return  # a script batches its own data
        if "global_batch_size" not in top.data["hyperparameters"]:
            top.problems.append(f"{path}: is required (a positive integer, e.g. 64)")
        return
    if not isinstance(hp, Const):
        top.problems.append(f"{path}: must be a constant integer, not a searched range")
        return
    value = hp.val
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        top.problems.append(f"{path}: expected a positive integer, got {value!r}")
    elif slots >= 1 and value % slots:
        top.problems.append(
            f"{path}: {value} is not divisible by resources.slots_per_trial ({slots}); "
            f"use a multiple of {slots}"
        )


_UNBOUNDED_SEARCHERS = ("single", "random", "grid", "bayesian")


@dataclass(frozen=True)
class _Units:
    """What lengths are read against: `{records: N}` is N records in global batches of
    `records_per_batch`; a script may give a bare integer, in the units its progress counts."""

    records_per_batch: int | None
    script: bool


def _records_per_batch(hparams: Mapping[str, HParam]) -> int | None:
    hp = hparams.get("global_batch_size")
    if isinstance(hp, Const) and not isinstance(hp.val, bool) and isinstance(hp.val, int):
        return hp.val if hp.val >= 1 else None
    return None


def _parse_length(parent: Section, key: str, *, required: bool, units: _Units) -> Length | None:
    """`{batches: N}`, `{epochs: N}` or `{records: N}` (made batches here: ceil(N / global
    batch size)); a bare N for a script, as Determined's Core API configs write it."""
    value = parent.raw(key)
    if value is None:
        if required:
            parent.error(key, "is required, e.g. {batches: 1000} or {epochs: 5}")
        return None
    expected = "expected {batches: int} or {epochs: int} or {records: int}"
    if units.script and not isinstance(value, bool) and isinstance(value, int):
        if value < 1:
            parent.error(key, f"expected a positive integer, got {value}")
            return None
        return Length.batches(value)  # what the script counts (it reports its batches)
    if not isinstance(value, Mapping) or len(value) != 1:
        parent.error(key, f"{expected}, got {value!r}")
        return None
    ((unit, n),) = value.items()
    if unit not in ("batches", "epochs", "records"):
        parent.error(key, f"{expected}, got unit {unit!r}")
        return None
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        parent.error(key, f"{expected} with a positive integer, got {unit}: {n!r}")
        return None
    if unit == "records":
        if units.records_per_batch is None:
            parent.error(
                key,
                "a length in records needs hyperparameters.global_batch_size (a constant "
                "integer): Assay counts global batches; or give {batches: N}",
            )
            return None
        return Length.batches(math.ceil(n / units.records_per_batch))
    return Length(LengthUnit(unit), n)


def searcher_in_batches(config: ExperimentConfig) -> SearcherConfig:
    """`config.searcher` with `max_length` in batches, as the master's searchers count.

    Epochs are `records_per_epoch` records each, in global batches: `ceil(epochs *
    records_per_epoch / global_batch_size)`. Raise `InvalidConfigError` naming
    `records_per_epoch` when an epoch length cannot be converted.
    """
    searcher = config.searcher
    length = searcher.max_length
    if length.unit is LengthUnit.BATCHES:
        return searcher
    per_batch = _records_per_batch(config.hyperparameters)
    if config.records_per_epoch is None or per_batch is None:
        needs = (
            "records_per_epoch (the number of records in the training set)"
            if config.records_per_epoch is None
            else "hyperparameters.global_batch_size"
        )
        raise InvalidConfigError(
            [
                f"searcher.max_length: {length.to_dict()} on a cluster needs {needs}: the "
                "master counts batches and cannot see the data loader; give it, or give "
                "{batches: N}"
            ]
        )
    batches = math.ceil(length.value * config.records_per_epoch / per_batch)
    return replace(searcher, max_length=Length.batches(batches))


def _parse_searcher(
    s: Section, hparams: Mapping[str, HParam], units: _Units, warnings: list[str]
) -> SearcherConfig:
    given = s.get_required_choice("name", SEARCHER_NAMES)
    name = _ALIASES.get(given, given) if given is not None else None
    objectives: tuple[Objective, ...] = ()
    metric: str | None
    if s.has("metrics"):
        objectives, problems = parse_objectives(s.raw("metrics"))
        s.problems.extend(problems)
        if s.has("metric") or s.has("smaller_is_better"):
            s.error(
                "metrics",
                "give metric (with smaller_is_better) for one metric or metrics for several, "
                "not both; move the metric into metrics as {name, smaller_is_better}",
            )
        metric = objectives[0].name if objectives else ""
    else:
        metric = s.get_str("metric", REQUIRED)
    time_metric = s.get_str("time_metric", None)
    if s.has("max_time"):
        if s.has("max_length"):
            s.error("max_time", "give max_length or max_time (with time_metric), not both")
        max_time = s.get_int("max_time", None, minimum=1)
        if time_metric is None:
            s.error(
                "time_metric",
                "is required with max_time: the validation metric that "
                "counts progress (e.g. batches)",
            )
        max_length = Length.batches(max_time) if max_time is not None else None
    elif name == "pbt":
        if s.has("max_length"):
            s.raw("max_length")
            s.error(
                "max_length",
                "pbt trains length_per_round per round for num_rounds rounds; give "
                "length_per_round instead",
            )
        max_length = _parse_length(s, "length_per_round", required=True, units=units)
    elif name == "custom" and not s.has("max_length"):
        # The user's SearchMethod decides every length; max_length is an optional bound.
        max_length = Length.batches(UNBOUNDED_LENGTH)
    elif units.script and name in _UNBOUNDED_SEARCHERS and not s.has("max_length"):
        # Determined 0.38's Core API configs leave it out: the script decides how long it
        # trains, and exiting 0 ends the trial.
        max_length = Length.batches(UNBOUNDED_LENGTH)
    else:
        max_length = _parse_length(s, "max_length", required=True, units=units)
    smaller = (
        objectives[0].smaller_is_better if objectives else s.get_bool("smaller_is_better", True)
    )
    max_trials = s.get_int("max_trials", None, minimum=1)
    concurrent = s.get_int("max_concurrent_trials", 0, minimum=0) or 0
    options: dict[str, Any] = {}
    # Which keys a searcher takes is only known once its name is valid.
    every_key = {key for keys in _SEARCHER_KEYS.values() for key in keys}
    allowed = _SEARCHER_KEYS.get(name, ()) if name else tuple(every_key)
    for key in (
        "divisor",
        "num_rungs",
        "max_rungs",
        "bracket_rungs",
        "mode",
        "sampler",
        "random_fraction",
        *PBT_KEYS,
    ):
        if key in s.data:
            options[key] = s.raw(key)
            if key not in allowed:
                s.error(key, f"is not a setting of the {given} searcher")
    for key in ("max_trials", "max_concurrent_trials", "stop_once"):
        if key in s.data and key not in allowed:
            s.raw(key)
            s.error(key, f"is not a setting of the {given} searcher")
    _determined.check_searcher(s, warnings, stop_once="stop_once" in allowed)
    # An unknown key's hint lists what this searcher takes, not only what was given.
    s.finish(extra_allowed=(*_COMMON_SEARCHER_KEYS, *allowed))
    config = SearcherConfig(
        name=name or "single",
        metric=metric or "",
        max_length=max_length or Length.batches(1),
        smaller_is_better=smaller,
        max_trials=max_trials,
        max_concurrent_trials=concurrent,
        options=options,
        time_metric=time_metric,
        objectives=objectives,
    )
    # The option rules need a valid name and length to mean anything; a max_trials that is
    # present but invalid has had its own message.
    if name is not None and max_length is not None:
        for problem in searcher_problems(config, hparams):
            if not ("max_trials" in s.data and problem.startswith("searcher.max_trials:")):
                s.problems.append(problem)
    return config


def _parse_resources(s: Section) -> ResourcesConfig:
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
    _determined.check_resources(s)
    s.finish()
    return ResourcesConfig(
        slots_per_trial=slots,
        priority=priority,
        weight=1.0 if weight is None else weight,
        max_slots=max_slots if max_slots is not None and max_slots >= 1 else None,
        resource_pool=pool,
        agent_label=label,
    )


def _name(s: Section, key: str) -> str | None:
    """An optional pool or label name: a non-empty string without surrounding spaces."""
    value = s.get_str(key, None)
    if value is not None and (not value.strip() or value != value.strip()):
        s.error(key, f"must be a non-empty name without surrounding spaces, got {value!r}")
        return None
    return value


def _parse_optimizations(s: Section, warnings: list[str]) -> OptimizationsConfig:
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


def _parse_storage(s: Section, warnings: list[str]) -> CheckpointStorageConfig:
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
