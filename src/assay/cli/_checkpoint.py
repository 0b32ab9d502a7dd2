"""`assay checkpoint` (`assay c`): list an experiment's checkpoints, copy one out, delete some."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, BinaryIO

import click

from assay.errors import AssayError

from . import _format as fmt
from ._client import Client, client
from ._common import AliasedGroup, echo_json, user_errors
from ._download import NotFollowedError, copy_tree, opened_dir, opened_file, write_new

if TYPE_CHECKING:
    from assay.common.storage import S3Storage
    from assay.config import CheckpointStorageConfig
    from assay.proto import common_pb2

_CHUNK = 1 << 20
MANIFEST = "metadata.json"
# Copies a checkpoint's files into a staging directory; returns (files, bytes).
Fetch = Callable[[Path], tuple[int, int]]


@click.group("checkpoint", cls=AliasedGroup)
def checkpoint() -> None:
    """List, download and delete checkpoints."""


@checkpoint.command("list")
@click.argument("experiment_id", metavar="EXP_ID", type=int)
@click.option("--trial", "trial_id", type=int, help="Only this trial's checkpoints.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@click.option("--all", "show_all", is_flag=True, help="Include DELETED checkpoints.")
@user_errors
def list_command(experiment_id: int, trial_id: int | None, as_json: bool, show_all: bool) -> None:
    """List the checkpoints of an experiment (not the deleted ones, unless --all)."""
    from assay.common.archive import format_bytes

    checkpoints = [
        fmt.checkpoint_dict(c) for c in client().list_checkpoints(experiment_id, trial_id or 0)
    ]
    if not show_all:
        checkpoints = [c for c in checkpoints if c["state"] != "DELETED"]
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


def _copy_verified(reader: BinaryIO, shown: str, dst: Path, size: int, sha256: str) -> None:
    digest = hashlib.sha256()
    copied = 0
    dst.parent.mkdir(parents=True, exist_ok=True)
    with dst.open("xb") as writer:
        while chunk := reader.read(_CHUNK):
            digest.update(chunk)
            writer.write(chunk)
            copied += len(chunk)
    _check(shown, copied, digest.hexdigest(), size, sha256)


def _verify(path: Path, shown: str, size: int, sha256: str) -> None:
    digest = hashlib.sha256()
    with path.open("rb") as reader:
        while chunk := reader.read(_CHUNK):
            digest.update(chunk)
    _check(shown, path.stat().st_size, digest.hexdigest(), size, sha256)


def _check(shown: str, got_size: int, got_sha: str, size: int, sha256: str) -> None:
    if got_size != size:
        raise AssayError(
            f"{shown} is {got_size} bytes but the checkpoint records {size}: "
            "the stored checkpoint is damaged or was changed"
        )
    if sha256 and got_sha != sha256.lower():
        raise AssayError(
            f"{shown} has sha256 {got_sha} but the checkpoint records {sha256}: "
            "the stored checkpoint is damaged or was changed"
        )


@checkpoint.command("describe")
@click.argument("uuid")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@user_errors
def describe_command(uuid: str, as_json: bool) -> None:
    """Show a checkpoint: its trial, batches, state, where it is stored, its validation
    metrics and its files with their sizes and sha256s."""
    from assay.common.archive import format_bytes

    c = fmt.checkpoint_dict(client().get_checkpoint(uuid))
    if as_json:
        echo_json(c)
        return
    metrics = " ".join(f"{k}={fmt.metric(v)}" for k, v in c["validation_metrics"].items())
    fields = [
        ("UUID", c["uuid"]),
        ("Experiment", c["experiment_id"]),
        ("Trial", c["trial_id"]),
        ("Run", c["run_id"]),
        ("Batches", c["total_batches"]),
        ("State", c["state"]),
        ("Location", c["location"] or None),
        ("Size", format_bytes(c["size_bytes"])),
        ("Validation", metrics or None),
        ("Metadata", ", ".join(f"{k}={v}" for k, v in c["user_metadata"].items()) or None),
    ]
    for key, value in fields:
        click.echo(f"{key + ':':17}{'-' if value is None else value}")
    click.echo("Files:")
    for f in c["files"]:
        click.echo(f"  {f['name']}  {format_bytes(f['size_bytes'])}  {f['sha256'] or '-'}")


@checkpoint.command("download")
@click.argument("uuid")
@click.argument(
    "directory", metavar="[DIR]", required=False, type=click.Path(file_okay=False, path_type=Path)
)
@click.option(
    "-o",
    "--output-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where to put it, as Determined's flag says (the same as DIR; default: "
    "./checkpoints/UUID).",
)
@click.option(
    "--full",
    is_flag=True,
    help="Also write full_state_dict.pt beside the shards of a sharded (FSDP) checkpoint.",
)
@user_errors
def download_command(
    uuid: str, directory: Path | None, output_dir: Path | None, full: bool
) -> None:
    """Copy a checkpoint into DIR (new or empty; default ./checkpoints/UUID), verifying
    every file's size and sha256.

    shared_fs checkpoints are copied from the storage mounted on this machine at the same
    path; s3 checkpoints are downloaded with the experiment's checkpoint_storage settings
    (endpoint_url, region, access_key/secret_key), or boto3's usual credentials (AWS_*
    variables, ~/.aws) when the config has none.

    With --full, a sharded checkpoint (written by every rank of an FSDP trial) also gets a
    plain `torch.save`d `{"model": ..., "optimizer": ...}` state dict of full tensors,
    `full_state_dict.pt`, beside its shards: what you hand on. It is gathered here, in
    this process, from the verified shards.
    """
    from assay.common.archive import format_bytes

    if directory is not None and output_dir is not None and directory != output_dir:
        raise click.UsageError(f"give DIR or --output-dir, not both ({directory}, {output_dir})")
    directory = directory or output_dir or Path("checkpoints") / uuid
    api = client()
    if full:
        _check_sharded(api.get_checkpoint(uuid))
    count, total = download(api, uuid, directory)
    click.echo(
        f"downloaded checkpoint {uuid} ({count} files, {format_bytes(total)}) to {directory}"
    )
    if full:
        from assay.strategy._sharded import write_full_state_dicts

        for path in write_full_state_dicts(directory):
            click.echo(f"wrote the full state dict {path}")


def _check_sharded(ckpt: common_pb2.Checkpoint) -> None:
    names = [PurePosixPath(f.name) for f in ckpt.files]
    if not any(n.name == "shards.json" and len(n.parts) <= 2 for n in names):
        raise AssayError(
            f"checkpoint {ckpt.uuid} is not sharded: its files are full state dicts already; "
            "download it without --full"
        )


def download(api: Client, uuid: str, directory: Path) -> tuple[int, int]:
    """Copy checkpoint `uuid` into `directory` (new or empty), every file verified against
    what the master recorded; (files, bytes). Nothing is left behind on failure."""
    ckpt = api.get_checkpoint(uuid)
    if fmt.checkpoint_state(ckpt.state) == "DELETED":
        raise AssayError(f"checkpoint {uuid} was deleted")
    fetch = _s3_fetcher(ckpt, api) if "://" in ckpt.location else _shared_fs_fetcher(ckpt)
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise AssayError(f"{directory} already exists and is not empty")
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        count, total = fetch(staging)
        if directory.exists():
            directory.rmdir()
        os.replace(staging, directory)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return count, total


def _shared_fs_fetcher(ckpt: common_pb2.Checkpoint) -> Fetch:
    """Its files read from the storage mounted here; the trial that wrote them may have
    planted links there, so nothing is read through one (`_download`)."""
    uuid, location = ckpt.uuid, ckpt.location
    source = Path(location)
    if not location or not source.parent.is_dir() or not os.path.lexists(source):
        raise AssayError(
            f"checkpoint {uuid} lives at {location or '(no location)'} on the cluster's "
            "checkpoint storage, which is not visible from this machine; mount that storage "
            "here at the same path, or run this on a machine that has it"
        )

    def fetch(staging: Path) -> tuple[int, int]:
        try:
            with opened_dir(source.parent, PurePosixPath(source.name)) as fd:
                return _fetch_shared_fs(ckpt, fd, source, staging)
        except NotFollowedError as e:
            raise AssayError(
                f"checkpoint {uuid}: {e} (a checkpoint holds regular files only: the stored "
                "checkpoint was changed after its trial reported it)"
            ) from None

    return fetch


def _fetch_shared_fs(
    ckpt: common_pb2.Checkpoint, fd: int, source: Path, staging: Path
) -> tuple[int, int]:
    if not ckpt.files:
        click.echo(f"warning: checkpoint {ckpt.uuid} lists no files; copied unverified", err=True)
        copied = copy_tree(source.parent, PurePosixPath(source.name), staging)
        _say_skipped(copied.skipped)
        return copied.files, copied.bytes
    for f in ckpt.files:
        name = _safe_name(f.name)
        shown = str(source.joinpath(*name.parts))
        try:
            with opened_file(fd, name) as reader:
                dst = staging.joinpath(*name.parts)
                _copy_verified(reader, shown, dst, f.size_bytes, f.sha256)
        except FileNotFoundError:
            raise AssayError(
                f"checkpoint {ckpt.uuid} lists {f.name}, missing from {source}"
            ) from None
    if MANIFEST not in {f.name for f in ckpt.files}:  # so that the copy can be restored from
        try:
            with opened_file(fd, PurePosixPath(MANIFEST)) as reader:
                write_new(reader, staging / MANIFEST)
        except FileNotFoundError:
            pass
        except NotFollowedError as e:
            _say_skipped([f"{source.name}/{e}"])
    return len(ckpt.files), sum(f.size_bytes for f in ckpt.files)


def _say_skipped(skipped: list[str]) -> None:
    for line in skipped:
        click.echo(f"warning: skipped {line}", err=True)


def _s3_fetcher(ckpt: common_pb2.Checkpoint, api: Client) -> Fetch:
    from assay.common.storage import StorageError, storage_at

    try:
        storage, uuid = storage_at(ckpt.location, _storage_config(ckpt.experiment_id, api))
    except StorageError as e:
        raise AssayError(f"checkpoint {ckpt.uuid}: {e}") from None
    s3: S3Storage = storage  # type: ignore[assignment]  # storage_at gives S3 for s3://

    def fetch(staging: Path) -> tuple[int, int]:
        if not ckpt.files:
            click.echo(f"warning: checkpoint {uuid} lists no files; copied unverified", err=True)
            s3.download(uuid, staging)
            files = [p for p in staging.rglob("*") if p.is_file()]
            return len(files), sum(p.stat().st_size for p in files)
        for f in ckpt.files:
            name = _safe_name(f.name)
            target = staging.joinpath(*name.parts)
            s3.download_file(uuid, name.as_posix(), target)
            _verify(target, f"{ckpt.location}/{f.name}", f.size_bytes, f.sha256)
        s3.download_file(uuid, MANIFEST, staging / MANIFEST)
        return len(ckpt.files), sum(f.size_bytes for f in ckpt.files)

    return fetch


def _storage_config(
    experiment_id: int, api: Client | None = None
) -> CheckpointStorageConfig | None:
    """The experiment's S3 settings (endpoint, region, keys), as far as they are set."""
    from assay.config import CheckpointStorageConfig

    config = fmt.struct((api or client()).get_experiment(experiment_id).experiment.config)
    storage = config.get("checkpoint_storage")
    if not isinstance(storage, dict) or storage.get("type") != "s3":
        return None

    def text(key: str) -> str | None:
        value = storage.get(key)
        # The master masks keys as "********": boto3's chain (AWS_*, ~/.aws) supplies them.
        return value if isinstance(value, str) and value and value != "********" else None

    return CheckpointStorageConfig(
        type="s3",
        bucket=text("bucket"),
        prefix=text("prefix") or "",
        endpoint_url=text("endpoint_url"),
        region=text("region"),
        access_key=text("access_key"),
        secret_key=text("secret_key"),
    )


