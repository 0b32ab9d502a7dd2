"""Checkpoint files: written atomically with a manifest, verified when read.

A checkpoint is a directory named by its uuid holding `models.pt`, `optimizers.pt`,
`lr_schedulers.pt`, `precision.pt`, `rng.pt` (one entry per rank), `trial_state.pt`
(counters and data position), `user_state.pt` when the Trial has any, and
`metadata.json`, the manifest: format version, counters, hyperparameters, and every
file's size and sha256. It is written into a hidden temporary directory beside its final
place and renamed into place only when complete, so a reader never sees half of one.

A checkpoint lives on storage that other experiments' trials may reach, so its manifest
proves nothing on its own: anyone who changes a file can rewrite the manifest too. A
restore on a cluster verifies every file, the manifest included, against the sha256s the
master recorded when the checkpoint was reported (`verify_checkpoint(path, recorded)`),
and every file is loaded with `torch.load(weights_only=True)`: no checkpoint file runs
code when it is read.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import random
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from assay.errors import AssayError, PermanentError

FORMAT_VERSION = 1
MANIFEST = "metadata.json"


class CheckpointError(AssayError):
    """A checkpoint is missing, incomplete or corrupted."""


class ChangedCheckpointError(CheckpointError, PermanentError):
    """A checkpoint whose files differ from the master's record: every run would read the
    same files, so the trial ends at once instead of spending its restarts on them. (A
    checkpoint that is only missing may be on storage another run can reach.)"""


@dataclass(frozen=True)
class FileEntry:
    size: int
    sha256: str


@dataclass
class CheckpointMetadata:
    uuid: str
    total_batches: int
    epoch: int
    batch_in_epoch: int
    world_size: int
    trial_id: int
    hparams: dict[str, Any]
    files: dict[str, FileEntry] = field(default_factory=dict)
    user_metadata: dict[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    created_at: float = 0.0
    torch_version: str = field(default_factory=lambda: _torch_version())
    # What wrote it: "trial" (the Trial harness) or "core" (a script's store_path).
    kind: str = "trial"
    # The strategy of a sharded checkpoint inside it (its shards.json says, e.g. "fsdp");
    # empty for one of full state dicts.
    strategy: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True, default=str)

    def manifest_entry(self) -> FileEntry:
        """The size and sha256 of the `metadata.json` that `seal_checkpoint` writes for
        this metadata (reported to the master with the other files' entries)."""
        data = self.to_json().encode()
        return FileEntry(len(data), hashlib.sha256(data).hexdigest())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CheckpointMetadata:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}  # newer fields are ignored
        values["files"] = {k: FileEntry(**v) for k, v in data.get("files", {}).items()}
        return cls(**values)

    @property
    def size_bytes(self) -> int:
        return sum(f.size for f in self.files.values())


def _torch_version() -> str:
    """torch's version when torch is loaded; scripts that never import it write none."""
    module = sys.modules.get("torch")
    return str(getattr(module, "__version__", "")) if module is not None else ""


def capture_rng_state() -> dict[str, Any]:
    """This process's RNG states in a form `torch.load(weights_only=True)` accepts."""
    import numpy as np
    import torch

    np_state = np.random.get_state()
    assert isinstance(np_state, tuple)
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": (
            str(np_state[0]),
            torch.from_numpy(np.asarray(np_state[1], dtype=np.int64)),
            int(np_state[2]),
            int(np_state[3]),
            float(np_state[4]),
        ),
        "python": _python_state_to_plain(random.getstate()),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        # This slot's own device only: reading every device would create a CUDA context
        # on each of them in every rank.
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _python_state_to_plain(state: tuple[Any, ...]) -> tuple[int, list[int], float | None]:
    version, internal, gauss_next = state
    return int(version), [int(x) for x in internal], gauss_next


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def staging_dir(root: Path, uuid: str) -> Path:
    """Where checkpoint `uuid` is written under `root` before it is renamed into place."""
    return root / f".tmp-{uuid}"


