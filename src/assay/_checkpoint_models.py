"""The models of a Trial's checkpoint: `models.pt`, one `state_dict` per model the Trial
wrapped with `context.wrap_model`, in the order it wrapped them; or, for a sharded
checkpoint (FSDP's), the same full state_dicts gathered from its shards in this process.

Both `load_checkpoint` and the Trainer's `load_trial_from_checkpoint_path` read them here.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from assay._checkpoint import CheckpointError, load_file

MODELS_FILE = "models.pt"


def load_models(path: Path) -> list[dict[str, Any]]:
    """The full state_dict of each model in checkpoint `path` (already verified): from
    `models.pt`, else gathered from its sharded checkpoints (none: empty)."""
    if (path / MODELS_FILE).is_file():
        loaded = load_file(path, "models")
        if not isinstance(loaded, list) or not all(isinstance(m, Mapping) for m in loaded):
            raise CheckpointError(f"{path / MODELS_FILE} is not a list of state_dicts")
        return [dict(m) for m in loaded]
    from assay.strategy import sharded_parts, to_full_state_dict

    return [dict(to_full_state_dict(part)["model"]) for part in sharded_parts(path)]
