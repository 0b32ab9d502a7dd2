"""`shared_fs` checkpoint storage: a directory every machine mounts at the same path.

The harness writes checkpoints straight into it, so `upload` of a checkpoint already in
place is a no-op; copies and deletions go through a temporary name, so a checkpoint that is
half there never looks complete.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from assay.common.storage._base import MANIFEST, StorageError, safe_name


class SharedFSStorage:
    """Checkpoints as directories `root/<uuid>` on a filesystem shared by every machine."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"SharedFSStorage({str(self.root)!r})"

    def _dir(self, uuid: str) -> Path:
        if safe_name(uuid).name != uuid:
            raise StorageError(f"{uuid!r} is not a checkpoint uuid")
        return self.root / uuid

    def location(self, uuid: str) -> str:
        return str(self._dir(uuid))

    def upload(self, local_dir: Path, uuid: str) -> str:
        final = self._dir(uuid)
        if final.exists() and final.resolve() == Path(local_dir).resolve():
            return str(final)  # written in place by the harness
        tmp = self.root / f".tmp-{uuid}"
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            self.root.mkdir(parents=True, exist_ok=True)
            shutil.copytree(local_dir, tmp)
            os.replace(tmp, final)
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise StorageError(f"cannot store checkpoint {uuid} in {self.root}: {e}") from None
        return str(final)

    def download(self, uuid: str, local_dir: Path) -> None:
        source = self._dir(uuid)
        if not source.is_dir():
            raise StorageError(f"checkpoint {uuid} is not in {self.root}")
        try:
            shutil.copytree(source, local_dir, dirs_exist_ok=True)
        except OSError as e:
            raise StorageError(f"cannot copy checkpoint {uuid} from {source}: {e}") from None

    def delete(self, uuid: str) -> bool:
        path = self._dir(uuid)
        # Renamed away first, so that a deletion cut short leaves no half checkpoint that
        # looks like one; a later run finishes it.
        doomed = self.root / f".deleting-{uuid}"
        try:
            os.rename(path, doomed)
        except FileNotFoundError:
            if not doomed.exists():
                return False
        except OSError as e:
            raise StorageError(f"cannot delete checkpoint {uuid} at {path}: {e}") from None
        try:
            shutil.rmtree(doomed)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise StorageError(f"cannot delete checkpoint {uuid} at {doomed}: {e}") from None
        return True

    def exists(self, uuid: str) -> bool:
        return (self._dir(uuid) / MANIFEST).is_file()


__all__ = ["SharedFSStorage"]
