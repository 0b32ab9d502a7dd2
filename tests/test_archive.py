"""Model-directory archives: round trip, .assayignore, determinism, limits, unsafe members."""

from __future__ import annotations

import io
import json
import os
import tarfile
import time
from pathlib import Path

import pytest

from assay.common.archive import (
    MAX_MODEL_DEF_BYTES,
    ModelDefinitionError,
    pack_model_dir,
    unpack_model_dir,
)
from assay.errors import AssayError


def files_under(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def names_in(data: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return tar.getnames()


def make_tree(root: Path) -> None:
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "model_def.py").write_text("print('hi')\n")
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "sub" / "data.json").write_text('{"a": 1}')
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    (root / "empty").mkdir()


def archive_with(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for info, content in members:
            if content is not None:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
            else:
                tar.addfile(info)
    return buffer.getvalue()


def test_limit_is_96_mib() -> None:
    assert MAX_MODEL_DEF_BYTES == 96 * 2**20
    assert issubclass(ModelDefinitionError, AssayError)


def test_round_trip(tmp_path: Path) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    make_tree(src)

    unpack_model_dir(pack_model_dir(src), dest)

    assert files_under(dest) == files_under(src)
    assert (dest / "empty").is_dir()
    assert os.access(dest / "run.sh", os.X_OK)


def test_multi_mib_file_round_trips(tmp_path: Path) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    (src / "weights.bin").write_bytes(os.urandom(3 * 2**20))

    unpack_model_dir(pack_model_dir(src), dest)

    assert files_under(dest) == files_under(src)


def test_members_are_relative_sorted_and_anonymous(tmp_path: Path) -> None:
    make_tree(tmp_path)

    with tarfile.open(fileobj=io.BytesIO(pack_model_dir(tmp_path)), mode="r:gz") as tar:
        members = tar.getmembers()

    names = [m.name for m in members]
    assert names == sorted(names)
    assert "model_def.py" in names
    assert "pkg/sub/data.json" in names
    assert all(not n.startswith(("/", "./")) for n in names)
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members} == {(0, 0, 0, "", "")}


def test_same_directory_packs_to_same_bytes(tmp_path: Path) -> None:
    make_tree(tmp_path / "a")
    first = pack_model_dir(tmp_path / "a")
    time.sleep(0.01)
    for p in (tmp_path / "a").rglob("*"):
        os.utime(p, (1_000_000, 1_000_000))
    make_tree(tmp_path / "b")

    assert pack_model_dir(tmp_path / "a") == first
    assert pack_model_dir(tmp_path / "b") == first


def test_assayignore_and_always_skipped(tmp_path: Path) -> None:
    make_tree(tmp_path)
    (tmp_path / ".assayignore").write_text(
        "# data and checkpoints stay home\n"
        "\n"
        "data/\n"
        "*.ckpt\n"
        "/top_only.txt\n"
        "logs/**/*.log\n"
        "*.bin\n"
        "!keep.bin\n"
    )
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "big.csv").write_text("x")
    (tmp_path / "pkg" / "data").mkdir()
    (tmp_path / "pkg" / "data" / "nested.csv").write_text("x")
    (tmp_path / "data.txt").write_text("a file named like the dir pattern stays")
    (tmp_path / "model.ckpt").write_text("x")
    (tmp_path / "pkg" / "deep.ckpt").write_text("x")
    (tmp_path / "top_only.txt").write_text("x")
    (tmp_path / "pkg" / "top_only.txt").write_text("kept: the pattern is anchored")
    (tmp_path / "logs" / "a" / "b").mkdir(parents=True)
    (tmp_path / "logs" / "a" / "b" / "run.log").write_text("x")
    (tmp_path / "logs" / "keep.txt").write_text("x")
    (tmp_path / "weights.bin").write_text("x")
    (tmp_path / "keep.bin").write_text("x")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"x")
    (tmp_path / "pkg" / "stale.pyc").write_bytes(b"x")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref")

    names = set(names_in(pack_model_dir(tmp_path)))

    assert {"model_def.py", "data.txt", "pkg/top_only.txt", "logs/keep.txt", "keep.bin"} <= names
    assert ".assayignore" in names
    for gone in (
        "data",
        "data/big.csv",
        "pkg/data",
        "pkg/data/nested.csv",
        "model.ckpt",
        "pkg/deep.ckpt",
        "top_only.txt",
        "logs/a/b/run.log",
        "weights.bin",
        "__pycache__",
        "__pycache__/m.cpython-311.pyc",
        "pkg/stale.pyc",
        ".git",
        ".git/HEAD",
    ):
        assert gone not in names, gone


