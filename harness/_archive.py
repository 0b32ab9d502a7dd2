"""Model-directory archives: what `assay experiment create` uploads and agents extract.

`pack_model_dir` turns a directory into a deterministic gzip-compressed tar (sorted entries,
zeroed mtimes and owners), honouring a `.assayignore` file of gitignore-like patterns and
refusing anything over `MAX_MODEL_DEF_BYTES` as early as it can tell. `unpack_model_dir`
extracts such an archive, refusing members that would land outside the destination and
archives that unpack to more than `MAX_UNPACKED_BYTES`.

CLI, master and agent all use these two functions, so the rules are the same everywhere.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import re
import stat
import tarfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from assay.errors import AssayError

MAX_MODEL_DEF_BYTES = 96 * 2**20
"""Largest compressed model definition the master accepts (96 MiB)."""

MAX_UNPACKED_BYTES = 4 * MAX_MODEL_DEF_BYTES
"""Largest total size of the files a model definition may unpack to (384 MiB)."""

IGNORE_FILE = ".assayignore"

# Never worth shipping, whatever .assayignore says.
_ALWAYS_SKIPPED_DIRS = frozenset({"__pycache__", ".git"})
_ALWAYS_SKIPPED_FILES = frozenset({".git"})
_ALWAYS_SKIPPED_SUFFIXES = (".pyc",)

_CHUNK = 1 << 20


class ModelDefinitionError(AssayError):
    """The model directory cannot be packed, or a model-definition archive is unusable."""


def format_bytes(n: int) -> str:
    """`1536` -> `1.5 KiB`: sizes for people, with the exact count kept next to it."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _sized(n: int) -> str:
    return f"{format_bytes(n)} ({n} bytes)"


# --- .assayignore ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Rule:
    regex: re.Pattern[str]
    negate: bool
    dir_only: bool