@checkpoint.command("delete")
@click.argument("uuids", metavar="UUID...", nargs=-1, required=True)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@user_errors
def delete_command(uuids: tuple[str, ...], yes: bool) -> None:
    """Delete checkpoints from storage; the master keeps them listed as DELETED.

    The master refuses (and deletes none) if one is the latest checkpoint of a trial that
    has not ended, which would restore from it.
    """
    wanted = list(dict.fromkeys(uuids))
    if not yes:
        what = wanted[0] if len(wanted) == 1 else f"{len(wanted)} checkpoints"
        try:
            sure = click.confirm(f"Delete {what} from checkpoint storage for good?", default=False)
        except click.Abort:  # no answer (stdin closed, or Ctrl-D)
            sure = False
        if not sure:
            raise AssayError("nothing deleted (pass --yes to skip this question)")
    answer = client().delete_checkpoints(wanted)
    missing = set(answer.missing)
    for uuid in answer.deleted:
        note = " (its files were already gone)" if uuid in missing else ""
        click.echo(f"deleted {uuid}{note}")
    if answer.failed:
        for uuid, why in sorted(answer.failed.items()):
            click.echo(f"failed {uuid}: {why}", err=True)
        raise AssayError(
            f"{len(answer.failed)} of {len(wanted)} checkpoints could not be deleted "
            "(they are unchanged; run the command again to retry)"
        )
