"""Assay: train PyTorch models on your own machines, one Trial class at a time.

    from assay import Trial, TrialContext

Torch-dependent names are imported on first use, so `import assay` (and the CLI) stay fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from assay.errors import (
    AssayError,
    HyperparameterError,
    InvalidConfigError,
    InvalidHP,
    TrainingError,
    TrialLoadError,
)

if TYPE_CHECKING:
    from assay._context import StepMode, TrialContext
    from assay._distributed import DistributedContext
    from assay._local import run_local
    from assay._trial import MetricReducer, Reducer, Trial
    from assay.common.spec import LocalResult
    from assay.core import get_cluster_info

__version__ = "0.1.0"
# Determined's `det.LOG_FORMAT`, for `logging.basicConfig(format=assay.LOG_FORMAT)`.
LOG_FORMAT = "%(levelname)s: [%(process)s] %(name)s: %(message)s"

_LAZY = {
    "Trial": "assay._trial",
    "Reducer": "assay._trial",
    "MetricReducer": "assay._trial",
    "TrialContext": "assay._context",
    "StepMode": "assay._context",
    "DistributedContext": "assay._distributed",
    "run_local": "assay._local",
    # The SDK's: a UUID is looked up at the master.
    "load_checkpoint": "assay.client",
    "get_cluster_info": "assay.core",
    "LocalResult": "assay.common.spec",
}


def __getattr__(name: str) -> Any:
    if name == "pytorch":  # Determined's Trainer API: `from assay import pytorch`
        return importlib.import_module("assay.pytorch")
    if name == "core":  # `import assay` then `assay.core.init()`
        return importlib.import_module("assay.core")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'assay' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | {"pytorch"})


__all__ = [
    "LOG_FORMAT",
    "AssayError",
    "DistributedContext",
    "HyperparameterError",
    "InvalidConfigError",
    "InvalidHP",
    "LocalResult",
    "MetricReducer",
    "Reducer",
    "StepMode",
    "Trial",
    "TrialContext",
    "TrainingError",
    "TrialLoadError",
    "__version__",
    "get_cluster_info",
    "run_local",
]
