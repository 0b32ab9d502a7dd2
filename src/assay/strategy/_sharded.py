"""Sharded checkpoints: every rank writes only its own shards, and any world reads them.

`save_sharded` writes a model's (and optimizer's) state through
`torch.distributed.checkpoint` (DCP): each rank writes the shards it holds (`__R_N.distcp`
files), the coordinator writes DCP's `.metadata`, and then the chief writes `shards.json`,
the shard manifest: every file with its size and sha256, the world size and the strategy
that wrote it. Until `shards.json` is there the directory is not a sharded checkpoint.

`load_sharded` loads one onto whatever the current process runs: a different number of
ranks (2 -> 1, 2 -> 4), another strategy (FSDP -> DDP) or one plain process without a
process group. DCP reshards on load. Every file is checked against `shards.json` before
it is read, and nothing in it runs code when it is read: tensors and the optimizer's
plain values load with `weights_only=True`, DCP's `.metadata` through an unpickler that
builds only DCP's own metadata classes.

`to_full_state_dict` gives `{"model": ..., "optimizer": ...}`, a plain state dict, from a
sharded checkpoint in one process: what a user hands on. The optimizer's part is keyed by
parameter names (`torch.distributed.checkpoint.state_dict`'s form), which
`set_optimizer_state_dict` loads.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import io
import json
import os
import pickle
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import (
    DefaultLoadPlanner,
    _EmptyStateDictLoadPlanner,
)
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import (
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
)
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict, load
from torch.distributed.checkpoint.state_dict_saver import save
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from assay._checkpoint import CheckpointError, FileEntry

SHARD_MANIFEST = "shards.json"
FULL_STATE_DICT = "full_state_dict.pt"
DCP_METADATA = ".metadata"
SHARD_FORMAT = "torch.distributed.checkpoint"
SHARD_FORMAT_VERSION = 1


def is_sharded(directory: Path) -> bool:
    """Whether `directory` holds a complete sharded checkpoint (its shard manifest)."""
    return (Path(directory) / SHARD_MANIFEST).is_file()


Optimizers = torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None
"""One optimizer, several (each over its own parameters of the model), or none."""


def save_sharded(
    directory: Path,
    model: torch.nn.Module,
    optimizer: Optimizers,
    *,
    rank: int,
    world_size: int,
    strategy: str,
) -> dict[str, FileEntry]:
    """Write this rank's shards of `model` (and `optimizer`) into `directory`; every rank
    calls it together. `directory` may be shared by the ranks or each rank's own (the
    files' names never collide); the chief's holds the manifest, written last. When it
    returns on any rank, the manifest is written. Returns the files this rank wrote (the
    manifest aside) with their sizes and sha256s."""
    directory = Path(directory)
    _check_world(rank, world_size)
    if (directory / SHARD_MANIFEST).exists():
        raise CheckpointError(
            f"{directory} already holds a sharded checkpoint ({SHARD_MANIFEST}); write each "
            "checkpoint into a new directory"
        )
    directory.mkdir(parents=True, exist_ok=True)
    state = _live_state(model, optimizer)
    writer = _RecordingWriter(directory)
    with _quiet():
        save(state, storage_writer=writer, no_dist=world_size == 1)
    mine = {name: _entry(directory / name) for name in sorted(writer.written)}
    if rank == 0:
        mine[DCP_METADATA] = _entry(directory / DCP_METADATA)
    everyone: list[dict[str, FileEntry]] = [mine]
    if world_size > 1:
        everyone = [{} for _ in range(world_size)]
        dist.all_gather_object(everyone, mine)
    if rank == 0:
        files: dict[str, FileEntry] = {}
        for entries in everyone:
            files.update(entries)
        _write_manifest(
            directory,
            {
                "format": SHARD_FORMAT,
                "format_version": SHARD_FORMAT_VERSION,
                "strategy": strategy,
                "world_size": world_size,
                "contents": sorted(state),
                "torch_version": torch.__version__,
                "files": {n: {"size": e.size, "sha256": e.sha256} for n, e in files.items()},
            },
        )
    if world_size > 1:
        dist.barrier()
    return mine


def strategy_of(model: torch.nn.Module) -> str:
    """The strategy `model` is wrapped with: "fsdp", "ddp" or "single"."""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return "ddp"
    if any(isinstance(m, FSDPModule) for m in model.modules()):
        return "fsdp"
    return "single"


def load_sharded(directory: Path, model: torch.nn.Module, optimizer: Optimizers) -> None:
    """Load the sharded checkpoint in `directory` into `model` (and `optimizer`) as they
    are wrapped now (FSDP on any number of ranks, DDP, or a plain module in one process);
    every rank calls it together. A file that fails its sha256 is refused before it is
    read."""
    directory = Path(directory)
    manifest = read_shard_manifest(directory)
    contents = set(manifest["contents"])
    optimizer = _optimizers(optimizer)
    if optimizer is not None and "optimizer" not in contents:
        raise CheckpointError(
            f"sharded checkpoint {directory} holds no optimizer state; load it without an optimizer"
        )
    state = _live_state(model, optimizer)
    reader = _VerifyingReader(directory, _files(manifest, directory))
    with _refusing(directory, reader):
        load(state, storage_reader=reader, planner=_SafeLoadPlanner())
    set_state_dict(
        model,
        optimizer if optimizer is not None else [],
        model_state_dict=state["model"],
        optim_state_dict=state.get("optimizer", {}),
    )


def to_full_state_dict(directory: Path) -> dict[str, Any]:
    """The checkpoint in `directory` as one plain state dict `{"model": ..., "optimizer":
    ...}` of full tensors on the CPU, read in this process alone (no process group is
    needed, and one that exists is not used)."""
    directory = Path(directory)
    manifest = read_shard_manifest(directory)
    reader = _VerifyingReader(directory, _files(manifest, directory))
    state: dict[str, Any] = {}
    with _refusing(directory, reader):
        # `dcp.load` loads into a copy of an empty dict; this is what torch's own
        # `_load_state_dict_from_keys` calls, minus the process group.
        _load_state_dict(state, storage_reader=reader, planner=_SafeEmptyPlanner(), no_dist=True)  # type: ignore[no-untyped-call]
    return state


def sharded_parts(checkpoint: Path) -> list[Path]:
    """The sharded checkpoints in checkpoint directory `checkpoint`: itself when it is
    one, else those of its subdirectories that are, by name."""
    checkpoint = Path(checkpoint)
    if is_sharded(checkpoint):
        return [checkpoint]
    return sorted(p for p in checkpoint.iterdir() if p.is_dir() and is_sharded(p))


def write_full_state_dicts(checkpoint: Path) -> list[Path]:
    """Beside the shards of each sharded checkpoint in `checkpoint`, `full_state_dict.pt`:
    `to_full_state_dict`'s dict saved with `torch.save`; the files written."""
    written = []
    for part in sharded_parts(checkpoint):
        target = part / FULL_STATE_DICT
        tmp = part / f".{FULL_STATE_DICT}.tmp"
        torch.save(to_full_state_dict(part), tmp)
        os.replace(tmp, target)
        written.append(target)
    return written