def _translate(pattern: str) -> str:
    """Translate one gitignore glob (already stripped of `!`, leading and trailing `/`)."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("/**", i) and i + 3 == n:
            out.append("(?:/.*)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            end = pattern.find("]", i + 2 if pattern[i + 1 : i + 2] in ("!", "^") else i + 1)
            if end == -1:
                out.append(re.escape(c))
                i += 1
                continue
            body = pattern[i + 1 : end]
            if body[:1] in ("!", "^"):
                body = "^" + body[1:]
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = end + 1
        elif c == "\\" and i + 1 < n:
            out.append(re.escape(pattern[i + 1]))
            i += 2
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


def _parse_rules(lines: Iterable[str]) -> list[_Rule]:
    rules: list[_Rule] = []
    for raw in lines:
        line = raw.rstrip("\n").rstrip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        if negate:
            line = line[1:]
        if line.startswith("\\"):  # `\#name`, `\!name`: a literal first character
            line = line[1:]
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        if not line:
            continue
        # A slash at the start or in the middle anchors the pattern at the directory root;
        # otherwise it matches a name at any depth.
        anchored = "/" in line
        line = line.lstrip("/")
        body = _translate(line)
        regex = body if anchored else f"(?:.*/)?{body}"
        rules.append(_Rule(re.compile(f"^{regex}$", re.DOTALL), negate, dir_only))
    return rules


def _ignored(rules: list[_Rule], relpath: str, is_dir: bool) -> bool:
    ignored = False
    for rule in rules:
        if rule.dir_only and not is_dir:
            continue
        if rule.regex.match(relpath):
            ignored = not rule.negate
    return ignored


def _always_skipped(name: str, is_dir: bool) -> bool:
    if is_dir:
        return name in _ALWAYS_SKIPPED_DIRS
    return name in _ALWAYS_SKIPPED_FILES or name.endswith(_ALWAYS_SKIPPED_SUFFIXES)


# --- packing ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Entry:
    relpath: str  # POSIX, relative to the root
    path: Path
    kind: str  # "file" | "dir" | "link"
    size: int
    mode: int
    link_target: str = ""


def _collect(root: Path, rules: list[_Rule], max_unpacked: int) -> list[_Entry]:
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
            if _always_skipped(child.name, is_dir) or _ignored(rules, relpath, is_dir):
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
                f"model directory {root} holds more than {_sized(total)} of files, over the "
                f"limit of {_sized(max_unpacked)}; list data, checkpoints and other large "
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
    rules = _parse_rules(ignore_file.read_text().splitlines()) if ignore_file.is_file() else []
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
            f"model directory {root} packs to more than {_sized(e.written)}, over the limit "
            f"of {_sized(max_bytes)} for a model definition; list data, checkpoints and "
            f"other large files in {root / IGNORE_FILE}"
        ) from None
    return sink.buffer.getvalue()


# --- unpacking -------------------------------------------------------------------------


def _check_member(member: tarfile.TarInfo) -> None:
    name = member.name
    parts = PurePosixPath(name).parts
    if name.startswith(("/", "\\")) or os.path.isabs(name) or ".." in parts or not parts:
        raise ModelDefinitionError(f"archive member {name!r} would be written outside the model")
    if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
        raise ModelDefinitionError(f"archive member {name!r} is a device or other special file")
    if member.issym():
        target = member.linkname
        resolved = os.path.normpath(os.path.join(os.path.dirname(name), target))
        if os.path.isabs(target) or resolved == ".." or resolved.startswith("../"):
            raise ModelDefinitionError(
                f"archive member {name!r} links to {target!r}, outside the model directory"
            )
    if member.islnk():
        target = member.linkname
        if os.path.isabs(target) or ".." in PurePosixPath(target).parts:
            raise ModelDefinitionError(
                f"archive member {name!r} links to {target!r}, outside the model directory"
            )


def unpack_model_dir(
    data: bytes,
    dest: str | os.PathLike[str],
    *,
    max_bytes: int = MAX_MODEL_DEF_BYTES,
    max_unpacked_bytes: int | None = None,
) -> None:
    """Extract a model-definition archive into `dest` (created if missing).

    Every member is checked before anything is written: absolute paths, `..`, links that
    lead outside `dest`, devices and archives that unpack to more than
    `max_unpacked_bytes` (default `4 * max_bytes`) raise `ModelDefinitionError`.
    """
    target = Path(dest)
    with _opened(data, max_bytes, max_unpacked_bytes) as (tar, members):
        target.mkdir(parents=True, exist_ok=True)
        tar.extractall(target, members=members, filter="data")


def check_model_archive(
    data: bytes,
    *,
    max_bytes: int = MAX_MODEL_DEF_BYTES,
    max_unpacked_bytes: int | None = None,
) -> None:
    """Apply every check of `unpack_model_dir` without writing anything."""
    with _opened(data, max_bytes, max_unpacked_bytes):
        pass


@contextlib.contextmanager
def _opened(
    data: bytes, max_bytes: int, max_unpacked_bytes: int | None
) -> Iterator[tuple[tarfile.TarFile, list[tarfile.TarInfo]]]:
    """The archive and its members, each checked; `ModelDefinitionError` otherwise."""
    limit = 4 * max_bytes if max_unpacked_bytes is None else max_unpacked_bytes
    if len(data) > max_bytes:
        raise ModelDefinitionError(
            f"model definition is {_sized(len(data))}, over the limit of {_sized(max_bytes)}"
        )
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            members: list[tarfile.TarInfo] = []
            total = 0
            for member in tar:
                _check_member(member)
                total += member.size
                if total > limit:
                    raise ModelDefinitionError(
                        f"model definition unpacks to more than {_sized(total)}, over the "
                        f"limit of {_sized(limit)}"
                    )
                members.append(member)
            yield tar, members
    except tarfile.FilterError as e:
        raise ModelDefinitionError(f"unsafe model definition archive: {e}") from None
    except (tarfile.TarError, EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise ModelDefinitionError(
            f"model definition is not a valid .tar.gz archive: {e}"
        ) from None
