"""`core.checkpoint`: directories the script fills, stored as checkpoints of its trial.

`with core.checkpoint.store_path(metadata) as (path, uuid):` gives the chief an empty
directory; whatever it holds when the block ends becomes checkpoint `uuid` in the
experiment's `checkpoint_storage` (shared_fs or S3), with a `metadata.json` manifest
listing every file with its size and sha256, renamed into place (or uploaded, manifest
last) only once complete, then reported to the master. With `shard=True` every process
calls it together, writes its own files, and they become one checkpoint (two processes
writing the same file name is an error). `save_sharded(model, optimizer)` and
`load_sharded(uuid, model, optimizer)` store and restore a model's shards that way
(`torch.distributed.checkpoint`; any world size on restore). `restore_path(uuid)` gives
the directory back, verified against the sha256s the master recorded for it (the trial's
latest checkpoint) or else its manifest. Off the cluster checkpoints live under `./checkpoints`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from assay._backend import Backend, LocalBackend
from assay._checkpoint import (
    MANIFEST,
    CheckpointError,
    CheckpointMetadata,
    FileEntry,
    check_writable,
    file_entries,
    new_uuid,
    read_metadata,
    seal_checkpoint,
    verify_checkpoint,
)
from assay.common.archive import make_local_output_dir
from assay.common.storage import SharedFSStorage, StorageError, StorageManager, checkpoint_uuid
from assay.core._distributed import DistributedContext

log = logging.getLogger("assay")


class CheckpointContext:
    """See the module docstring."""

    def __init__(
        self,
        distributed: DistributedContext,
        backend: Backend | None,
        storage: StorageManager,
        *,
        trial_id: int,
        hparams: Mapping[str, Any],
        steps: Callable[[], int],
        restore_roots: Sequence[Path] = (),
        after_store: Callable[[], None] = lambda: None,
        recorded: Mapping[str, Mapping[str, str]] | None = None,
        mark_root: bool = False,
        storage_fix: str | None = None,
    ) -> None:
        """`steps`: the latest steps_completed reported, for metadata that gives none;
        `restore_roots`: more directories to look for checkpoints in (run-local's
        --resume-from); `after_store`: called on the chief once a checkpoint is stored
        and reported (the TensorBoard files' upload); `recorded`: by uuid, the sha256s
        the master recorded for a checkpoint's files (the one the trial restores), which
        `restore_path` verifies it against instead of its own manifest; `mark_root`: the
        storage's directory is a plain run's default `./checkpoints`, created at the first
        checkpoint marked as a local run's output (left out of the model's archive);
        `storage_fix`: on a cluster, what to change when the storage's directory cannot be
        written (checked at the first checkpoint, naming the setting)."""
        self._dist = distributed
        self._backend = backend
        self._storage = storage
        self._trial_id = trial_id
        self._hparams = dict(hparams)
        self._steps = steps
        self._restore_roots = list(restore_roots)
        self._after_store = after_store
        self._recorded = dict(recorded or {})
        self._mark_root = mark_root
        self._storage_fix = storage_fix

    # --- storing ------------------------------------------------------------------------

    @contextlib.contextmanager
    def store_path(
        self, metadata: Mapping[str, Any] | None = None, *, shard: bool = False
    ) -> Iterator[tuple[Path, str]]:
        """A directory to write a checkpoint into, and the checkpoint's uuid."""
        if not shard and not self._dist.is_chief:
            raise RuntimeError(
                f"store_path(shard=False) was called on rank {self._dist.rank}: only the "
                "chief (rank 0) stores an unsharded checkpoint; pass shard=True to let "
                "every process write its own files"
            )
        uuid = new_uuid() if self._dist.is_chief else ""
        if shard:
            uuid = self._dist.broadcast(uuid)
        scratch = None if self._in_place else Path(tempfile.mkdtemp(prefix="assay-ckpt-"))
        parent = self._root if scratch is None else scratch
        merged = parent / f".tmp-{uuid}"
        own = merged if not shard else parent / f".tmp-{uuid}.rank{self._dist.rank}"
        if self._mark_root and scratch is None:  # once: the first checkpoint makes it
            make_local_output_dir(self._root)
            self._mark_root = False
        if self._storage_fix is not None and scratch is None:
            check_writable(self._root, self._storage_fix)  # names the setting, then no more
            self._storage_fix = None
        try:
            own.mkdir(parents=True)
            if shard and self._dist.is_chief:
                merged.mkdir(parents=True, exist_ok=True)
            try:
                yield own, uuid
            except BaseException:
                if shard:
                    self._dist.any(True)  # the others learn it at their vote below
                raise
            if not shard:
                self._seal(merged, uuid, metadata, {})
                return
            # Every step below ends in a vote, so that all processes fail together (none is
            # left waiting in a collective the others never reach).
            if self._dist.any(False):
                raise CheckpointError(
                    f"sharded checkpoint {uuid}: another process failed while writing its "
                    "files; nothing was stored"
                )
            extra = self._merge_shards(own, merged, uuid)
            failure: BaseException | None = None
            if self._dist.is_chief:
                try:
                    self._seal(merged, uuid, metadata, extra)
                except BaseException as e:
                    failure = e
                    if extra_uploaded(self._storage):
                        with contextlib.suppress(Exception):
                            self._storage.delete(uuid)  # the shards the others uploaded
            if self._dist.any(failure is not None):
                raise failure or CheckpointError(
                    f"sharded checkpoint {uuid}: the chief could not store it (see its log)"
                )
        finally:
            shutil.rmtree(own, ignore_errors=True)
            if self._dist.is_chief:
                shutil.rmtree(merged, ignore_errors=True)  # renamed away when it succeeded
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)

    def upload(
        self,
        ckpt_dir: str | os.PathLike[str] | None,
        metadata: Mapping[str, Any] | None = None,
        *,
        shard: bool = False,
    ) -> str:
        """Store a copy of `ckpt_dir` as a new checkpoint; return its uuid. The manifest
        of a downloaded checkpoint in it is left out (the new one gets its own)."""
        with self.store_path(metadata, shard=shard) as (path, uuid):
            if ckpt_dir is not None:
                shutil.copytree(ckpt_dir, path, dirs_exist_ok=True)
                manifest = path / MANIFEST
                if manifest.is_file() and _is_manifest(manifest):
                    manifest.unlink()
        return uuid

    def save_sharded(
        self,
        model: Any,
        optimizer: Any = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> str:
        """Store `model` (and `optimizer`) as a sharded checkpoint: every process calls it
        together and writes only the shards it holds (`torch.distributed.checkpoint`);
        return the checkpoint's uuid. It restores onto any number of processes, under
        FSDP, DDP or none (`load_sharded`)."""
        from assay.strategy import save_sharded, strategy_of

        with self.store_path(metadata, shard=True) as (path, uuid):
            save_sharded(
                path,
                model,
                optimizer,
                rank=self._dist.rank,
                world_size=self._dist.size,
                strategy=strategy_of(model),
            )
        return uuid

    def load_sharded(self, storage_id: str, model: Any, optimizer: Any = None) -> None:
        """Load sharded checkpoint `storage_id` into `model` (and `optimizer`) as they are
        wrapped now, verified first; every process calls it together."""
        from assay.strategy import load_sharded

        with self.restore_path(storage_id) as path:
            load_sharded(path, model, optimizer)

    @property
    def _in_place(self) -> bool:
        return isinstance(self._storage, SharedFSStorage)

    @property
    def _root(self) -> Path:
        assert isinstance(self._storage, SharedFSStorage)
        return self._storage.root

    def _merge_shards(self, own: Path, merged: Path, uuid: str) -> dict[str, FileEntry]:
        """Put every process's files into one checkpoint; return the entries of the files
        stored by other processes (object storage), for the chief's manifest."""
        mine = file_entries(own)
        everyone = self._dist.allgather(mine)
        seen: dict[str, int] = {}
        for rank, entries in enumerate(everyone):
            for name in entries:
                if name in seen:
                    raise CheckpointError(
                        f"sharded checkpoint {uuid}: ranks {seen[name]} and {rank} both wrote "
                        f"{name!r}; give each process its own file names (e.g. with its rank)"
                    )
                seen[name] = rank
        if MANIFEST in seen:
            raise CheckpointError(
                f"a checkpoint may not hold its own {MANIFEST}: Assay writes it (the "
                "manifest); name that file differently"
            )
        failure: BaseException | None = None
        try:
            if self._in_place:
                for name in mine:
                    target = merged / name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(own / name, target)
            elif self._dist.is_chief:
                shutil.copytree(own, merged, dirs_exist_ok=True)
            else:
                upload_part = getattr(self._storage, "upload_part", None)
                if upload_part is None:
                    raise CheckpointError(f"{self._storage!r} cannot store sharded checkpoints")
                upload_part(own, uuid)
        except BaseException as e:
            failure = e
        if self._dist.any(failure is not None):  # also: every part is in place
            raise failure or CheckpointError(
                f"sharded checkpoint {uuid}: another process could not store its files"
            )
        if self._in_place:
            return {}
        others = everyone[1:]
        return {name: entry for entries in others for name, entry in entries.items()}

    def _seal(
        self,
        staging: Path,
        uuid: str,
        metadata: Mapping[str, Any] | None,
        extra: dict[str, FileEntry],
    ) -> None:
        user = dict(metadata or {})
        steps = user.get("steps_completed")
        total = int(steps) if isinstance(steps, int) and not isinstance(steps, bool) else None
        record = CheckpointMetadata(
            uuid=uuid,
            total_batches=self._steps() if total is None else total,
            epoch=0,
            batch_in_epoch=0,
            world_size=self._dist.size,
            trial_id=self._trial_id,
            hparams=self._hparams,
            user_metadata=user,
            kind="core",
        )
        final = staging.parent / uuid
        try:
            seal_checkpoint(staging, final, record, extra)
            location = self._storage.upload(final, uuid)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            if not self._in_place:
                shutil.rmtree(final, ignore_errors=True)
            raise
        assert self._backend is not None
        self._backend.report_checkpoint(record, location)
        self._after_store()

    # --- reading ------------------------------------------------------------------------

    @contextlib.contextmanager
    def restore_path(self, storage_id: str, selector: Any = None) -> Iterator[Path]:
        """Checkpoint `storage_id` as a local directory, verified against the master's
        record of it (the trial's latest checkpoint on a cluster) or else its manifest
        (for the length of the block; object storage is downloaded to a temporary one)."""
        uuid = _uuid(storage_id)
        recorded = self._recorded.get(uuid)
        for root in self._local_roots():
            path = root / uuid
            if (path / MANIFEST).is_file():
                verify_checkpoint(path, recorded)
                yield path
                return
        if self._in_place:
            where = ", ".join(str(r) for r in self._local_roots())
            raise CheckpointError(f"checkpoint {uuid} is not in {where}")
        scratch = Path(tempfile.mkdtemp(prefix="assay-restore-"))
        try:
            target = scratch / uuid
            try:
                self._storage.download(uuid, target)
            except StorageError as e:
                raise CheckpointError(f"checkpoint {uuid} cannot be downloaded: {e}") from None
            if not (target / MANIFEST).is_file():
                raise CheckpointError(f"checkpoint {uuid} is not in {self._storage!r}")
            verify_checkpoint(target, recorded)
            yield target
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def download(
        self, storage_id: str, ckpt_dir: str | os.PathLike[str], selector: Any = None
    ) -> None:
        """Copy checkpoint `storage_id` into `ckpt_dir`."""
        with self.restore_path(storage_id) as path:
            shutil.copytree(path, ckpt_dir, dirs_exist_ok=True)

    def get_metadata(self, storage_id: str) -> dict[str, Any]:
        """The metadata the checkpoint was stored with (and its `steps_completed`)."""
        uuid = _uuid(storage_id)
        for root in self._local_roots():
            if (root / uuid / MANIFEST).is_file():
                return _user_metadata(read_metadata(root / uuid))
        with self.restore_path(uuid) as path:
            return _user_metadata(read_metadata(path))

    def delete(self, storage_id: str) -> None:
        """Delete checkpoint `storage_id` of this trial (on a cluster, the master does)."""
        uuid = _uuid(storage_id)
        if not self._dist.is_chief or self._backend is None:
            raise RuntimeError("only the chief (rank 0) deletes checkpoints")
        if isinstance(self._backend, LocalBackend):
            if not self._storage.delete(uuid):
                raise CheckpointError(f"checkpoint {uuid} is not in {self._storage!r}")
            return
        self._backend.delete_checkpoints([uuid])

    def _local_roots(self) -> list[Path]:
        roots = [self._root] if self._in_place else []
        return roots + self._restore_roots


def extra_uploaded(storage: StorageManager) -> bool:
    """Whether other processes' shards went straight to `storage` (object storage)."""
    return not isinstance(storage, SharedFSStorage)


def _is_manifest(path: Path) -> bool:
    try:
        read_metadata(path.parent)
    except CheckpointError:
        return False
    return True


def _uuid(storage_id: str) -> str:
    try:
        return checkpoint_uuid(str(storage_id))
    except StorageError as e:
        raise CheckpointError(str(e)) from None


def _user_metadata(record: CheckpointMetadata) -> dict[str, Any]:
    metadata = dict(record.user_metadata)
    metadata.setdefault("steps_completed", record.total_batches)
    return metadata


__all__ = ["CheckpointContext"]
