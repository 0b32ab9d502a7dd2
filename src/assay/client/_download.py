"""Reading what a trial wrote on shared storage without following what it planted there.

A trial runs its user's code, and its checkpoints and TensorBoard files sit in a
directory that code can write: any name in them may be a symbolic link, to
`~/.ssh/id_rsa` of whoever downloads them, or a FIFO that blocks the reader. So every
path below the storage's own directory is opened one component at a time, relative to
its parent and without following a link (`O_NOFOLLOW`), and only regular files and
directories are read: a download never reads outside the trial's directory, whatever
the trial renamed in the meantime. What is left out is listed, for the command to say.
The archive code (`assay.common.archive`) holds model definitions to the same rule.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from assay.errors import AssayError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO a trial put in place of a file must not wait for a writer.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CHUNK = 1 << 20


class NotFollowedError(AssayError):
    """A name in a trial's directory is a link or not a regular file: it was not read."""

    def __init__(self, name: str, why: str) -> None:
        super().__init__(f"{name}: {why}, not followed")
        self.name, self.why = name, why


@dataclass
class Copied:
    """What `copy_tree` copied, and what it left out (one line each, saying why)."""

    files: int = 0
    bytes: int = 0
    skipped: list[str] = field(default_factory=list)


@contextlib.contextmanager
def opened_dir(base: Path, relative: PurePosixPath) -> Iterator[int]:
    """A descriptor of `base/relative`, each component of `relative` opened without
    following a link (`base` itself is the storage's, and trusted); `NotFollowedError`
    names the first component that is a link or not a directory."""
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        walked = PurePosixPath()
        for part in relative.parts:
            walked /= part
            fd = _replace(fd, _open_dir_at(fd, part, str(walked)))
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def opened_file(dir_fd: int, relative: PurePosixPath) -> Iterator[BinaryIO]:
    """The regular file `relative` under the directory `dir_fd`, reached without
    following a link; `NotFollowedError` otherwise."""
    fd = os.dup(dir_fd)
    try:
        walked = PurePosixPath()
        for part in relative.parent.parts:
            walked /= part
            fd = _replace(fd, _open_dir_at(fd, part, str(walked)))
        file_fd = _open_file_at(fd, relative.name, str(relative))
    finally:
        os.close(fd)
    with os.fdopen(file_fd, "rb") as reader:
        yield reader


def copy_tree(base: Path, relative: PurePosixPath, target: Path) -> Copied:
    """Copy the regular files and directories under `base/relative` into `target` (an
    empty directory), never through a link: links, FIFOs, sockets and devices are left
    out and listed in `skipped`, by their name under `relative`."""
    copied = Copied()
    with opened_dir(base, relative) as root:
        pending: list[tuple[int, PurePosixPath]] = [(os.dup(root), PurePosixPath())]
        try:
            while pending:
                fd, at = pending.pop()
                try:
                    for entry in sorted(os.scandir(fd), key=lambda e: e.name):
                        _copy_entry(fd, at, entry, target, relative, copied, pending)
                finally:
                    os.close(fd)
        finally:
            for fd, _ in pending:
                os.close(fd)
    return copied


def _copy_entry(
    fd: int,
    at: PurePosixPath,
    entry: os.DirEntry[str],
    target: Path,
    relative: PurePosixPath,
    copied: Copied,
    pending: list[tuple[int, PurePosixPath]],
) -> None:
    name = at / entry.name
    shown = str(relative / name)
    try:
        if entry.is_dir(follow_symlinks=False):
            child = _open_dir_at(fd, entry.name, shown)
            (target / name).mkdir(mode=0o755)
            pending.append((child, name))
            return
        if not entry.is_file(follow_symlinks=False):
            raise NotFollowedError(shown, _what(fd, entry.name))
        source = _open_file_at(fd, entry.name, shown)
    except NotFollowedError as e:
        copied.skipped.append(str(e))
        return
    with os.fdopen(source, "rb") as reader:
        copied.bytes += write_new(reader, target / name)
    copied.files += 1


def write_new(reader: BinaryIO, path: Path) -> int:
    """Copy `reader` into a new file at `path` (never through a link); the bytes copied."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    count = 0
    with os.fdopen(os.open(path, flags, 0o644), "wb") as writer:
        while chunk := reader.read(_CHUNK):
            writer.write(chunk)
            count += len(chunk)
    return count


def _open_dir_at(dir_fd: int, name: str, shown: str) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise NotFollowedError(shown, _what(dir_fd, name)) from None
        raise


def _open_file_at(dir_fd: int, name: str, shown: str) -> int:
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO):  # a link; a FIFO without a writer
            raise NotFollowedError(shown, _what(dir_fd, name)) from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotFollowedError(shown, _what(dir_fd, name))
    os.set_blocking(fd, True)
    return fd


def _what(dir_fd: int, name: str) -> str:
    """What `name` is, for a message: a link says where it points."""
    try:
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except OSError:
        return "not a regular file"
    if stat.S_ISLNK(mode):
        try:
            return f"a symbolic link (to {os.readlink(name, dir_fd=dir_fd)})"
        except OSError:
            return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a directory where a file was expected"
    if stat.S_ISREG(mode):
        return "a file where a directory was expected"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def _replace(old: int, new: int) -> int:
    os.close(old)
    return new


__all__ = ["Copied", "NotFollowedError", "copy_tree", "opened_dir", "opened_file", "write_new"]
