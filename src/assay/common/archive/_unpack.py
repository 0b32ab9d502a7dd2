"""Checking and extracting a model-definition archive.

Archives come from users, so unpacking trusts nothing in them. Every member is checked,
and the whole archive is modelled as the tree it would create, before anything is
written; the tree is then written into a fresh directory beside the destination and
renamed into place, so a refused or failed archive leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import re
import shutil
import stat
import tarfile
import tempfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

from assay.common.archive._rules import MAX_MODEL_DEF_BYTES, ModelDefinitionError, sized

MAX_MEMBERS = 10_000
"""Most entries (files, directories and links together) a model definition may hold."""

MAX_PATH_CHARS = 1024
"""Longest member path or link target, in characters."""

MAX_NAME_BYTES = 255
"""Longest single path component, in bytes (Linux's NAME_MAX)."""

MAX_DEPTH = 64
"""Most directory levels a member path may have."""

MAX_LINK_DEPTH = 40
"""Longest chain of symbolic links a link may resolve through (Linux gives up at 40 too)."""

# Most bytes of headers (PAX records, GNU long names, sparse maps) one member may have.
_MAX_HEADER_BYTES = 2**20
# Room for the headers and padding of one member in the uncompressed stream.
_HEADER_ALLOWANCE = 8 * 2**10
_COPY_CHUNK = 64 * 2**10

_Kind = Literal["file", "dir", "link"]
_KIND_NAMES: dict[_Kind, str] = {"file": "file", "dir": "directory", "link": "symbolic link"}
_SPECIAL_TYPES = {
    tarfile.LNKTYPE: "a hard link",
    tarfile.CHRTYPE: "a character device",
    tarfile.BLKTYPE: "a block device",
    tarfile.FIFOTYPE: "a FIFO",
}
_DRIVE = re.compile(r"[A-Za-z]:")
_OUTSIDE = "would be written outside the model directory"


def _refused(name: str, rule: str) -> ModelDefinitionError:
    shown = name if len(name) <= 120 else name[:120] + "..."
    return ModelDefinitionError(f"archive member {shown!r} {rule}")


def _kind(member: tarfile.TarInfo) -> _Kind:
    if member.isreg():
        return "file"
    if member.isdir():
        return "dir"
    if member.issym():
        return "link"
    what = _SPECIAL_TYPES.get(member.type, f"of unsupported type {member.type!r}")
    raise _refused(
        member.name, f"is {what}; only files, directories and symbolic links are allowed"
    )


def _check_text(name: str, text: str, what: str) -> None:
    """Rules shared by member paths and link targets (`what` says which one `text` is)."""
    if not text:
        raise _refused(name, f"has an empty {what}")
    if len(text) > MAX_PATH_CHARS:
        raise _refused(
            name, f"has a {what} of {len(text)} characters, over the limit of {MAX_PATH_CHARS}"
        )
    if "\0" in text:
        raise _refused(name, f"has a NUL character in its {what}")
    if "\\" in text or _DRIVE.match(text):
        raise _refused(name, f"has a Windows-style {what} {text!r}, which is not allowed")


def _member_parts(name: str) -> tuple[str, ...]:
    """The components of a member's path, `()` for the model directory itself."""
    _check_text(name, name, "path")
    if name.startswith("/"):
        raise _refused(name, f"{_OUTSIDE}: it is an absolute path")
    parts = tuple(part for part in name.split("/") if part not in ("", "."))
    level = 0
    for part in parts:
        level += -1 if part == ".." else 1
        if level < 0:
            raise _refused(name, _OUTSIDE)
    if ".." in parts:
        raise _refused(name, "has '..' in its path, which is not allowed")
    if len(parts) > MAX_DEPTH:
        raise _refused(name, f"is {len(parts)} levels deep, over the limit of {MAX_DEPTH}")
    for part in parts:
        size = len(part.encode("utf-8", "surrogateescape"))
        if size > MAX_NAME_BYTES:
            raise _refused(
                name, f"has a path component of {size} bytes, over the limit of {MAX_NAME_BYTES}"
            )
    return parts


class _Tree:
    """What an archive would create: checked member by member, before anything is written.

    Members may not be written through a symbolic link (even one that stays inside), nor
    replace an earlier member other than a directory listed again; every link must resolve,
    through any links it meets, to a place inside the model directory.

    Paths are nodes with parent pointers, so each step of a check is a dictionary lookup
    whatever the depth: a crafted archive of long paths and links cannot make it slow.
    """

    def __init__(self) -> None:
        # Node 0 is the model directory itself.
        self.kinds: list[_Kind] = ["dir"]
        self.parents: list[int] = [0]
        self.names: list[str] = [""]
        self.children: dict[tuple[int, str], int] = {}
        self.links: dict[int, str] = {}

    def _new(self, parent: int, part: str, kind: _Kind, name: str) -> int:
        node = len(self.kinds)
        self.kinds.append(kind)
        self.parents.append(parent)
        self.names.append(name)
        self.children[parent, part] = node
        return node

    def add(self, member: tarfile.TarInfo, parts: tuple[str, ...], kind: _Kind) -> None:
        name = member.name
        node = 0
        for part in parts[:-1]:
            child = self.children.get((node, part))
            if child is None:
                child = self._new(node, part, "dir", "")
            elif self.kinds[child] == "link":
                raise _refused(
                    name, f"would be written through the symbolic link {self.names[child]!r}"
                )
            elif self.kinds[child] == "file":
                raise _refused(name, f"would be written inside the file {self.names[child]!r}")
            node = child
        previous = self.children.get((node, parts[-1])) if parts else 0
        if previous is not None:
            if not parts and kind != "dir":
                raise _refused(name, "would replace the model directory itself")
            if (self.kinds[previous], kind) != ("dir", "dir"):
                what = _KIND_NAMES[self.kinds[previous]]
                raise _refused(name, f"would replace the {what} of an earlier member")
            return
        node = self._new(node, parts[-1], kind, name)
        if kind == "link":
            target = member.linkname
            _check_text(name, target, "link target")
            if target.startswith("/"):
                raise _refused(
                    name, f"links to the absolute path {target!r}, outside the model directory"
                )
            self.links[node] = target

    def check_links(self) -> None:
        memo: dict[int, tuple[int, int, int]] = {}
        for link in self.links:
            self._resolve(link, memo, [])

    def _resolve(
        self, link: int, memo: dict[int, tuple[int, int, int]], chain: list[int]
    ) -> tuple[int, int, int]:
        """Where `link` leads: the deepest node of the tree on the way, how many levels the
        target goes below it that the archive does not create, and how many links deep."""
        if link in memo:
            return memo[link]
        name, target = self.names[link], self.links[link]
        if link in chain:
            raise _refused(name, "is part of a loop of symbolic links")
        if len(chain) >= MAX_LINK_DEPTH:
            raise _refused(name, f"is reached through more than {MAX_LINK_DEPTH} links")
        chain.append(link)
        node, missing, depth = self.parents[link], 0, 1
        # Component by component, as the kernel would: `..` after a link climbs from where
        # the link leads, which is why a lexical normpath of the target is not enough.
        for part in target.split("/"):
            if part in ("", "."):
                continue
            if part == "..":
                if missing:
                    missing -= 1
                elif node == 0:
                    raise _refused(
                        name, f"links to {target!r}, which leads outside the model directory"
                    )
                else:
                    node = self.parents[node]
            elif missing:
                missing += 1
            else:
                child = self.children.get((node, part))
                if child is None:
                    missing = 1
                elif child in self.links:
                    node, missing, hops = self._resolve(child, memo, chain)
                    depth = max(depth, hops + 1)
                else:
                    node = child
        chain.pop()
        if depth > MAX_LINK_DEPTH:
            raise _refused(name, f"resolves through more than {MAX_LINK_DEPTH} links")
        memo[link] = (node, missing, depth)
        return memo[link]


@dataclass(frozen=True)
class _Planned:
    member: tarfile.TarInfo
    parts: tuple[str, ...]
    kind: _Kind


def _plan(tar: tarfile.TarFile, stream: _BoundedStream, limit: int) -> list[_Planned]:
    """Every member of the archive, checked against every rule; nothing is written."""
    plan: list[_Planned] = []
    tree = _Tree()
    total = 0
    for member in tar:
        stream.next_member()
        if len(plan) == MAX_MEMBERS:
            raise ModelDefinitionError(
                f"model definition has more than {MAX_MEMBERS} entries, over the limit"
            )
        kind = _kind(member)
        parts = _member_parts(member.name)
        tree.add(member, parts, kind)
        if kind == "file":
            total += member.size
            if total > limit:
                raise ModelDefinitionError(
                    f"model definition unpacks to more than {sized(total)}, over the "
                    f"limit of {sized(limit)} (at archive member {member.name!r})"
                )
        plan.append(_Planned(member, parts, kind))
    stream.listed()
    tree.check_links()
    return plan


class _StreamLimitError(Exception):
    def __init__(self, problem: str) -> None:
        self.problem = problem


class _BoundedStream:
    """The uncompressed tar stream, as `tarfile` reads it, with bounds on memory and work.

    A gzip stream can expand a thousandfold, and `tarfile` parses a member's PAX records,
    GNU long names and sparse maps into memory before the member can be checked. While
    members are listed `tarfile` only reads headers (it seeks past contents), so the bytes
    read between two members are that member's headers: `_MAX_HEADER_BYTES` bounds them,
    and `limit` bounds the whole stream.
    """

    def __init__(self, raw: gzip.GzipFile, limit: int) -> None:
        self.raw, self.limit = raw, limit
        self.header_bytes: int | None = 0  # None once listing is over

    def next_member(self) -> None:
        self.header_bytes = 0

    def listed(self) -> None:
        self.header_bytes = None

    def read(self, size: int, /) -> bytes:
        room = self.limit - self.raw.tell() + 1
        size = room if size < 0 else min(size, room)
        if self.header_bytes is not None:
            self.header_bytes += size
            if self.header_bytes > _MAX_HEADER_BYTES:
                raise _StreamLimitError(
                    "its tar headers for one member (PAX records, long names, sparse maps) "
                    f"take more than {sized(_MAX_HEADER_BYTES)}"
                )
        data = self.raw.read(size)
        if self.raw.tell() > self.limit:
            raise self._too_long()
        return data

    def seek(self, pos: int, /) -> int:
        if pos > self.limit:
            raise self._too_long()
        return self.raw.seek(pos)

    def tell(self) -> int:
        return self.raw.tell()

    def write(self, b: bytes, /) -> int:
        raise io.UnsupportedOperation("write")

    def close(self) -> None:
        self.raw.close()

    def _too_long(self) -> _StreamLimitError:
        return _StreamLimitError(
            f"its tar stream runs past {sized(self.limit)}, more than its entries can need"
        )


def _write_file(tar: tarfile.TarFile, member: tarfile.TarInfo, path: Path) -> None:
    source = tar.extractfile(member)
    if source is None:
        raise ModelDefinitionError(f"archive member {member.name!r} has no contents")
    # 0o755 if the owner may execute it, else 0o644: setuid, setgid, sticky and group or
    # world write bits in the archive are dropped, as are its owners and times.
    mode = 0o755 if member.mode & stat.S_IXUSR else 0o644
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with source, os.fdopen(os.open(path, flags, mode), "wb") as out:
        shutil.copyfileobj(source, out, _COPY_CHUNK)


def _extract(tar: tarfile.TarFile, plan: list[_Planned], root: Path) -> None:
    """Write a checked plan into `root`, a fresh directory no one else writes to."""
    for item in plan:
        if not item.parts:
            continue
        path = root.joinpath(*item.parts)
        if item.kind == "dir":
            path.mkdir(mode=0o755, parents=True, exist_ok=True)
            continue
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        if item.kind == "link":
            os.symlink(item.member.linkname, path)
        else:
            _write_file(tar, item.member, path)


def unpack_model_dir(
    data: bytes,
    dest: str | os.PathLike[str],
    *,
    max_bytes: int = MAX_MODEL_DEF_BYTES,
    max_unpacked_bytes: int | None = None,
) -> None:
    """Extract a model-definition archive into `dest`, which must be missing or empty.

    Every member is checked before anything is written, and a refused archive raises
    `ModelDefinitionError` naming the member and the rule: absolute, `..` and
    Windows-style paths, empty names or names with NUL, symbolic links that lead outside
    `dest` (directly, through other links or in loops), members written through a link or
    replacing an earlier one, hard links, devices and FIFOs, more than `MAX_MEMBERS`
    entries, over-long or over-deep paths, and files totalling more than
    `max_unpacked_bytes` (default `4 * max_bytes`). Links that stay inside are kept.
    Modes become 0o644 or 0o755 (setuid, setgid and sticky bits are dropped).

    The archive is extracted into a new directory beside `dest` and renamed into place, so
    on any error nothing is left behind. Raises `FileExistsError` if `dest` exists and is
    not an empty directory.
    """
    target = Path(dest)
    with _opened(data, max_bytes, max_unpacked_bytes) as (tar, plan):
        if target.is_symlink() or (
            target.exists() and (not target.is_dir() or any(target.iterdir()))
        ):
            raise FileExistsError(
                f"cannot unpack a model definition into {target}: it exists and is not an "
                "empty directory"
            )
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            _extract(tar, plan, staging)
            staging.chmod(0o755)
            staging.replace(target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise


def check_model_archive(
    data: bytes | Path,
    *,
    max_bytes: int = MAX_MODEL_DEF_BYTES,
    max_unpacked_bytes: int | None = None,
) -> None:
    """Apply every check of `unpack_model_dir` without writing anything. `data`: the
    archive, or a file holding it (read as it is checked, never whole into memory)."""
    with _opened(data, max_bytes, max_unpacked_bytes):
        pass


@contextlib.contextmanager
def _opened(
    data: bytes | Path, max_bytes: int, max_unpacked_bytes: int | None
) -> Iterator[tuple[tarfile.TarFile, list[_Planned]]]:
    """The archive and its checked members; `ModelDefinitionError` otherwise."""
    limit = 4 * max_bytes if max_unpacked_bytes is None else max_unpacked_bytes
    size = data.stat().st_size if isinstance(data, Path) else len(data)
    if size > max_bytes:
        raise ModelDefinitionError(
            f"model definition is {sized(size)}, over the limit of {sized(max_bytes)}"
        )
    invalid = "model definition is not a valid .tar.gz archive"
    stream_limit = limit + MAX_MEMBERS * _HEADER_ALLOWANCE + tarfile.RECORDSIZE
    raw: IO[bytes] = data.open("rb") if isinstance(data, Path) else io.BytesIO(data)
    stream = _BoundedStream(gzip.GzipFile(fileobj=raw, mode="rb"), stream_limit)
    try:
        with tarfile.open(fileobj=stream, mode="r:") as tar:
            yield tar, _plan(tar, stream, limit)
    except _StreamLimitError as e:
        raise ModelDefinitionError(f"model definition is refused: {e.problem}") from None
    except (tarfile.TarError, EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise ModelDefinitionError(f"{invalid}: {e}") from None
    except ValueError as e:
        # tarfile lets some malformed headers (sparse maps, for one) escape as ValueError.
        raise ModelDefinitionError(f"{invalid}: {e}") from None
    except RecursionError:
        # tarfile follows a run of PAX or GNU headers by recursion.
        raise ModelDefinitionError(f"{invalid}: too many extended headers in a row") from None
    finally:
        stream.close()
        raw.close()
