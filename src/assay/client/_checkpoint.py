"""`Checkpoint`: a stored checkpoint, to download or to load back into its Trial."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from assay.errors import AssayError

from . import _records as fmt

if TYPE_CHECKING:
    from assay import Trial as UserTrial
    from assay.proto import common_pb2

    from ._api import Client

# (master address, experiment id) -> where its model definition was unpacked, once per
# process: importing a Trial may import more of its files later, so they stay.
_MODEL_DIRS: dict[tuple[str, int], Path] = {}


class UntrustedCodeError(AssayError):
    """`load()` would import and run model code that another user uploaded: pass
    `trust=True` to run it, or give your own Trial class."""


class Checkpoint:
    """A checkpoint as the master recorded it."""

    def __init__(self, api: Client, record: common_pb2.Checkpoint) -> None:
        self._api = api
        self._record = record

    def __repr__(self) -> str:
        return f"Checkpoint(uuid={self.uuid!r}, trial_id={self.trial_id})"

    @property
    def uuid(self) -> str:
        return str(self._record.uuid)

    @property
    def trial_id(self) -> int:
        return int(self._record.trial_id)

    @property
    def experiment_id(self) -> int:
        return int(self._record.experiment_id)

    @property
    def total_batches(self) -> int:
        """How many batches its trial had trained when it was taken."""
        return int(self._record.total_batches)

    @property
    def state(self) -> str:
        """COMPLETED, or DELETED once removed from storage."""
        return fmt.checkpoint_state(self._record.state)

    @property
    def location(self) -> str:
        """A directory (shared_fs) or s3://bucket/prefix."""
        return str(self._record.location)

    @property
    def metadata(self) -> dict[str, Any]:
        """What a Core API script stored with it (`metadata=`); empty for a Trial's."""
        return fmt.struct(self._record.user_metadata)

    @property
    def validation_metrics(self) -> dict[str, float]:
        """The validation metrics reported at its batch count (empty if none were)."""
        return dict(self._record.validation_metrics)

    def download(self, path: str | os.PathLike[str] | None = None) -> Path:
        """Copy its files into `path` (new or empty; default ./checkpoints/UUID),
        verifying each file's size and sha256, and return the directory."""
        from ._fetch import download_checkpoint

        target = Path(path) if path is not None else Path("checkpoints") / self.uuid
        download_checkpoint(self._api, self.uuid, target)
        return target

    def load(
        self,
        trial_class: type[UserTrial] | None = None,
        *,
        trust: bool = False,
        **trial_kwargs: Any,
    ) -> UserTrial:
        """Its Trial, built on the CPU with the checkpoint's hyperparameters, every
        wrapped model's weights loaded, in eval mode: `trial.model(x)` predicts.

        `trial_class` None: the class the experiment's `entrypoint` names, imported from
        the model definition the experiment was created with, which runs that code in
        this process: when another user owns the experiment (and so uploaded the code),
        it is refused with `UntrustedCodeError`, naming them, unless `trust=True`.
        Weights alone run no code (they load with `weights_only=True`): your own
        `trial_class` needs no trust. `trial_kwargs` go to the Trial's constructor after
        the context. A shared_fs checkpoint is read where it is mounted, if it is;
        otherwise it is downloaded to a temporary directory first."""
        from assay.harness import verify_checkpoint
        from assay.pytorch import load_trial_from_checkpoint_path

        if trial_class is None:
            trial_class = self._trial_class(trust)
        path, recorded = self._local_copy()
        verify_checkpoint(path, recorded)
        return load_trial_from_checkpoint_path(path, trial_class, trial_kwargs or None)

    def _local_copy(self) -> tuple[Path, dict[str, str] | None]:
        sha = {f.name: f.sha256 for f in self._record.files}
        recorded = sha if sha and all(sha.values()) else None
        location = self.location
        if location and "://" not in location and Path(location).is_dir():
            return Path(location), recorded
        target = Path(tempfile.mkdtemp(prefix=f"assay-{self.uuid[:8]}-")) / "checkpoint"
        return self.download(target), recorded

    def _trial_class(self, trust: bool) -> type[UserTrial]:
        from assay.common.archive import unpack_model_dir
        from assay.harness import load_trial_class

        experiment = self._api.get_experiment(self.experiment_id).experiment
        entrypoint = fmt.struct(experiment.config).get("entrypoint")
        if not isinstance(entrypoint, str) or ":" not in entrypoint or " " in entrypoint:
            raise AssayError(
                f"experiment {self.experiment_id}'s entrypoint {entrypoint!r} is a command, "
                "not a Trial class: load the files with Checkpoint.download() instead"
            )
        if not trust:
            self._refuse_foreign_code(str(experiment.owner), entrypoint)
        key = (self._api.address, self.experiment_id)
        model_dir = _MODEL_DIRS.get(key)
        if model_dir is None:
            model_dir = Path(tempfile.mkdtemp(prefix=f"assay-exp{self.experiment_id}-")) / "model"
            unpack_model_dir(self._api.get_model_definition(self.experiment_id), model_dir)
            _MODEL_DIRS[key] = model_dir
        return load_trial_class(model_dir, entrypoint)

    def _refuse_foreign_code(self, owner: str, entrypoint: str) -> None:
        """`UntrustedCodeError` unless the caller is `owner`, who uploaded the code."""
        me = str(self._api.who_am_i().username)
        if owner == me:
            return
        raise UntrustedCodeError(
            f"checkpoint {self.uuid} comes from experiment {self.experiment_id} of {owner}: "
            f"loading it imports {owner}'s model code ({entrypoint}) and runs it in this "
            f"process as {me}. If you trust {owner}'s code, pass trust=True "
            "(load(trust=True)); or pass a Trial class of your own "
            "(load(trial_class=YourTrial)), which loads the weights alone"
        )


def best_checkpoints(
    found: Sequence[Checkpoint], n: int, metric: str, smaller: bool, owner: str
) -> list[Checkpoint]:
    """The `n` of `found` with the best `metric`, best first (ties: fewer batches first)."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    scored = [c for c in found if metric in c.validation_metrics]
    if not scored:
        raise AssayError(
            f"no checkpoint of {owner} has a validation {metric}"
            + ("" if found else " (it has no checkpoints)")
        )

    def key(c: Checkpoint) -> tuple[float, int]:
        value = c.validation_metrics[metric]
        return (value if smaller else -value, c.total_batches)

    return sorted(scored, key=key)[:n]