def test_symlink_inside_is_kept_outside_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_tree(src)
    (src / "alias.py").symlink_to("model_def.py")
    dest = tmp_path / "dest"

    unpack_model_dir(pack_model_dir(src), dest)
    assert (dest / "alias.py").read_text() == "print('hi')\n"

    (tmp_path / "secret").write_text("x")
    (src / "leak").symlink_to(tmp_path / "secret")
    with pytest.raises(ModelDefinitionError, match="outside the model directory"):
        pack_model_dir(src)


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(ModelDefinitionError, match="does not exist"):
        pack_model_dir(tmp_path / "nope")


def test_huge_directory_refused_from_sizes_without_reading(tmp_path: Path) -> None:
    (tmp_path / "model_def.py").write_text("")
    with (tmp_path / "huge.bin").open("wb") as f:
        f.truncate(10 * 2**30)  # sparse: 10 GiB on paper, nothing on disk

    started = time.monotonic()
    with pytest.raises(ModelDefinitionError) as caught:
        pack_model_dir(tmp_path)

    assert time.monotonic() - started < 5
    message = str(caught.value)
    assert str(10 * 2**30) in message
    assert str(4 * MAX_MODEL_DEF_BYTES) in message
    assert ".assayignore" in message


def test_compressed_limit_stops_while_packing(tmp_path: Path) -> None:
    limit = 2**20
    (tmp_path / "noise.bin").write_bytes(os.urandom(3 * 2**20))

    with pytest.raises(ModelDefinitionError) as caught:
        pack_model_dir(tmp_path, max_bytes=limit)

    message = str(caught.value)
    assert f"({limit} bytes)" in message
    assert "over the limit" in message


def test_archive_at_the_limit_is_accepted(tmp_path: Path) -> None:
    (tmp_path / "noise.bin").write_bytes(os.urandom(100_000))
    data = pack_model_dir(tmp_path)

    assert len(pack_model_dir(tmp_path, max_bytes=len(data))) == len(data)
    with pytest.raises(ModelDefinitionError):
        pack_model_dir(tmp_path, max_bytes=len(data) - 1)


@pytest.mark.parametrize(
    ("name", "kind", "linkname"),
    [
        ("/etc/evil", tarfile.REGTYPE, ""),
        ("../evil", tarfile.REGTYPE, ""),
        ("ok/../../evil", tarfile.REGTYPE, ""),
        ("link", tarfile.SYMTYPE, "/etc/passwd"),
        ("link", tarfile.SYMTYPE, "../../outside"),
        ("sub/link", tarfile.SYMTYPE, "../.."),
        ("hard", tarfile.LNKTYPE, "../outside"),
        ("dev", tarfile.CHRTYPE, ""),
        ("fifo", tarfile.FIFOTYPE, ""),
    ],
)
def test_escaping_members_refused(tmp_path: Path, name: str, kind: bytes, linkname: str) -> None:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    data = archive_with(
        (tarfile.TarInfo("first.py"), b"x"), (info, b"x" if kind == tarfile.REGTYPE else None)
    )
    dest = tmp_path / "dest"

    with pytest.raises(ModelDefinitionError):
        unpack_model_dir(data, dest)

    assert not (tmp_path / "evil").exists()
    assert not (dest / "first.py").exists(), "nothing is written before every member is checked"


def test_link_then_write_through_it_refused(tmp_path: Path) -> None:
    link = tarfile.TarInfo("escape")
    link.type = tarfile.SYMTYPE
    link.linkname = ".."
    data = archive_with((link, None), (tarfile.TarInfo("escape/evil"), b"x"))

    with pytest.raises(ModelDefinitionError):
        unpack_model_dir(data, tmp_path / "dest")
    assert not (tmp_path / "evil").exists()


def test_unpacked_size_limit(tmp_path: Path) -> None:
    data = archive_with((tarfile.TarInfo("zeros.bin"), bytes(5 * 2**20)))
    assert len(data) < 2**20  # zeros compress well

    with pytest.raises(ModelDefinitionError, match=r"over the limit of 4\.0 MiB \(4194304 bytes\)"):
        unpack_model_dir(data, tmp_path / "dest", max_bytes=2**20)
    assert not (tmp_path / "dest" / "zeros.bin").exists()


def test_oversized_archive_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelDefinitionError, match="over the limit"):
        unpack_model_dir(b"x" * 101, tmp_path, max_bytes=100)


def test_garbage_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelDefinitionError, match=r"not a valid \.tar\.gz"):
        unpack_model_dir(b"definitely not gzip", tmp_path)


