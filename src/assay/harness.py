"""What the SDK and the CLI use of the harness, beyond the user's API in `assay`.

The harness's modules are private to the user library; the `assay` command and the
`assay.client` SDK stand on it through these names only (the layering contract in
`.importlinter` holds them to it):

- checkpoints as the harness writes them: `verify_checkpoint` (the manifest's sizes and
  digests), `CheckpointError`, and the models a Trial's checkpoint carries
  (`MODELS_FILE`, `load_models`);
- a trial's code: `load_trial_class` (an entrypoint to its class) and
  `entrypoint_problem` (what is wrong with an entrypoint, before anything runs);
- a failure in user code as the harness reports it: `user_frame`, `describe` and
  `show_tracebacks`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from assay._checkpoint import CheckpointError, verify_checkpoint
from assay._checkpoint_models import MODELS_FILE, load_models

if TYPE_CHECKING:
    from assay._loader import load_trial_class
    from assay._precheck import entrypoint_problem
    from assay._user_frame import describe, user_frame
    from assay._worker import show_tracebacks

# These import torch and the trial machinery: loaded on first use, so that the CLI and
# the SDK start without them.
_LAZY = {
    "load_trial_class": "assay._loader",
    "entrypoint_problem": "assay._precheck",
    "describe": "assay._user_frame",
    "user_frame": "assay._user_frame",
    "show_tracebacks": "assay._worker",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "MODELS_FILE",
    "CheckpointError",
    "describe",
    "entrypoint_problem",
    "load_models",
    "load_trial_class",
    "show_tracebacks",
    "user_frame",
    "verify_checkpoint",
]