def read_shard_manifest(directory: Path) -> dict[str, Any]:
    """`shards.json` of `directory`, checked for the fields this module relies on."""
    path = Path(directory) / SHARD_MANIFEST
    if not path.is_file():
        raise CheckpointError(
            f"{directory} is not a sharded checkpoint: it has no {SHARD_MANIFEST} (a sharded "
            "checkpoint whose writing did not finish has none)"
        )
    try:
        data = json.loads(path.read_text())
        version = int(data["format_version"])
        files = data["files"]
        if not isinstance(files, dict) or not isinstance(data["contents"], list):
            raise TypeError("files must be an object and contents a list")
        for entry in files.values():
            int(entry["size"])
            str(entry["sha256"])
    except (ValueError, TypeError, KeyError) as e:
        raise CheckpointError(f"{path} is unreadable: {e}") from None
    if version > SHARD_FORMAT_VERSION:
        raise CheckpointError(
            f"{directory} has sharded checkpoint format {version}; this Assay reads up to "
            f"{SHARD_FORMAT_VERSION}: upgrade Assay to load it"
        )
    return dict(data)


# --- state dicts ------------------------------------------------------------------------


def _optimizers(
    optimizer: Optimizers,
) -> torch.optim.Optimizer | list[torch.optim.Optimizer] | None:
    """`optimizer` as one optimizer, a list of several, or None for none at all."""
    if optimizer is None or isinstance(optimizer, torch.optim.Optimizer):
        return optimizer
    optimizers = list(optimizer)
    return optimizers or None


