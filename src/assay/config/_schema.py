"""The experiment config schema (Determined's keys where they exist) and its parser."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import yaml

from assay.config import _determined, _limits
from assay.config._entrypoint import parse_entrypoint
from assay.config._hparams import (
    Const,
    HParam,
    log_bound_warnings,
    overflow_problems,
    parse_hparams,
)
from assay.config._length import UNBOUNDED_LENGTH, Length, LengthUnit
from assay.config._log_policies import LogPolicy, parse_log_policies
from assay.config._pbt import PBT_KEYS
from assay.config._reader import REQUIRED, Section, type_name
from assay.config._search import searcher_problems
from assay.config._searcher_config import Objective, SearcherConfig, parse_objectives
from assay.config._sections import (
    CheckpointStorageConfig,
    OptimizationsConfig,
    ResourcesConfig,
    parse_optimizations,
    parse_resources,
    parse_storage,
)
from assay.errors import InvalidConfigError

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
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    optimizations: OptimizationsConfig = field(default_factory=OptimizationsConfig)
    min_validation_period: Length | None = None
    min_checkpoint_period: Length | None = None
    checkpoint_storage: CheckpointStorageConfig = field(default_factory=CheckpointStorageConfig)
    max_restarts: int = 5
    # 0 when the config sets none: a master draws one for each experiment instead
    # (`with_experiment_seed`), so that two searches of one config try different points.
    experiment_seed: int = 0
    scheduling_unit: int = 100
    data: Mapping[str, Any] = field(default_factory=dict)
    command: tuple[str, ...] | None = None
    # Determined's keys: filled in by the parser when given.
    records_per_epoch: int | None = None
    checkpoint_policy: Literal["best", "all", "none"] = "best"
    perform_initial_validation: bool = False
    # Determined's `log_policies` that act: what a failed run's matching log lines do.
    log_policies: tuple[LogPolicy, ...] = ()
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


MAX_SEED = 2**31 - 1
# The (section, key) pairs a master fills in when a config leaves them out: its stored
# config holds them, the text as submitted may not.
FILLED_BY_MASTER = (("reproducibility", "experiment_seed"),)


def seed_is_set(raw: Mapping[str, Any]) -> bool:
    """Whether a config mapping sets `reproducibility.experiment_seed` (a master draws one
    for a config that does not; `run-local` and an experiment stored before seeds were
    drawn use 0)."""
    repro = raw.get("reproducibility")
    return isinstance(repro, Mapping) and repro.get("experiment_seed") is not None


def with_experiment_seed(config: ExperimentConfig, seed: int) -> ExperimentConfig:
    """`config` with `reproducibility.experiment_seed: seed`, in `raw` too (what is stored)."""
    if not 0 <= seed <= MAX_SEED:
        raise ValueError(f"experiment_seed must be from 0 to {MAX_SEED}, got {seed}")
    repro = config.raw.get("reproducibility")
    kept = dict(repro) if isinstance(repro, Mapping) else {}
    raw = {**config.raw, "reproducibility": {**kept, "experiment_seed": seed}}
    return replace(config, experiment_seed=seed, raw=raw)


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

    entrypoint, command, script = parse_entrypoint(top)
    # A script (Determined's Core API) may search nothing: its hyperparameters are optional.
    hparams = parse_hparams(top.section("hyperparameters", required=not script))
    warnings.extend(log_bound_warnings(hparams))
    if limits:
        problems.extend(overflow_problems(hparams, "hyperparameters"))
        problems.extend(_limits.names_problems(hparams, "hyperparameters"))
    resources = parse_resources(top.section("resources"))
    _check_global_batch_size(top, hparams, resources.slots_per_trial, script=script)
    units = _Units(_records_per_batch(hparams), script)
    searcher = _parse_searcher(top.section("searcher", required=True), hparams, units, warnings)
    if limits:  # a metric no trial may report (see _limits.name_problem) is never met
        named = [(f"searcher.metrics[{i}]", o.name) for i, o in enumerate(searcher.objectives)]
        for where, name in named or [("searcher.metric", searcher.metric)]:
            problem = _limits.name_problem(name) if name else None
            if problem is not None:
                problems.append(f"{where}: {name!r} {problem}")
    optimizations = parse_optimizations(top.section("optimizations"), warnings)
    min_val = _parse_length(top, "min_validation_period", required=False, units=units)
    min_ckpt = _parse_length(top, "min_checkpoint_period", required=False, units=units)
    storage = parse_storage(top.section("checkpoint_storage"), warnings)
    repro = top.section("reproducibility")
    seed = repro.get_int("experiment_seed", 0, minimum=0, maximum=MAX_SEED)
    repro.finish()
    env = _determined.parse_environment(top.section("environment"), warnings)
    log_policies = parse_log_policies(top, warnings)
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
        log_policies=log_policies,
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
