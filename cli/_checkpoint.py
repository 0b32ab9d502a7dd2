"""`assay checkpoint` (`assay c`): list an experiment's checkpoints and copy one out."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path, PurePosixPath

import click

from assay.errors import AssayError

from . import _format as fmt
from ._client import client
from ._common import AliasedGroup, echo_json, user_errors

_CHUNK = 1 << 20


@click.group("checkpoint", cls=AliasedGroup)
def checkpoint() -> None:
    """List and download checkpoints."""


@checkpoint.command("list")
@click.argument("experiment_id", metavar="EXP_ID", type=int)
@click.option("--trial", "trial_id", type=int, help="Only this trial's checkpoints.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@user_errors
def list_command(experiment_id: int, trial_id: int | None, as_json: bool) -> None:
    """List the checkpoints of an experiment."""
    from assay._archive import format_bytes

    checkpoints = [
        fmt.checkpoint_dict(c) for c in client().list_checkpoints(experiment_id, trial_id or 0)
    ]
    if as_json:
        echo_json(checkpoints)
        return
    rows = [
        [
            c["uuid"],
            c["trial_id"],
            c["total_batches"],
            c["state"],
            format_bytes(c["size_bytes"]),
            " ".join(f"{k}={fmt.metric(v)}" for k, v in c["validation_metrics"].items()) or None,
        ]
        for c in checkpoints
    ]
    click.echo(fmt.table(["UUID", "TRIAL", "BATCHES", "STATE", "SIZE", "VALIDATION"], rows))


def _safe_name(name: str) -> PurePosixPath:
    path = PurePosixPath(name)
    if not name or path.is_absolute() or ".." in path.parts or "\\" in name:
        raise AssayError(f"checkpoint lists an unsafe file name {name!r}; refusing to copy it")
    return path


def _copy_verified(src: Path, dst: Path, size: int, sha256: str) -> None:
    digest = hashlib.sha256()
    copied = 0
    dst.parent.mkdir(parents=True, exist_ok=True)
    with src.open("rb") as reader, dst.open("wb") as writer:
        while chunk := reader.read(_CHUNK):
            digest.update(chunk)
            writer.write(chunk)
            copied += len(chunk)
    if copied != size:
        raise AssayError(
            f"{src} is {copied} bytes but the checkpoint records {size}: "
            "the stored checkpoint is damaged or was changed"
        )
    if sha256 and digest.hexdigest() != sha256.lower():
        raise AssayError(
            f"{src} has sha256 {digest.hexdigest()} but the checkpoint records {sha256}: "
            "the stored checkpoint is damaged or was changed"
        )


@checkpoint.command("download")
@click.argument("uuid")
@click.argument("directory", metavar="DIR", type=click.Path(file_okay=False, path_type=Path))
@user_errors
def download_command(uuid: str, directory: Path) -> None:
    """Copy a checkpoint into DIR (new or empty), verifying every file's size and sha256.

    Works for shared_fs storage that is mounted on this machine at the same path.
    """
    from assay._archive import format_bytes

    ckpt = client().get_checkpoint(uuid)
    if fmt.checkpoint_state(ckpt.state) == "DELETED":
        raise AssayError(f"checkpoint {uuid} was deleted")
    location = ckpt.location
    if "://" in location:
        raise AssayError(
            f"checkpoint {uuid} is stored at {location}; this command copies shared_fs "
            "checkpoints only, fetch it with your object store's tools"
        )
    source = Path(location)
    if not location or not source.is_dir():
        raise AssayError(
            f"checkpoint {uuid} lives at {location or '(no location)'} on the cluster's "
            "checkpoint storage, which is not visible from this machine; mount that storage "
            "here at the same path, or run this on a machine that has it"
        )
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise AssayError(f"{directory} already exists and is not empty")
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        if ckpt.files:
            for f in ckpt.files:
                name = _safe_name(f.name)
                src = source.joinpath(*name.parts)
                if not src.is_file():
                    raise AssayError(f"checkpoint {uuid} lists {f.name}, missing from {source}")
                _copy_verified(src, staging.joinpath(*name.parts), f.size_bytes, f.sha256)
            count, total = len(ckpt.files), sum(f.size_bytes for f in ckpt.files)
        else:
            click.echo(f"warning: checkpoint {uuid} lists no files; copied unverified", err=True)
            shutil.copytree(source, staging, dirs_exist_ok=True)
            files = [p for p in staging.rglob("*") if p.is_file()]
            count, total = len(files), sum(p.stat().st_size for p in files)
        if directory.exists():
            directory.rmdir()
        os.replace(staging, directory)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    click.echo(
        f"downloaded checkpoint {uuid} ({count} files, {format_bytes(total)}) to {directory}"
    )