def _live_state(model: torch.nn.Module, optimizer: Optimizers) -> dict[str, Any]:
    """The state dicts DCP saves from and loads into: DTensor shards under FSDP, full
    tensors otherwise, keyed by the user's parameter names whatever wraps the model.
    Several optimizers' states are one, their parameter groups one after the other."""
    optimizer = _optimizers(optimizer)
    if optimizer is None:
        model_state, _ = get_state_dict(model, [], options=StateDictOptions())
        return {"model": model_state}
    model_state, optim_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optimizer": optim_state}


def _check_world(rank: int, world_size: int) -> None:
    initialized = dist.is_available() and dist.is_initialized()
    actual = (dist.get_rank(), dist.get_world_size()) if initialized else (0, 1)
    if (rank, world_size) != actual:
        raise ValueError(
            f"save_sharded(rank={rank}, world_size={world_size}) does not match the process "
            f"group (rank {actual[0]} of {actual[1]}); pass the process group's rank and size"
        )


# --- files ------------------------------------------------------------------------------


def _entry(path: Path) -> FileEntry:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return FileEntry(path.stat().st_size, digest.hexdigest())


def _files(manifest: dict[str, Any], directory: Path) -> dict[str, FileEntry]:
    files = {n: FileEntry(int(e["size"]), str(e["sha256"])) for n, e in manifest["files"].items()}
    if DCP_METADATA not in files:
        raise CheckpointError(f"{directory / SHARD_MANIFEST} does not list {DCP_METADATA}")
    return files


def _write_manifest(directory: Path, data: dict[str, Any]) -> None:
    tmp = directory / f".{SHARD_MANIFEST}.tmp"
    with tmp.open("w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / SHARD_MANIFEST)


def _verify(directory: Path, name: str, files: dict[str, FileEntry]) -> None:
    entry = files.get(name)
    if entry is None:
        raise CheckpointError(
            f"sharded checkpoint {directory} is corrupted: {name} is read but not in "
            f"{SHARD_MANIFEST}"
        )
    path = directory / name
    if not path.is_file():
        raise CheckpointError(f"sharded checkpoint {directory} is incomplete: {name} is missing")
    actual = _entry(path)
    if actual.size != entry.size:
        raise CheckpointError(
            f"sharded checkpoint {directory} is corrupted: {name} has {actual.size} bytes, "
            f"{SHARD_MANIFEST} says {entry.size}"
        )
    if actual.sha256 != entry.sha256.lower():
        raise CheckpointError(
            f"sharded checkpoint {directory} is corrupted: {name} fails its sha256; it is "
            "not loaded"
        )


class _RecordingWriter(FileSystemWriter):
    """DCP's file writer, remembering the names of the files this rank wrote."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.written: set[str] = set()

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        future: Future[list[WriteResult]] = super().write_data(plan, planner)
        self.written.update(str(r.storage_data.relative_path) for r in future.wait())
        return future


class _VerifyingReader(FileSystemReader):
    """DCP's file reader that checks each file against the shard manifest before reading
    it, and reads `.metadata` without running code."""

    def __init__(self, path: Path, files: dict[str, FileEntry]) -> None:
        super().__init__(path)
        self._dir = Path(path)
        self._files = files
        self._verified: set[str] = set()

        self.failure: CheckpointError | None = None  # DCP re-raises it as another type

    def _check(self, name: str) -> None:
        if name not in self._verified:
            try:
                _verify(self._dir, name, self._files)
            except CheckpointError as e:
                self.failure = e
                raise
            self._verified.add(name)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        self._check(DCP_METADATA)
        data = (self._dir / DCP_METADATA).read_bytes()
        try:
            metadata = _MetadataUnpickler(io.BytesIO(data)).load()
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as e:
            self.failure = CheckpointError(f"sharded checkpoint {self._dir}: {e}")
            raise self.failure from None
        if not isinstance(metadata, Metadata):
            self.failure = CheckpointError(
                f"sharded checkpoint {self._dir}: {DCP_METADATA} is not DCP's metadata"
            )
            raise self.failure
        metadata.storage_meta = None
        self.storage_data = metadata.storage_data
        return metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        for item in plan.items:
            self._check(str(self.storage_data[item.storage_index].relative_path))
        future: Future[None] = super().read_data(plan, planner)
        return future


class _MetadataUnpickler(pickle.Unpickler):
    """Builds DCP's metadata classes, torch dtypes and sizes, and nothing else."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("builtins", "getattr"):
            # Some Python releases (3.11.0 to 3.11.4, Debian 12's 3.11.2 among them)
            # pickle an enum member as `getattr(EnumClass, "NAME")`, others by value.
            return _enum_member
        if not _allowed(module, name):
            raise pickle.UnpicklingError(
                f"{DCP_METADATA} refers to {module}.{name}, which a checkpoint's metadata "
                "never holds; it is not loaded"
            )
        return super().find_class(module, name)


def _allowed(module: str, name: str) -> bool:
    return (
        module.startswith("torch.distributed.checkpoint.")
        or (module, name) in _ALLOWED
        or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype))
    )


