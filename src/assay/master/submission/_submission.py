"""An experiment submission checked before anything is stored or locked.

Each check raises `InvalidArgumentError` with what to fix: the config text (size, YAML
aliases), the config itself (with the limits of what the store and clients can hold),
its searcher, and the model archive as an agent will check it before unpacking. What the
commit will write and what the answer will carry are built here too, so a value that
cannot be encoded is the submitter's error and never reaches the commit thread.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
import secrets
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import yaml

from assay.common.archive import MAX_MODEL_DEF_BYTES, ModelDefinitionError, check_model_archive
from assay.config import (
    MAX_SEED,
    ExperimentConfig,
    parse_config,
    searcher_in_batches,
    seed_is_set,
    with_experiment_seed,
)
from assay.errors import InvalidConfigError
from assay.master.errors import InvalidArgumentError
from assay.master.searcher import Searcher, make_searcher
from assay.master.store import ArchiveFile, ExperimentRecord, ModelDefinition, size_of
from assay.master.wire import config_struct

MAX_CONFIG_BYTES = 2**20
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def new_searcher(config: ExperimentConfig) -> Searcher:
    """The experiment's searcher; `ValueError` names an option that cannot work.

    Its lengths are batches: one in epochs is converted with `records_per_epoch` (the
    config is stored as written, and converted the same way again on restore).
    """
    return make_searcher(
        searcher_in_batches(config), config.hyperparameters, config.experiment_seed
    )


@dataclass(frozen=True)
class PreparedExperiment:
    """A submission that passed every check, ready to be recorded."""

    config: ExperimentConfig
    model_definition: ModelDefinition  # an upload: spooled to disk, read when stored
    owner: str
    owner_id: int
    searcher: Searcher
    config_text: str | None = None  # as submitted: order and comments, for people
    project_id: int | None = None  # None: the Default workspace's Uncategorized project


def check_submission(
    config_yaml: str, model_definition: ModelDefinition
) -> tuple[ExperimentConfig, Searcher]:
    """The parsed config and its new searcher, or `InvalidArgumentError`.

    A config that sets no `reproducibility.experiment_seed` gets one drawn at random
    (`draw_seed`), as Determined's master does: each experiment of one config searches
    its own points, and the seed is stored with the config, so the experiment's searcher
    is the same after a restart.

    Both checks are pure functions of their input, so the master remembers recent
    answers: the last 256 config texts (of at most 64 KiB) that parsed (the config is frozen; each
    submission still gets a searcher of its own) and the SHA-256 of the last 1,024
    archives that passed. Teams resubmit the same config and model directory often;
    a changed byte is checked in full.
    """
    config = _parse(config_yaml)
    if not seed_is_set(config.raw):
        config = with_experiment_seed(config, draw_seed())
    try:
        searcher = new_searcher(config)
    except ValueError as e:
        raise InvalidArgumentError(str(e)) from None
    _check_model_definition(model_definition)
    return config, searcher


_REMEMBERED_CHARS = 64 * 1024


def _parse(config_yaml: str) -> ExperimentConfig:
    """`_parsed_config`: only ordinary configs are remembered, so no user can make the
    master hold much."""
    if len(config_yaml) <= _REMEMBERED_CHARS:
        return _parsed_config(config_yaml)
    return _parsed_config.__wrapped__(config_yaml)


def draw_seed() -> int:
    """A new experiment's seed, from the system's random source (0 to 2**31 - 1)."""
    return secrets.randbelow(MAX_SEED + 1)


def seeded_text(config_yaml: str, config: ExperimentConfig) -> str:
    """The submitted text as people read it back (`experiment describe`, the web UI):
    a seed the master drew is said in a comment at its end. A comment, so that a fork
    of the text (the web UI's, `experiment fork`) draws a seed of its own."""
    if seed_is_set(_parse(config_yaml).raw):  # remembered: parsed once more at most
        return config_yaml
    end = "" if config_yaml.endswith("\n") or not config_yaml else "\n"
    return (
        f"{config_yaml}{end}# reproducibility.experiment_seed: {config.experiment_seed} "
        "(drawn by the master: the config set none; set it to search the same points again)\n"
    )


def check_config(config_yaml: str) -> ExperimentConfig:
    """The config a text parses to, checked as a submission's is; `InvalidArgumentError`."""
    return _parsed_config.__wrapped__(config_yaml)


def check_resource_pool(config: ExperimentConfig, pools: Sequence[str]) -> None:
    """`InvalidArgumentError` for a `resources.resource_pool` the master does not declare."""
    pool = config.resources.resource_pool
    if pool is not None and pool not in pools:
        raise InvalidArgumentError(
            f"resources.resource_pool: this master has no pool named {pool!r}: "
            f"pools are {', '.join(pools)}"
        )


@functools.lru_cache(maxsize=256)
def _parsed_config(config_yaml: str) -> ExperimentConfig:
    """The config a text parses to (refusals raise, and are not remembered)."""
    _check_config_text(config_yaml)
    try:
        raw = yaml.load(config_yaml, Loader=_YAML_LOADER)  # a safe loader (C if built)
    except yaml.YAMLError as e:
        raise InvalidArgumentError(f"the config is not valid YAML: {e}") from None
    try:
        config = parse_config(raw, limits=True)  # stored, and shown to every user
        # The searcher counts batches: a length in epochs must convert (records_per_epoch).
        searcher_in_batches(config)
    except InvalidConfigError as e:
        raise InvalidArgumentError(_shortened(e)) from None
    _check_storable(config)
    return config


def _check_storable(config: ExperimentConfig) -> None:
    """Encode the config as the store will (JSON) and build it as the answer carries it
    (a Struct, kept for the answer): `parse_config` refuses what either cannot hold, and
    anything it missed is refused here rather than failing the commit of everyone's
    changes."""
    try:
        json.dumps(config.raw, allow_nan=False)
        config_struct(config)
    except (TypeError, ValueError, OverflowError, RecursionError) as e:
        raise InvalidArgumentError(
            f"the config cannot be stored: {type(e).__name__}: {str(e)[:200]}"
        ) from None


# A refusal's message travels in the status's trailer (gRPC's default limit is 8 KiB).
_MAX_MESSAGE_CHARS = 4000


def _shortened(error: InvalidConfigError) -> str:
    """The error's message, its first problems only when all would be too long to send."""
    message = str(error)
    if len(message) <= _MAX_MESSAGE_CHARS:
        return message
    shown: list[str] = []
    used = 0
    for problem in error.problems:
        line = problem if len(problem) <= 500 else problem[:500] + "..."
        if used + len(line) > _MAX_MESSAGE_CHARS - 100:
            break
        shown.append(line)
        used += len(line) + 5
    left = len(error.problems) - len(shown)
    more = [f"... and {left} more; fix these and submit again"] if left else []
    return str(InvalidConfigError([*shown, *more]))


_PASSED_ARCHIVES: OrderedDict[bytes, None] = OrderedDict()
_PASSED_LIMIT = 1024
_passed_lock = threading.Lock()


def _check_model_definition(data: ModelDefinition) -> None:
    """The archive checks an agent applies before unpacking, done before it is stored (a
    spooled upload is read from its file as it is checked, never whole)."""
    if isinstance(data, ArchiveFile):
        digest = bytes.fromhex(data.sha256)
    else:
        digest = hashlib.sha256(data).digest()
    with _passed_lock:
        if digest in _PASSED_ARCHIVES:
            _PASSED_ARCHIVES.move_to_end(digest)
            return
    try:
        check_model_archive(data.path if isinstance(data, ArchiveFile) else data)
    except ModelDefinitionError as e:
        raise InvalidArgumentError(
            f"{e}; exclude data and checkpoints with .assayignore"
            if size_of(data) > MAX_MODEL_DEF_BYTES
            else str(e)
        ) from None
    with _passed_lock:
        _PASSED_ARCHIVES[digest] = None
        if len(_PASSED_ARCHIVES) > _PASSED_LIMIT:
            _PASSED_ARCHIVES.popitem(last=False)


def _check_config_text(config_yaml: str) -> None:
    """Refuse configs whose size or YAML aliases could make loading them, or anything
    done with them later, cost far more than their length (a "billion laughs")."""
    if len(config_yaml) > MAX_CONFIG_BYTES:
        raise InvalidArgumentError(
            f"the config is {len(config_yaml)} characters; at most {MAX_CONFIG_BYTES} are taken"
        )
    if "*" not in config_yaml:
        return
    try:
        for token in yaml.scan(config_yaml):
            if isinstance(token, yaml.AliasToken):
                raise InvalidArgumentError(
                    f"the config uses the YAML alias *{token.value}; write the value out "
                    "instead (aliases are not accepted)"
                )
    except yaml.YAMLError as e:
        raise InvalidArgumentError(f"the config is not valid YAML: {e}") from None


def new_record(
    prepared: PreparedExperiment,
    experiment_id: int,
    state: str,
    now: dt.datetime,
    progress: float,
) -> ExperimentRecord:
    """The stored row of a just-recorded experiment, as `get_experiment` would read it."""
    config = prepared.config
    return ExperimentRecord(
        id=experiment_id,
        name=config.name,
        description=config.description,
        owner=prepared.owner,
        state=state,
        labels=tuple(sorted(set(config.labels))),
        priority=config.resources.priority,
        progress=progress,
        archived=False,
        config=dict(config.raw),
        searcher_state=None,
        created_at=now,
        start_time=now,
        end_time=None,
    )
