"""The experiment config: its schema, validation and hyperparameter space.

`parse_config` turns a mapping (usually loaded from YAML) into a typed, frozen
`ExperimentConfig`, or raises `InvalidConfigError` listing every problem with its key path.
"""

from assay.config._hparams import (
    Categorical,
    Const,
    Double,
    HParam,
    Int,
    Log,
    sample_hparams,
)
from assay.config._schema import (
    CheckpointStorageConfig,
    ExperimentConfig,
    Length,
    LengthUnit,
    OptimizationsConfig,
    Precision,
    ResourcesConfig,
    SearcherConfig,
    load_config,
    parse_config,
)

__all__ = [
    "Categorical",
    "CheckpointStorageConfig",
    "Const",
    "Double",
    "ExperimentConfig",
    "HParam",
    "Int",
    "Length",
    "LengthUnit",
    "Log",
    "OptimizationsConfig",
    "Precision",
    "ResourcesConfig",
    "SearcherConfig",
    "load_config",
    "parse_config",
    "sample_hparams",
]
