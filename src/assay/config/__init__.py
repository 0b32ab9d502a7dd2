"""The experiment config: its schema, validation and hyperparameter space.

`parse_config` turns a mapping (usually loaded from YAML) into a typed, frozen
`ExperimentConfig`, or raises `InvalidConfigError` listing every problem with its key path.
"""

from assay.config._determined import environment_of
from assay.config._hparams import (
    MAX_GRID_POINTS,
    Categorical,
    Const,
    Double,
    HParam,
    Int,
    Log,
    assemble,
    grid_points,
    grid_size,
    grid_values,
    leaves,
    sample_hparams,
)
from assay.config._length import UNBOUNDED_LENGTH, Length, LengthUnit
from assay.config._limits import (
    MAX_CONFIG_DEPTH,
    MAX_DESCRIPTION_CHARS,
    MAX_LABEL_CHARS,
    MAX_LABELS,
    MAX_METRIC_NAME_CHARS,
    MAX_NAME_CHARS,
    METRIC_NAMES_PER_TRIAL,
    name_problem,
    text_problems,
    value_problems,
)
from assay.config._merge import merge
from assay.config._pbt import PBTSpec, pbt_spec
from assay.config._schema import (
    ExperimentConfig,
    load_config,
    parse_config,
    searcher_in_batches,
)
from assay.config._search import (
    BracketPreview,
    BracketSpec,
    Preview,
    RoundPreview,
    RungPreview,
    SearchSpec,
    divide,
    preview,
    rung_lengths,
    search_spec,
)
from assay.config._searcher_config import Divisor, Objective, SearcherConfig, parse_objectives
from assay.config._sections import (
    MAX_WEIGHT,
    MIN_WEIGHT,
    CheckpointStorageConfig,
    FSDPConfig,
    OptimizationsConfig,
    Precision,
    ResourcesConfig,
    StrategyName,
)
from assay.config._size import format_size, parse_memory, parse_size

__all__ = [
    "MAX_CONFIG_DEPTH",
    "MAX_DESCRIPTION_CHARS",
    "MAX_GRID_POINTS",
    "MAX_LABELS",
    "MAX_LABEL_CHARS",
    "MAX_METRIC_NAME_CHARS",
    "MAX_NAME_CHARS",
    "MAX_WEIGHT",
    "MIN_WEIGHT",
    "METRIC_NAMES_PER_TRIAL",
    "UNBOUNDED_LENGTH",
    "BracketPreview",
    "BracketSpec",
    "Categorical",
    "CheckpointStorageConfig",
    "Const",
    "Divisor",
    "Double",
    "ExperimentConfig",
    "FSDPConfig",
    "HParam",
    "Int",
    "Length",
    "LengthUnit",
    "Log",
    "OptimizationsConfig",
    "PBTSpec",
    "Precision",
    "Preview",
    "ResourcesConfig",
    "RoundPreview",
    "RungPreview",
    "SearchSpec",
    "Objective",
    "SearcherConfig",
    "StrategyName",
    "assemble",
    "divide",
    "environment_of",
    "format_size",
    "grid_points",
    "grid_size",
    "grid_values",
    "leaves",
    "load_config",
    "merge",
    "name_problem",
    "text_problems",
    "value_problems",
    "parse_memory",
    "parse_objectives",
    "parse_size",
    "parse_config",
    "pbt_spec",
    "preview",
    "rung_lengths",
    "sample_hparams",
    "search_spec",
    "searcher_in_batches",
]
