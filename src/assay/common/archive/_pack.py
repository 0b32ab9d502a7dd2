"""Packing a model directory into a deterministic `.tar.gz`, within the limits of
`_rules`, and the warning for checkpoint files packed with the code."""

from __future__ import annotations

import gzip
import io
import os
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from assay.common.archive._rules import (
    IGNORE_FILE,
    LOCAL_OUTPUT_MARKER,
    MAX_MODEL_DEF_BYTES,
    ModelDefinitionError,
    Rule,
    always_skipped,
    format_bytes,
    is_ignored,
    parse_rules,
    sized,
)


@dataclass(frozen=True)
class _Entry:
    relpath: str  # POSIX, relative to the root
    path: Path
    kind: str  # "file" | "dir" | "link"
    size: int
    mode: int
    link_target: str = ""


def _collect(root: Path, rules: list[Rule], max_unpacked: int) -> list[_Entry]:
    entries: list[_Entry] = []
    total = 0
    real_root = root.resolve()

    def visit(directory: Path, rel: PurePosixPath | None) -> Iterator[_Entry]:
        with os.scandir(directory) as it:
            children = sorted(it, key=lambda e: e.name)
        for child in children:
            relpath = str(rel / child.name) if rel else child.name
            path = Path(child.path)
            st = os.lstat(path)
            is_link = stat.S_ISLNK(st.st_mode)
            is_dir = stat.S_ISDIR(st.st_mode) or (is_link and path.is_dir())
            if always_skipped(child.name, is_dir) or is_ignored(rules, relpath, is_dir):
                continue
            if is_link:
                target = path.resolve()
                if not target.is_relative_to(real_root):
                    raise ModelDefinitionError(
                        f"{path} is a symbolic link to {os.readlink(path)}, outside the model "
                        f"directory {root}; copy the file in or add {relpath} to {IGNORE_FILE}"
                    )
                link_target = os.path.relpath(target, path.parent.resolve())
                yield _Entry(relpath, path, "link", 0, 0o777, PurePosixPath(link_target).as_posix())
            elif stat.S_ISDIR(st.st_mode):
                if (path / LOCAL_OUTPUT_MARKER).is_file():
                    continue  # a local run's checkpoints
                yield _Entry(relpath, path, "dir", 0, 0o755)
                yield from visit(path, PurePosixPath(relpath))
            elif stat.S_ISREG(st.st_mode):
                mode = 0o755 if st.st_mode & stat.S_IXUSR else 0o644
                yield _Entry(relpath, path, "file", st.st_size, mode)
            else:
                raise ModelDefinitionError(
                    f"{path} is not a regular file, directory or link; "
                    f"remove it or add {relpath} to {IGNORE_FILE}"
                )

    for entry in visit(root, None):
        total += entry.size
        if total > max_unpacked:
            raise ModelDefinitionError(
                f"model directory {root} holds more than {sized(total)} of files, over the "
                f"limit of {sized(max_unpacked)}; list data, checkpoints and other large "
                f"files in {root / IGNORE_FILE}"
            )
        entries.append(entry)
    entries.sort(key=lambda e: e.relpath)
    return entries


class _ArchiveTooLargeError(Exception):
    def __init__(self, written: int) -> None:
        self.written = written


class _LimitedBuffer(io.RawIOBase):
    """An in-memory sink that refuses to grow past `limit` bytes (checked on every write)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.buffer = io.BytesIO()

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        if self.buffer.tell() + len(data) > self.limit:
            raise _ArchiveTooLargeError(self.buffer.tell() + len(data))
        return self.buffer.write(data)


def _tarinfo(entry: _Entry) -> tarfile.TarInfo:
    info = tarfile.TarInfo(entry.relpath)
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode = entry.mode
    if entry.kind == "dir":
        info.type = tarfile.DIRTYPE
    elif entry.kind == "link":
        info.type = tarfile.SYMTYPE
        info.linkname = entry.link_target
    else:
        info.size = entry.size
    return info


class _ExactReader:
    """Reads exactly `size` bytes of a file that must not have changed size meanwhile."""

    def __init__(self, handle: IO[bytes], path: Path, size: int) -> None:
        self.handle, self.path, self.left = handle, path, size

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        data = self.handle.read(n)
        self.left -= len(data)
        if len(data) < n:
            raise ModelDefinitionError(f"{self.path} changed while it was being packed")
        return data


def pack_model_dir(path: str | os.PathLike[str], *, max_bytes: int = MAX_MODEL_DEF_BYTES) -> bytes:
    """Pack the directory into a deterministic `.tar.gz` (at most `max_bytes`).

    Raises `ModelDefinitionError` when the directory is missing, holds a link leading
    outside it, or its archive would exceed `max_bytes` (or its files `4 * max_bytes`,
    checked from their sizes before any is read).
    """
    root = Path(path)
    if not root.is_dir():
        raise ModelDefinitionError(f"model directory {root} does not exist or is not a directory")
    ignore_file = root / IGNORE_FILE
    rules = parse_rules(ignore_file.read_text().splitlines()) if ignore_file.is_file() else []
    entries = _collect(root, rules, 4 * max_bytes)

    sink = _LimitedBuffer(max_bytes)
    try:
        # filename="" and mtime=0 keep the gzip header free of anything that varies.
        with (
            gzip.GzipFile(filename="", mode="wb", fileobj=sink, mtime=0) as gz,
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
        ):
            for entry in entries:
                info = _tarinfo(entry)
                if entry.kind == "file":
                    with entry.path.open("rb") as handle:
                        tar.addfile(info, _ExactReader(handle, entry.path, entry.size))
                else:
                    tar.addfile(info)
    except _ArchiveTooLargeError as e:
        raise ModelDefinitionError(
            f"model directory {root} packs to more than {sized(e.written)}, over the limit "
            f"of {sized(max_bytes)} for a model definition; list data, checkpoints and "
            f"other large files in {root / IGNORE_FILE}"
        ) from None
    return sink.buffer.getvalue()


# Files a training run writes for itself: shipped with the code, every trial gets them,
# and code that resumes from a path (Lightning's `ckpt_path="last"`) resumes from them.
CHECKPOINT_SUFFIXES = (".ckpt", ".pt", ".pth", ".safetensors")


def packed_checkpoint_warning(archive: bytes, *, shown: int = 3) -> str | None:
    """A warning naming the checkpoint-like files `archive` (a packed model directory)
    holds, with their total size; None if it holds none."""
    found: list[tuple[str, int]] = []
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        for member in tar:
            if member.isfile() and member.name.lower().endswith(CHECKPOINT_SUFFIXES):
                found.append((member.name, member.size))
    if not found:
        return None
    names = ", ".join(name for name, _ in found[:shown])
    more = f" and {len(found) - shown} more" if len(found) > shown else ""
    total = format_bytes(sum(size for _, size in found))
    noun = "file" if len(found) == 1 else "files"
    return (
        f"the model directory holds {len(found)} checkpoint {noun} ({total}: {names}{more}): "
        "every trial gets them, and code that resumes from a path (such as Lightning's "
        "ckpt_path='last') resumes from them instead of starting fresh; list them in "
        f"{IGNORE_FILE} unless the trial needs them"
    )
