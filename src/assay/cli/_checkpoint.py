"""`assay checkpoint` (`assay c`): list an experiment's checkpoints, copy one out, delete some."""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

import click

from assay.client import download_checkpoint, metric
from assay.errors import AssayError

from . import _format as fmt
from ._common import AliasedGroup, client, echo_json, user_errors

if TYPE_CHECKING:
    from assay.proto import common_pb2


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
            " ".join(f"{k}={metric(v)}" for k, v in c["validation_metrics"].items()) or None,
        ]
        for c in checkpoints
    ]
    click.echo(fmt.table(["UUID", "TRIAL", "BATCHES", "STATE", "SIZE", "VALIDATION"], rows))


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
    metrics = " ".join(f"{k}={metric(v)}" for k, v in c["validation_metrics"].items())
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
    if not c["files"]:
        click.echo(f"{'Files:':17}-")
        return
    click.echo(f"Files ({len(c['files'])}):")
    rows = [(f["name"], format_bytes(f["size_bytes"]), f["sha256"] or "-") for f in c["files"]]
    name = max(len("NAME"), *(len(r[0]) for r in rows))
    size = max(len("SIZE"), *(len(r[1]) for r in rows))
    for row in [("NAME", "SIZE", "SHA256"), *rows]:
        click.echo(f"  {row[0]:<{name}}  {row[1]:>{size}}  {row[2]}")


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
    count, total = download_checkpoint(api, uuid, directory)
    click.echo(
        f"downloaded checkpoint {uuid} ({count} files, {format_bytes(total)}) to {directory}"
    )
    if full:
        from assay.strategy import write_full_state_dicts

        for path in write_full_state_dicts(directory):
            click.echo(f"wrote the full state dict {path}")


def _check_sharded(ckpt: common_pb2.Checkpoint) -> None:
    names = [PurePosixPath(f.name) for f in ckpt.files]
    if not any(n.name == "shards.json" and len(n.parts) <= 2 for n in names):
        raise AssayError(
            f"checkpoint {ckpt.uuid} is not sharded: its files are full state dicts already; "
            "download it without --full"
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