def check_writable(directory: Path, fix: str) -> None:
    """Fail before training, not at the first checkpoint, if `directory` cannot take
    checkpoints; `fix` says what to change (the setting that named the directory)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".assay-probe-"):
            pass
    except OSError as e:
        raise CheckpointError(
            f"cannot write checkpoints to {directory}: {e.strerror or e}; {fix}"
        ) from None


def cluster_storage_fix(host_path: str | None) -> str:
    """What to change when a trial on the cluster cannot write its shared_fs directory."""
    if host_path is None:
        return (
            "the master's checkpoint root must be writable at the same path on every agent "
            "(or set checkpoint_storage.host_path)"
        )
    return (
        f"checkpoint_storage.host_path ({host_path}) must be a directory every agent can "
        "write, mounted at the same path on each"
    )


def write_checkpoint(
    root: Path,
    payload: dict[str, Any],
    metadata: CheckpointMetadata,
    *,
    shards: dict[str, FileEntry] | None = None,
) -> Path:
    """Write `payload` (file stem -> object for torch.save) as checkpoint `metadata.uuid`.

    `shards`: the files of a sharded checkpoint that every rank already wrote, by name
    with their entries as each rank hashed them: into `staging_dir` (then kept there, not
    hashed again) or into object storage (then only listed)."""
    import torch

    root.mkdir(parents=True, exist_ok=True)
    final = root / metadata.uuid
    tmp = staging_dir(root, metadata.uuid)
    if shards is None:
        shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(exist_ok=shards is not None)
    try:
        for stem, obj in payload.items():
            path = tmp / f"{stem}.pt"
            with path.open("wb") as f:
                torch.save(obj, f)
                f.flush()
                os.fsync(f.fileno())
        return seal_checkpoint(tmp, final, metadata, shards)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def file_entries(
    directory: Path, known: Mapping[str, FileEntry] | None = None
) -> dict[str, FileEntry]:
    """Every file under `directory` (subdirectories too) by relative POSIX name; those in
    `known` with the entry given there, not hashed again."""
    entries: dict[str, FileEntry] = {}
    for path in sorted(directory.rglob("*")):
        if path.is_symlink():
            raise CheckpointError(f"checkpoint file {path.relative_to(directory)} is a symlink")
        if path.is_file():
            name = path.relative_to(directory).as_posix()
            entry = (known or {}).get(name)
            entries[name] = entry or FileEntry(path.stat().st_size, _sha256(path))
    return entries


def seal_checkpoint(
    staging: Path,
    final: Path,
    metadata: CheckpointMetadata,
    extra: dict[str, FileEntry] | None = None,
) -> Path:
    """Finish a checkpoint written into `staging`: hash every file (subdirectories too)
    into `metadata.files`, write the manifest last, and rename `staging` to `final`.

    The files must already be flushed; a reader never sees `final` half-written. `extra`:
    entries of files stored elsewhere by other processes (a sharded checkpoint), or put
    into `staging` by them (not hashed again).
    """
    if (staging / MANIFEST).exists():
        raise CheckpointError(
            f"a checkpoint may not hold its own {MANIFEST}: Assay writes it (the manifest); "
            "name that file differently"
        )
    metadata.files.update(file_entries(staging, extra))
    metadata.files.update(extra or {})
    if not metadata.strategy:
        metadata.strategy = _sharded_strategy(staging)
    metadata.created_at = time.time()
    manifest = staging / MANIFEST
    with manifest.open("wb") as f:
        # The bytes `manifest_entry` hashes: the master records them.
        f.write(metadata.to_json().encode())
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(staging)
    os.rename(staging, final)
    _fsync_dir(final.parent)
    return final


def _sharded_strategy(directory: Path) -> str:
    """The strategy that `shards.json` (assay.strategy's shard manifest) in `directory`
    or one of its subdirectories names; empty without one."""
    for manifest in [directory / "shards.json", *sorted(directory.glob("*/shards.json"))]:
        if manifest.is_file():
            with contextlib.suppress(ValueError, TypeError, AttributeError, OSError):
                return str(json.loads(manifest.read_text()).get("strategy", ""))
    return ""


def new_uuid() -> str:
    return str(uuid.uuid4())


def read_metadata(path: Path) -> CheckpointMetadata:
    manifest = path / MANIFEST
    if not manifest.is_file():
        raise CheckpointError(f"{path} is not a checkpoint: it has no {MANIFEST}")
    try:
        data = json.loads(manifest.read_text())
        version = int(data.get("format_version", 0))
    except (ValueError, TypeError, AttributeError) as e:
        raise CheckpointError(f"{manifest} is unreadable: {e}") from None
    if version > FORMAT_VERSION:
        raise CheckpointError(
            f"{path} has checkpoint format {version}; this Assay reads up to "
            f"{FORMAT_VERSION}: upgrade Assay to restore it"
        )
    try:
        return CheckpointMetadata.from_dict(data)
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{manifest} is unreadable: {e}") from None


def verify_checkpoint(path: Path, recorded: Mapping[str, str] | None = None) -> CheckpointMetadata:
    """Check every file against the manifest; raise `CheckpointError` naming the first bad one.

    `recorded`: the sha256 of every file (`metadata.json` included) as the master recorded
    them when the checkpoint was reported. Then those are what count: a file not in the
    record, a missing one, or one whose sha256 differs (the manifest too) is refused, all
    of them named in one error, before anything is unpickled.
    """
    if recorded:
        return verify_recorded(path, recorded)
    metadata = read_metadata(path)
    for name, entry in sorted(metadata.files.items()):
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"checkpoint {path} is incomplete: {name} is missing")
        size = file.stat().st_size
        if size != entry.size:
            raise CheckpointError(
                f"checkpoint {path} is corrupted: {name} has {size} bytes, manifest says "
                f"{entry.size}"
            )
        if _sha256(file) != entry.sha256:
            raise CheckpointError(f"checkpoint {path} is corrupted: {name} fails its sha256")
    return metadata


def verify_recorded(path: Path, recorded: Mapping[str, str]) -> CheckpointMetadata:
    """`verify_checkpoint` against the master's record `recorded` (name -> sha256).

    A record from before the manifest was reported has no `metadata.json` entry: the
    manifest must then list exactly the recorded files with the recorded sha256s.
    """
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path} is missing")
    problems: list[str] = []
    on_disk: set[str] = set()
    for file in sorted(path.rglob("*")):
        name = file.relative_to(path).as_posix()
        if file.is_symlink():
            problems.append(f"{name} is a symlink")
        elif file.is_file():
            on_disk.add(name)
    expected = set(recorded) | {MANIFEST}
    problems += [f"{name} is not in the record" for name in sorted(on_disk - expected)]
    problems += [f"{name} is missing" for name in sorted(expected - on_disk)]
    for name in sorted(on_disk & set(recorded)):
        if _sha256(path / name) != recorded[name].lower():
            problems.append(f"{name} fails the recorded sha256")
    if problems:
        raise _changed(path, problems)
    metadata = read_metadata(path)
    listed = {name: entry.sha256 for name, entry in metadata.files.items()}
    if MANIFEST not in recorded and listed != {n: s.lower() for n, s in recorded.items()}:
        raise _changed(path, [f"{MANIFEST} lists other files than the record"])
    return metadata


def _changed(path: Path, problems: list[str]) -> CheckpointError:
    message = (
        f"checkpoint {path} is not the one the master recorded: {'; '.join(problems)}. "
        "It was changed after it was written; it is not restored"
    )
    if all(p.endswith(" is missing") for p in problems):
        return CheckpointError(message)
    return ChangedCheckpointError(
        f"{message}. The trial ends (every run would read the same files): to resume from "
        f"the checkpoint before it, `assay checkpoint delete {path.name}` and then "
        "`assay experiment continue` the experiment"
    )


def load_file(path: Path, stem: str) -> Any:
    """Load `stem`.pt: tensors and plain containers only (`weights_only=True`)."""
    import torch

    return torch.load(path / f"{stem}.pt", map_location="cpu", weights_only=True)


def load_user_state(path: Path, stem: str = "user_state") -> Any:
    """Load `stem`.pt, saved from a `state_dict()` the user wrote: `weights_only=True`,
    with numpy arrays and scalars allowed too (they build no object but an array)."""
    try:
        with _numpy_allowed():
            return load_file(path, stem)
    except pickle.UnpicklingError as e:
        raise CheckpointError(
            f"checkpoint {path}: {stem}.pt holds objects that load only by running code "
            f"({_refused_global(e)}); a state_dict() must hold containers, numbers, "
            "strings, tensors and numpy arrays"
        ) from None


def _refused_global(error: Exception) -> str:
    """The line of torch's weights-only error that names what it refused."""
    for line in str(error).splitlines():
        if "Unsupported global" in line or "but got" in line:
            return line.strip().removeprefix("WeightsUnpickler error: ").split(". ")[0]
    return type(error).__name__


@contextlib.contextmanager
def _numpy_allowed() -> Iterator[None]:
    import numpy as np
    import torch

    allow = getattr(torch.serialization, "safe_globals", None)  # torch 2.5 on
    if allow is None:
        yield
        return
    reconstruct = np.ndarray.__reduce__(np.zeros(0))[0]
    scalar = np.float64(0).__reduce__()[0]
    module = getattr(np, "dtypes", None)  # numpy 1.25 on
    dtypes = [getattr(module, name) for name in getattr(module, "__all__", ())]
    with allow([reconstruct, scalar, np.ndarray, np.dtype, *dtypes]):
        yield
