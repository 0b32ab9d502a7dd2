"""Use a trained model: `assay.load_checkpoint(uuid_or_path)`.

A Trial's checkpoint is a directory: `metadata.json` (every file's size and sha256, the
trial's hyperparameters, its batch count) and `models.pt`, one `state_dict` per model
the Trial wrapped with `context.wrap_model`, in the order it wrapped them, saved with
`torch.save` and loaded with `weights_only=True`; a sharded checkpoint (FSDP's, through
`torch.distributed.checkpoint`) gives the same full state_dicts, gathered from its shards
in this one process. `load_checkpoint` checks the files
against the sha256s the master recorded for them (a UUID) or the manifest (a directory)
and returns those states with the metadata; `load_trial` rebuilds your Trial around them
for inference.

A UUID is looked up at the master (`master=`, else ASSAY_MASTER, else the SDK's default:
the running `assay deploy local up` cluster's, else 127.0.0.1:8090) with the CLI's stored
login: a `shared_fs` checkpoint is read where its path is mounted on this machine, an `s3`
one is downloaded into `cache_dir` (default `~/.cache/assay/checkpoints`) once.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from assay.errors import AssayError
from assay.harness import MODELS_FILE, CheckpointError, load_models, verify_checkpoint

from ._address import master_address
from ._api import Client
from ._fetch import download_checkpoint

if TYPE_CHECKING:
    from assay import Trial

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.I)


@dataclass(frozen=True)
class LoadedCheckpoint:
    """A verified checkpoint: where it is, what trained it, and its models' weights."""

    path: Path
    uuid: str
    trial_id: int
    total_batches: int
    hparams: dict[str, Any]
    # The Trial's models' state_dicts (on the CPU), in the order it wrapped them (full
    # ones, from a sharded checkpoint too); empty for a checkpoint written by a script
    # through the Core API that holds no sharded checkpoint (read `path` instead).
    models: list[dict[str, Any]]
    # What a Core API script passed as `metadata` when it stored the checkpoint.
    user_metadata: dict[str, Any]

    def load_trial(self, trial_class: type[Trial], **trial_kwargs: Any) -> Trial:
        """`trial_class` built with the checkpoint's hyperparameters on the CPU, one slot,
        with every wrapped model's weights loaded and in eval mode; `trial_kwargs` are
        passed to its constructor after the context."""
        from assay.pytorch import load_trial_from_checkpoint_path

        if not self.models:
            raise CheckpointError(
                f"checkpoint {self.uuid} holds no {MODELS_FILE}: it was not written by a Trial"
            )
        return load_trial_from_checkpoint_path(self.path, trial_class, trial_kwargs or None)


def load_checkpoint(
    source: str | os.PathLike[str],
    *,
    master: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> LoadedCheckpoint:
    """Load checkpoint `source`: a checkpoint directory, or a checkpoint's UUID."""
    path = Path(source).expanduser()
    recorded: dict[str, str] | None = None
    if not path.is_dir():
        if not _UUID.fullmatch(str(source)):
            raise AssayError(
                f"{source} is neither a checkpoint directory nor a checkpoint UUID "
                "(`assay checkpoint list EXP_ID` lists them)"
            )
        path, recorded = _resolve(str(source).lower(), master, cache_dir)
    metadata = verify_checkpoint(path, recorded)
    models = load_models(path)
    return LoadedCheckpoint(
        path=path,
        uuid=metadata.uuid,
        trial_id=metadata.trial_id,
        total_batches=metadata.total_batches,
        hparams=dict(metadata.hparams),
        models=models,
        user_metadata=dict(metadata.user_metadata),
    )


def _resolve(
    uuid: str, master: str | None, cache_dir: str | os.PathLike[str] | None
) -> tuple[Path, dict[str, str] | None]:
    """A directory holding checkpoint `uuid` (where it is mounted, else a verified copy),
    and the sha256s the master recorded for its files (None: it recorded none)."""
    api = Client(master_address(master))
    try:
        record = api.get_checkpoint(uuid)
        sha = {f.name: f.sha256 for f in record.files}
        recorded = sha if sha and all(sha.values()) else None
        location = record.location
        if location and "://" not in location and Path(location).is_dir():
            return Path(location), recorded
        root = Path(cache_dir) if cache_dir else Path.home() / ".cache" / "assay" / "checkpoints"
        target = root / uuid
        if not (target / "metadata.json").is_file():
            download_checkpoint(api, uuid, target)
        return target, recorded
    finally:
        api.close()