def test_a_local_runs_checkpoints_stay_out_of_the_archive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`run-local` makes ./checkpoints (marked) in the model directory it runs in; a later
    `experiment create` of that directory ships the code, not the checkpoints. A directory
    that existed before, or one the user named, is packed as before."""
    from assay import run_local
    from assay.common.archive import LOCAL_OUTPUT_MARKER, make_local_output_dir
    from tests.conftest import REGRESSION_DIR, regression_config

    model = tmp_path / "model"
    model.mkdir()
    (model / "model_def.py").write_text((REGRESSION_DIR / "model_def.py").read_text())
    monkeypatch.chdir(model)
    result = run_local(config=regression_config(batches=2), model_dir=model)
    assert result.checkpoint is not None
    assert Path(result.checkpoint).parent == model / "checkpoints"
    assert (model / "checkpoints" / LOCAL_OUTPUT_MARKER).is_file()
    assert names_in(pack_model_dir(model)) == ["model_def.py"]

    (model / "weights").mkdir()  # the user's own folder: shipped, and never marked
    (model / "weights" / "w.bin").write_bytes(b"w")
    make_local_output_dir(model / "weights")
    assert not (model / "weights" / LOCAL_OUTPUT_MARKER).exists()
    assert names_in(pack_model_dir(model)) == ["model_def.py", "weights", "weights/w.bin"]


PLAIN_SCRIPT = """\
import assay.core

with assay.core.init() as core:
    core.train.report_training_metrics(steps_completed=1, metrics={"loss": 0.5})
    with core.checkpoint.store_path({"steps_completed": 1}) as (path, uuid):
        (path / "w.txt").write_text("w")
"""


def test_a_plain_runs_output_stays_out_of_the_archive(tmp_path: Path) -> None:
    """A plain `python3 train.py` with the Core API writes ./checkpoints and
    ./assay-metrics where it runs; it marks them when it makes them, so an `experiment
    create` of the same directory ships train.py alone. A ./checkpoints that was there
    before the run stays the user's: unmarked, and packed."""
    import subprocess
    import sys

    from assay.common.archive import LOCAL_OUTPUT_MARKER

    env = {k: v for k, v in os.environ.items() if not k.startswith("ASSAY_")}
    model = tmp_path / "model"
    model.mkdir()
    (model / "train.py").write_text(PLAIN_SCRIPT)

    def run() -> None:
        done = subprocess.run(
            [sys.executable, "train.py"], cwd=model, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr

    run()
    run()  # a second run writes into the marked directories again
    assert (model / "checkpoints" / LOCAL_OUTPUT_MARKER).is_file()
    assert (model / "assay-metrics" / LOCAL_OUTPUT_MARKER).is_file()
    assert len(list((model / "checkpoints").iterdir())) == 3  # two checkpoints, the marker
    lines = (model / "assay-metrics" / "metrics.jsonl").read_text().splitlines()
    runs = [json.loads(line)["run"] for line in lines]  # each run's records say which
    assert len(runs) == 4
    assert runs[0] == runs[1] != runs[2] == runs[3]
    assert names_in(pack_model_dir(model)) == ["train.py"]

    other = tmp_path / "other"
    (other / "checkpoints").mkdir(parents=True)
    (other / "train.py").write_text(PLAIN_SCRIPT)
    model = other
    run()
    assert not (other / "checkpoints" / LOCAL_OUTPUT_MARKER).exists()
    names = names_in(pack_model_dir(other))
    assert "train.py" in names
    assert any(n.startswith("checkpoints/") for n in names)
    assert not any(n.startswith("assay-metrics") for n in names)


def test_packed_checkpoint_files_are_named_in_one_warning(tmp_path: Path) -> None:
    from assay.common.archive import packed_checkpoint_warning

    (tmp_path / "train.py").write_text("print('hi')\n")
    assert packed_checkpoint_warning(pack_model_dir(tmp_path)) is None
    (tmp_path / "lightning_ckpts").mkdir()
    for i in range(4):
        (tmp_path / "lightning_ckpts" / f"epoch={i}.ckpt").write_bytes(b"x" * 1024)
    (tmp_path / "weights.PT").write_bytes(b"x" * 1024)

    warning = packed_checkpoint_warning(pack_model_dir(tmp_path))

    assert warning is not None
    assert warning.startswith("the model directory holds 5 checkpoint files (5.0 KiB: ")
    assert "lightning_ckpts/epoch=0.ckpt" in warning
    assert "and 2 more" in warning
    assert "ckpt_path='last'" in warning
    assert ".assayignore" in warning
    (tmp_path / ".assayignore").write_text("lightning_ckpts/\n*.PT\n")
    assert packed_checkpoint_warning(pack_model_dir(tmp_path)) is None
