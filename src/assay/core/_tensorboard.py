"""`core.train.get_tensorboard_path()`: where a script writes TensorBoard event files that
are kept with its trial, as the Trial API's are.

On shared_fs (and off the cluster) the directory is in the checkpoint storage itself,
`<storage>/tensorboard/trial-<id>`, so the files are kept as they are written. On object
storage it is a local directory whose files are uploaded to `tensorboard/trial-<id>` with
every checkpoint the chief stores and when the context closes (`assay trial
download-tensorboard` fetches them). Ranks other than the chief write to a `rank-<n>`
subdirectory, so their files never collide with the chief's.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

from assay.common.storage import (
    TENSORBOARD,
    SharedFSStorage,
    StorageError,
    StorageManager,
    tensorboard_name,
)

log = logging.getLogger("assay")


class TensorBoardFiles:
    """One process's TensorBoard directory, and its upload to object storage."""

    def __init__(self, storage: StorageManager, *, trial_id: int, rank: int) -> None:
        self._storage = storage
        self._name = Path(tensorboard_name(trial_id))
        if rank != 0:
            self._name = self._name / f"rank-{rank}"
        self._scratch: Path | None = None  # object storage: made when first asked for

    @property
    def _top(self) -> Path:
        """The directory standing for the storage's `tensorboard/`."""
        if isinstance(self._storage, SharedFSStorage):
            return self._storage.root
        if self._scratch is None:
            self._scratch = Path(tempfile.mkdtemp(prefix="assay-tensorboard-"))
        return self._scratch

    def path(self) -> Path:
        """This process's directory (created)."""
        path = self._top / self._name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def sync(self) -> None:
        """Upload the event files written so far (object storage only; a failure is
        logged, not raised: training goes on)."""
        upload_part = getattr(self._storage, "upload_part", None)
        if self._scratch is None or upload_part is None:
            return
        try:
            upload_part(self._scratch / TENSORBOARD, TENSORBOARD)
        except StorageError as e:
            log.warning("TensorBoard files were not uploaded: %s", e)

    def close(self) -> None:
        """The last upload; then object storage's local copy is removed."""
        self.sync()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None


__all__ = ["TensorBoardFiles"]