def _enum_member(cls: object, name: object) -> enum.Enum:
    """`getattr` as the metadata's unpickler offers it: a member of an allowed enum class,
    looked up by name, and nothing else."""
    if not (
        isinstance(cls, type)
        and issubclass(cls, enum.Enum)
        and _allowed(cls.__module__, cls.__qualname__)
    ):
        raise pickle.UnpicklingError(
            f"{DCP_METADATA} asks getattr of {cls!r}, which is not an enum class a "
            "checkpoint's metadata holds; it is not loaded"
        )
    if not isinstance(name, str) or name not in cls.__members__:
        raise pickle.UnpicklingError(
            f"{DCP_METADATA} asks getattr of {cls.__qualname__}.{name}, which is not one "
            "of its members; it is not loaded"
        )
    return cls.__members__[name]


_ALLOWED = {
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("collections", "OrderedDict"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
}


def _load_bytes(value: io.BytesIO) -> Any:
    return torch.load(value, map_location="cpu", weights_only=True)


class _SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's planner, loading non-tensor values with `weights_only=True`."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        super().load_bytes(read_item, io.BytesIO(_dump(_load_bytes(value))))


class _SafeEmptyPlanner(_EmptyStateDictLoadPlanner):
    """DCP's planner for loading everything, loading values with `weights_only=True`."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        super().load_bytes(read_item, io.BytesIO(_dump(_load_bytes(value))))


def _dump(value: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


@contextlib.contextmanager
def _refusing(directory: Path, reader: _VerifyingReader) -> Iterator[None]:
    """DCP's failures as one `CheckpointError` that says what is wrong: a file that fails
    its check, else a checkpoint that does not fit what it is loaded into."""
    try:
        with _quiet():
            yield
    except CheckpointError:
        raise
    except (CheckpointException, RuntimeError, ValueError, KeyError, AssertionError) as e:
        if reader.failure is not None:
            raise reader.failure from None
        raise CheckpointError(
            f"sharded checkpoint {directory} does not fit this model and optimizer: {_cause(e)}"
        ) from None


def _cause(error: BaseException) -> str:
    if isinstance(error, CheckpointException):
        for exc, _ in error.failures.values():
            return _cause(exc)
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    # DCP warns that it runs in one process when there is no process group: that is the
    # point of loading a sharded checkpoint onto one process.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*single process.*")
        yield


__all__ = [
    "FULL_STATE_DICT",
    "SHARD_MANIFEST",
    "is_sharded",
    "load_sharded",
    "read_shard_manifest",
    "save_sharded",
    "sharded_parts",
    "strategy_of",
    "to_full_state_dict",
    "write_full_state_dicts",
]
