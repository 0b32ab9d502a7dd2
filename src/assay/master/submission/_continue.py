"""`experiment continue`: which config changes a continued trial can take.

A continued trial is the same trial: its hyperparameters, model, searcher and resources
stay as they were, and it resumes from its latest checkpoint. Only these keys may change
(`CONTINUABLE`); anything else is refused with a pointer to `experiment fork`, which
starts a new experiment from the same config and model definition.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import yaml

from assay.config import ExperimentConfig, merge
from assay.master.errors import InvalidArgumentError
from assay.master.submission._submission import check_config

# Dotted key paths (with everything under them) a continue may change.
CONTINUABLE = (
    "searcher.max_length",
    "max_restarts",
    "min_validation_period",
    "min_checkpoint_period",
)


def parse_overrides(experiment_id: int, text: str) -> dict[str, Any]:
    """A continue's partial config: a YAML mapping of the keys to change ("" for none)."""
    try:
        data = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as e:
        raise InvalidArgumentError(f"the config to continue with is not valid YAML: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InvalidArgumentError(
            f"the config to continue experiment {experiment_id} with must be a mapping of "
            f"config keys, e.g. {{searcher: {{max_length: {{batches: 200}}}}}}"
        )
    return data


def continued_config(
    experiment_id: int, stored: Mapping[str, Any], overrides: Mapping[str, Any]
) -> tuple[dict[str, Any], ExperimentConfig]:
    """The stored config with `overrides` laid over it, and its parsed form; refused
    (`InvalidArgumentError`) when an override changes a key a continued trial cannot take
    or the result is not a valid config. A `searcher.max_length` given replaces the
    stored one whole (its unit may change)."""
    refused = sorted(
        path
        for path in _changed(stored, overrides)
        if not any(path == key or path.startswith(key + ".") for key in CONTINUABLE)
    )
    if refused:
        raise InvalidArgumentError(
            f"continue cannot change {', '.join(refused)}: a continued trial keeps its "
            f"config but for {', '.join(CONTINUABLE)}; to change anything else, "
            f"`assay experiment fork {experiment_id} --config ...` starts a new experiment "
            "from the same config and model definition"
        )
    merged = merge(stored, overrides)
    searcher = overrides.get("searcher")
    if isinstance(searcher, Mapping) and "max_length" in searcher:
        merged["searcher"]["max_length"] = searcher["max_length"]
    config = check_config(yaml.safe_dump(merged, sort_keys=False))
    return merged, config


def _changed(stored: Any, overrides: Mapping[str, Any], at: str = "") -> Iterator[str]:
    """The dotted paths of the leaves `overrides` sets to something `stored` does not hold."""
    for key, value in overrides.items():
        path = f"{at}{key}"
        below = stored.get(key) if isinstance(stored, Mapping) else None
        if isinstance(value, Mapping) and value:
            yield from _changed(below, value, path + ".")
        elif value != below:
            yield path
