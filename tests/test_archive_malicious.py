"""Hostile model-definition archives: every one refused by master and agent, nothing written.

Each case builds its archive in memory and names the rule that must refuse it. The test
takes a snapshot of a temporary tree holding an `outside/` directory that the archives aim
at, runs `check_model_archive` and `unpack_model_dir` into `dest/`, and requires both to
raise `ModelDefinitionError`, `dest/` not to exist and the rest of the tree to be unchanged.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import random
import stat
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from assay.common.archive import (
    MAX_DEPTH,
    MAX_LINK_DEPTH,
    MAX_MEMBERS,
    MAX_NAME_BYTES,
    MAX_PATH_CHARS,
    ModelDefinitionError,
    check_model_archive,
    unpack_model_dir,
)

LIMIT = 2**20
"""`max_unpacked_bytes` for every case: bombs stay small enough to build quickly."""

OUTSIDE_NOTE = "would be written outside the model directory"
LEADS_OUT = "leads outside the model directory"
INVALID = r"not a valid \.tar\.gz archive"
ELSEWHERE = Path("/etc/assay-evil")

Member = tuple[tarfile.TarInfo, bytes | None]
Builder = Callable[[Path], bytes]


# --- building archives -----------------------------------------------------------------


def info(
    name: str,
    kind: bytes = tarfile.REGTYPE,
    *,
    size: int = 0,
    mode: int = 0o644,
    linkname: str = "",
    pax_headers: dict[str, str] | None = None,
) -> tarfile.TarInfo:
    member = tarfile.TarInfo(name)
    member.type, member.size, member.mode, member.linkname = kind, size, mode, linkname
    member.pax_headers = pax_headers or {}
    return member


def file(
    name: str, data: bytes = b"x", *, mode: int = 0o644, pax_headers: dict[str, str] | None = None
) -> Member:
    return info(name, mode=mode, pax_headers=pax_headers), data


def directory(name: str) -> Member:
    return info(name, tarfile.DIRTYPE, mode=0o755), None


def link(name: str, target: str, *, pax_headers: dict[str, str] | None = None) -> Member:
    return info(name, tarfile.SYMTYPE, linkname=target, pax_headers=pax_headers), None


def hardlink(name: str, target: str) -> Member:
    return info(name, tarfile.LNKTYPE, linkname=target), None


def node(name: str, kind: bytes) -> Member:
    return info(name, kind), None


def tar_bytes(*members: Member, fmt: int = tarfile.PAX_FORMAT) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as tar:
        for member, content in members:
            if content is None and member.isreg() and member.size:
                _header_only(tar, member)
            elif content is None:
                tar.addfile(member)
            else:
                member.size = len(content)
                tar.addfile(member, io.BytesIO(content))
    return buffer.getvalue()


def _header_only(tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
    """A file's header without the data it declares, as `addfile` wrote one before
    Python 3.13 (which refuses a non-empty file without its contents)."""
    header = member.tobuf(tar.format, tar.encoding, tar.errors)
    assert tar.fileobj is not None
    tar.fileobj.write(header)
    tar.offset += len(header)


def tar_gz(*members: Member, fmt: int = tarfile.PAX_FORMAT) -> bytes:
    return gzip.compress(tar_bytes(*members, fmt=fmt), mtime=0)


def lying_size() -> bytes:
    """A header that declares 10,000 bytes of data, followed by only 100."""
    header = info("model.py", size=10_000).tobuf(tarfile.USTAR_FORMAT)
    return gzip.compress(header + b"x" * 100, mtime=0)


def pax_header_chain(count: int) -> bytes:
    """`count` PAX extended headers in a row before one empty file."""
    record = b"comment=x\n"
    record = str(len(record) + 3).encode() + b" " + record
    pax = info("PaxHeader", tarfile.XHDTYPE, size=len(record)).tobuf(tarfile.USTAR_FORMAT)
    one = pax + record.ljust(tarfile.BLOCKSIZE, b"\0")
    last = info("model.py").tobuf(tarfile.USTAR_FORMAT)
    return gzip.compress(one * count + last + bytes(2 * tarfile.BLOCKSIZE), mtime=0)


def sparse_map_bomb() -> bytes:
    """A GNU sparse file (format 1.0) whose map claims a billion regions."""
    sparse = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.realsize": "0"}
    return tar_gz(file("f", b"1000000000\n" + b"0\n" * 2**20, pax_headers=sparse))


def truncated() -> bytes:
    noise = random.Random(0).randbytes(64 * 2**10)
    data = tar_gz(file("model.py", noise), file("later.py"))
    return data[: len(data) // 2]


def link_chain(length: int) -> list[Member]:
    chain = [link(f"l{i}", f"l{i + 1}") for i in range(length)]
    return [*chain, file(f"l{length}")]


# --- the cases -------------------------------------------------------------------------

MALICIOUS: dict[str, tuple[Builder, str]] = {
    # Paths that climb out or start elsewhere.
    "dotdot": (lambda out: tar_gz(file("../outside/evil")), OUTSIDE_NOTE),
    "dotdot_nested": (lambda out: tar_gz(file("a/../../outside/evil")), OUTSIDE_NOTE),
    "dot_then_dotdot": (lambda out: tar_gz(file("./../outside/evil")), OUTSIDE_NOTE),
    "dotdot_staying_inside": (lambda out: tar_gz(file("a/../evil")), "has '..' in its path"),
    "absolute_into_outside": (lambda out: tar_gz(file(str(out / "evil"))), "absolute path"),
    "absolute_etc": (lambda out: tar_gz(file(str(ELSEWHERE))), "absolute path"),
    "windows_dotdot": (lambda out: tar_gz(file("..\\outside\\evil")), "Windows-style path"),
    "windows_drive": (lambda out: tar_gz(file("C:\\evil")), "Windows-style path"),
    "windows_drive_slash": (lambda out: tar_gz(file("C:/evil")), "Windows-style path"),
    "nul_in_name": (
        lambda out: tar_gz(file("model.py", pax_headers={"path": "model\0.py"})),
        "NUL character in its path",
    ),
    "empty_name": (lambda out: tar_gz(file("")), "empty path"),
    # Symbolic links that lead out, directly or through other links.
    "symlink_absolute": (lambda out: tar_gz(link("l", str(out))), "absolute path"),
    "symlink_dotdot": (lambda out: tar_gz(link("l", "../outside")), LEADS_OUT),
    "symlink_nested_dotdot": (
        lambda out: tar_gz(directory("sub"), link("sub/l", "../../outside")),
        LEADS_OUT,
    ),
    "symlink_to_parent_of_root": (lambda out: tar_gz(link("sub/l", "../..")), LEADS_OUT),
    "symlink_chain": (
        lambda out: tar_gz(link("a", "b"), link("b", "../outside/secret")),
        LEADS_OUT,
    ),
    "symlink_to_symlink_escaping": (
        lambda out: tar_gz(link("a", "sub/b"), directory("sub"), link("sub/b", "../../outside")),
        LEADS_OUT,
    ),
    # `d/up/..` normalises to `d`, but `d` is `sub` and `sub/up` is the root: it escapes.
    "symlink_chain_lexically_inside": (
        lambda out: tar_gz(
            directory("sub"), link("d", "sub"), link("sub/up", ".."), link("x", "d/up/..")
        ),
        LEADS_OUT,
    ),
    "symlink_dir_then_file_through_it": (
        lambda out: tar_gz(link("l", str(out)), file("l/evil")),
        "absolute path",
    ),
    "symlink_parent_then_file_through_it": (
        lambda out: tar_gz(link("l", ".."), file("l/outside/evil")),
        "through the symbolic link 'l'",
    ),
    "symlink_inside_then_file_through_it": (
        lambda out: tar_gz(directory("sub"), link("l", "sub"), file("l/evil")),
        "through the symbolic link 'l'",
    ),
    "symlink_loop": (lambda out: tar_gz(link("a", "b"), link("b", "a")), "loop"),
    "symlink_chain_too_long": (
        lambda out: tar_gz(*link_chain(MAX_LINK_DEPTH + 1)),
        f"more than {MAX_LINK_DEPTH} links",
    ),
    "symlink_replacing_model_dir": (
        lambda out: tar_gz(link(".", str(out))),
        "would replace the model directory itself",
    ),
    "symlink_empty_target": (lambda out: tar_gz(link("l", "")), "empty link target"),
    "symlink_nul_in_target": (
        lambda out: tar_gz(link("l", "ok", pax_headers={"linkpath": "model\0.py"})),
        "NUL character in its link target",
    ),
    "symlink_windows_target": (
        lambda out: tar_gz(link("l", "..\\outside")),
        "Windows-style link target",
    ),
    "symlink_long_target": (
        lambda out: tar_gz(link("l", "a/" * MAX_PATH_CHARS)),
        f"over the limit of {MAX_PATH_CHARS}",
    ),
    # Hard links, devices and other special files.
    "hardlink_outside": (lambda out: tar_gz(hardlink("h", "../outside/secret")), "hard link"),
    "hardlink_absolute": (lambda out: tar_gz(hardlink("h", str(out / "secret"))), "hard link"),
    "hardlink_inside": (lambda out: tar_gz(file("f"), hardlink("h", "f")), "hard link"),
    "character_device": (lambda out: tar_gz(node("tty", tarfile.CHRTYPE)), "character device"),
    "block_device": (lambda out: tar_gz(node("sda", tarfile.BLKTYPE)), "block device"),
    "fifo": (lambda out: tar_gz(node("pipe", tarfile.FIFOTYPE)), "FIFO"),
    "unknown_type": (lambda out: tar_gz(node("odd", b"Z")), "unsupported type"),
    # Members that replace earlier ones.
    "file_replaced_by_symlink": (
        lambda out: tar_gz(file("model.py"), link("model.py", str(out / "secret"))),
        "would replace the file",
    ),
    "file_replaced_by_file": (
        lambda out: tar_gz(file("model.py"), file("model.py", b"y")),
        "would replace the file",
    ),
    "symlink_replaced_by_directory": (
        lambda out: tar_gz(link("d", "sub"), directory("d"), file("d/evil")),
        "would replace the symbolic link",
    ),
    "directory_replaced_by_symlink": (
        lambda out: tar_gz(file("pkg/a.py"), link("pkg", str(out))),
        "would replace the directory",
    ),
    # Too much: entries, bytes, header sizes, path lengths.
    "too_many_members": (
        lambda out: tar_gz(*(directory(f"d{i}") for i in range(MAX_MEMBERS + 1))),
        f"more than {MAX_MEMBERS} entries",
    ),
    "gzip_bomb": (lambda out: tar_gz(file("zeros.bin", bytes(2 * LIMIT))), "unpacks to more"),
    "declared_size_huge": (
        lambda out: tar_gz((info("huge.bin", size=2**40), None)),
        "unpacks to more",
    ),
    "nested_total_past_limit": (
        lambda out: tar_gz(*(file(f"a/b/c{i}.bin", bytes(LIMIT // 3 + 1)) for i in range(3))),
        "unpacks to more",
    ),
    "pax_header_bomb": (
        lambda out: tar_gz(file("model.py", pax_headers={"comment": "x" * 2 * 2**20})),
        "tar headers for one member",
    ),
    "gnu_longname_bomb": (
        lambda out: tar_gz(file("a/" * 2**20 + "f"), fmt=tarfile.GNU_FORMAT),
        "tar headers for one member",
    ),
    "pax_header_chain": (lambda out: pax_header_chain(5000), "too many extended headers"),
    "sparse_map_bomb": (lambda out: sparse_map_bomb(), "tar headers for one member"),
    "sparse_map_malformed": (
        lambda out: tar_gz(file("f", pax_headers={"GNU.sparse.map": "0,x"})),
        INVALID,
    ),
    "long_path": (
        lambda out: tar_gz(file("/".join(["d" * 100] * 50))),
        f"over the limit of {MAX_PATH_CHARS}",
    ),
    "long_component": (
        lambda out: tar_gz(file("a" * (MAX_NAME_BYTES + 1))),
        f"over the limit of {MAX_NAME_BYTES}",
    ),
    "deep_nesting": (
        lambda out: tar_gz(file("a/" * (MAX_DEPTH + 1) + "f")),
        f"over the limit of {MAX_DEPTH}",
    ),
    # Names hidden in extended headers.
    "pax_path_override": (
        lambda out: tar_gz(file("safe.py", pax_headers={"path": "../outside/evil"})),
        OUTSIDE_NOTE,
    ),
    "pax_linkpath_override": (
        lambda out: tar_gz(link("l", "ok", pax_headers={"linkpath": "../outside"})),
        LEADS_OUT,
    ),
    "gnu_longname_dotdot": (
        lambda out: tar_gz(file("a" * 120 + "/../../outside/evil"), fmt=tarfile.GNU_FORMAT),
        OUTSIDE_NOTE,
    ),
    "gnu_longlink_escape": (
        lambda out: tar_gz(link("l", "x/../" * 30 + "../outside"), fmt=tarfile.GNU_FORMAT),
        LEADS_OUT,
    ),
    # Not a (complete) gzip-compressed tar.
    "not_gzip": (lambda out: b"PK\x03\x04" + bytes(100), INVALID),
    "plain_tar": (lambda out: tar_bytes(file("model.py")), INVALID),
    "truncated": (lambda out: truncated(), INVALID),
    "lying_size_header": (lambda out: lying_size(), INVALID),
}


def snapshot(root: Path) -> dict[str, str]:
    """Everything under `root`, links not followed: kind, mode and content of each entry."""
    seen: dict[str, str] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder, name)
            st = path.lstat()
            rel = path.relative_to(root).as_posix()
            if stat.S_ISLNK(st.st_mode):
                seen[rel] = f"link -> {os.readlink(path)}"
            elif stat.S_ISDIR(st.st_mode):
                seen[rel] = f"dir {st.st_mode:o}"
            else:
                seen[rel] = f"file {st.st_mode:o} {hashlib.sha256(path.read_bytes()).hexdigest()}"
    return seen


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "secret").write_text("untouched\n")
    (folder / "link").symlink_to("secret")
    return folder


def test_there_are_enough_cases() -> None:
    assert len(MALICIOUS) >= 25


@pytest.mark.parametrize("case", list(MALICIOUS))
def test_malicious_archive_is_refused(case: str, tmp_path: Path, outside: Path) -> None:
    build, rule = MALICIOUS[case]
    data = build(outside)
    dest = tmp_path / "dest"
    before = snapshot(tmp_path)

    with pytest.raises(ModelDefinitionError, match=rule):
        check_model_archive(data, max_unpacked_bytes=LIMIT)
    with pytest.raises(ModelDefinitionError, match=rule):
        unpack_model_dir(data, dest, max_unpacked_bytes=LIMIT)

    assert not dest.exists()
    assert not dest.is_symlink()
    assert snapshot(tmp_path) == before
    assert not ELSEWHERE.exists()


def test_refusal_names_the_member_and_the_rule(tmp_path: Path) -> None:
    with pytest.raises(ModelDefinitionError) as caught:
        unpack_model_dir(tar_gz(file("ok.py"), file("../x")), tmp_path / "dest")

    assert str(caught.value) == "archive member '../x' would be written outside the model directory"


def test_default_limit_refuses_a_declared_terabyte(tmp_path: Path) -> None:
    data = tar_gz((info("huge.bin", size=2**40), None))

    with pytest.raises(ModelDefinitionError, match=r"over the limit of 384\.0 MiB"):
        check_model_archive(data)
    with pytest.raises(ModelDefinitionError, match=r"over the limit of 384\.0 MiB"):
        unpack_model_dir(data, tmp_path / "dest")
    assert list(tmp_path.iterdir()) == []


# --- what is still accepted ------------------------------------------------------------


def test_nested_dirs_and_inside_links_extract(tmp_path: Path) -> None:
    data = tar_gz(
        directory("."),
        directory("./pkg"),
        file("./pkg/model.py", b"MODEL"),
        file("pkg/sub/config.json", b"{}"),
        link("alias.py", "pkg/model.py"),
        link("alias2.py", "alias.py"),
        link("data", "pkg/sub"),
        link("config.json", "data/config.json"),
        link("pkg/sub/up.py", "../model.py"),
        link("pkg/sub/root", "../.."),
        link("later.py", "pkg/not_yet.py"),
        file("pkg/not_yet.py", b"LATER"),
        directory("pkg"),
    )
    dest = tmp_path / "dest"

    check_model_archive(data)
    unpack_model_dir(data, dest)

    assert (dest / "pkg" / "model.py").read_bytes() == b"MODEL"
    assert (dest / "alias2.py").read_bytes() == b"MODEL"
    assert (dest / "config.json").read_bytes() == b"{}"
    assert (dest / "pkg" / "sub" / "up.py").read_bytes() == b"MODEL"
    assert (dest / "pkg" / "sub" / "root" / "pkg" / "model.py").read_bytes() == b"MODEL"
    assert (dest / "later.py").read_bytes() == b"LATER"
    assert os.readlink(dest / "data") == "pkg/sub"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dest"], "no staging left behind"


def test_special_mode_bits_are_stripped(tmp_path: Path) -> None:
    data = tar_gz(
        (info("sticky", tarfile.DIRTYPE, mode=0o1777), None),
        file("setuid.sh", mode=0o6755),
        file("open.txt", mode=0o4666),
    )
    dest = tmp_path / "dest"

    unpack_model_dir(data, dest)

    for name in ("sticky", "setuid.sh", "open.txt"):
        mode = stat.S_IMODE((dest / name).stat().st_mode)
        assert mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX | 0o022) == 0, name
    assert os.access(dest / "setuid.sh", os.X_OK)
    assert not os.access(dest / "open.txt", os.X_OK)


def test_members_at_every_limit_are_accepted(tmp_path: Path) -> None:
    deep = "/".join(["d"] * (MAX_DEPTH - 1)) + "/f"
    long_name = "/".join(["n" * 99] * 10)
    long_name += "/" + "n" * (MAX_PATH_CHARS - len(long_name) - 1)
    members = [
        file(deep),
        file(long_name),
        file("c" * MAX_NAME_BYTES),
        *link_chain(MAX_LINK_DEPTH),
    ]
    members.append(file("full.bin", bytes(LIMIT - sum(len(data or b"") for _, data in members))))
    filler = [directory(f"e{i}") for i in range(MAX_MEMBERS - len(members))]

    assert len(long_name) == MAX_PATH_CHARS
    check_model_archive(tar_gz(*members, *filler), max_unpacked_bytes=LIMIT)
    unpack_model_dir(tar_gz(*members), tmp_path / "dest", max_unpacked_bytes=LIMIT)
    assert (tmp_path / "dest" / "l0").read_bytes() == b"x"


def test_failed_extraction_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    data = tar_gz(file("a.py"), directory("pkg"), file("pkg/b.py"), link("c.py", "a.py"))
    monkeypatch.setattr(os, "symlink", refuse)

    with pytest.raises(OSError, match="disk full"):
        unpack_model_dir(data, tmp_path / "dest")
    assert list(tmp_path.iterdir()) == []


def test_destination_must_be_missing_or_empty(tmp_path: Path) -> None:
    data = tar_gz(file("model.py"))
    dest = tmp_path / "dest"
    dest.mkdir()

    unpack_model_dir(data, dest)
    assert (dest / "model.py").read_bytes() == b"x"

    with pytest.raises(FileExistsError):
        unpack_model_dir(data, dest)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dest"]
