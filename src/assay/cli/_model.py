"""`assay model` (`assay m`): the model registry: named models, their numbered versions
(each a checkpoint, kept from deletion while registered in a model of its own
workspace), and downloads of them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from assay.client import download_checkpoint, metric, struct
from assay.errors import AssayError

from . import _format as fmt
from ._common import AliasedGroup, client, echo_json, user_errors

if TYPE_CHECKING:
    from assay.proto import api_pb2

_LABEL = click.option(
    "--label", "labels", multiple=True, metavar="LABEL", help="A label (repeat for more)."
)
_METADATA = click.option(
    "--metadata",
    "metadata",
    multiple=True,
    metavar="KEY=VALUE",
    help="A metadata entry (repeat for more); VALUE is read as JSON when it parses "
    "(3, true, [1, 2]), else as text; KEY=null removes KEY.",
)
_JSON = click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")


def model_dict(m: api_pb2.Model) -> dict[str, Any]:
    return {
        "name": m.name,
        "description": m.description,
        "labels": list(m.labels),
        "metadata": struct(m.metadata),
        "archived": m.archived,
        "owner": m.owner,
        "workspace": m.workspace,
        "num_versions": m.num_versions,
        "latest_version": m.latest_version or None,
        "created_at": fmt.timestamp(m, "created_at"),
        "updated_at": fmt.timestamp(m, "updated_at"),
    }


def version_dict(v: api_pb2.ModelVersion) -> dict[str, Any]:
    shown = v.HasField("checkpoint")
    return {
        "model": v.model,
        "version": v.version,
        "checkpoint_uuid": v.checkpoint_uuid,
        # None: the checkpoint is in a workspace the caller is not a member of.
        "experiment_id": v.checkpoint.experiment_id if shown else None,
        "trial_id": v.checkpoint.trial_id if shown else None,
        "total_batches": v.checkpoint.total_batches if shown else None,
        "validation_metrics": dict(sorted(v.checkpoint.validation_metrics.items())),
        "notes": v.notes,
        "labels": list(v.labels),
        "metadata": struct(v.metadata),
        "registered_by": v.user,
        "user": v.user,  # the same: the name of earlier releases
        # Who uploaded the code `load()` runs (None: the checkpoint is not shown).
        "code_owner": v.code_owner or None,
        # Deleted by its owner: a version of another workspace's model does not keep it.
        "checkpoint_deleted": v.checkpoint_deleted,
        "checkpoint_deleted_at": fmt.timestamp(v, "checkpoint_deleted_at"),
        "created_at": fmt.timestamp(v, "created_at"),
        "updated_at": fmt.timestamp(v, "updated_at"),
    }


def parse_metadata(entries: tuple[str, ...]) -> dict[str, Any]:
    """`KEY=VALUE` entries as a dict; VALUE as JSON when it parses, else as text."""
    out: dict[str, Any] = {}
    for entry in entries:
        key, sep, text = entry.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(
                f"{entry!r} is not KEY=VALUE (e.g. --metadata accuracy=0.93)",
                param_hint="--metadata",
            )
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        out[key.strip()] = value
    return out


def _versions_table(versions: list[api_pb2.ModelVersion]) -> str:
    rows = [
        [
            v.version,
            f"{v.checkpoint_uuid} (deleted by its owner)"
            if v.checkpoint_deleted
            else v.checkpoint_uuid,
            v.checkpoint.experiment_id if v.HasField("checkpoint") else None,
            v.checkpoint.trial_id if v.HasField("checkpoint") else None,
            v.checkpoint.total_batches if v.HasField("checkpoint") else None,
            " ".join(f"{k}={metric(x)}" for k, x in sorted(v.checkpoint.validation_metrics.items()))
            or None,
            v.user,
            v.code_owner or None,
            v.notes.splitlines()[0] if v.notes else None,
        ]
        for v in versions
    ]
    headers = [
        "VERSION",
        "CHECKPOINT",
        "EXP",
        "TRIAL",
        "BATCHES",
        "VALIDATION",
        "REGISTERED BY",
        "CODE BY",
        "NOTES",
    ]
    return fmt.table(headers, rows)


@click.group("model", cls=AliasedGroup)
def model() -> None:
    """Register checkpoints as named, versioned models, and download them.

    A model's owner, the editors of its workspace (in Default: nobody else) and admins
    change it and its versions. A registered checkpoint is kept: garbage collection
    skips it, and `assay checkpoint delete` refuses it while a model of its own workspace
    registers it; a version in another workspace's model is marked deleted instead.
    """


@model.command("create")
@click.argument("name")
@click.option("--description", default="", help="What the model is for.")
@click.option(
    "--workspace",
    default="",
    help="Its workspace, whose editors may change it too (default: Default, where only "
    "you and admins may).",
)
@_LABEL
@_METADATA
@_JSON
@user_errors
def create_command(
    name: str,
    description: str,
    workspace: str,
    labels: tuple[str, ...],
    metadata: tuple[str, ...],
    as_json: bool,
) -> None:
    """Create the model NAME (letters, digits, '.', '_', '-'), with no versions yet."""
    made = client().create_model(
        name,
        description=description,
        labels=list(labels),
        metadata=parse_metadata(metadata),
        workspace=workspace,
    )
    if as_json:
        echo_json(model_dict(made))
        return
    click.echo(f"created model {made.name}")


@model.command("register-version")
@click.argument("name")
@click.argument("checkpoint_uuid", metavar="CHECKPOINT_UUID")
@click.option("--notes", default="", help="What changed in this version.")
@_LABEL
@_METADATA
@_JSON
@user_errors
def register_version_command(
    name: str,
    checkpoint_uuid: str,
    notes: str,
    labels: tuple[str, ...],
    metadata: tuple[str, ...],
    as_json: bool,
) -> None:
    """Register checkpoint CHECKPOINT_UUID as the next version of model NAME.

    Takes the right to change the model (its owner, an editor of its workspace, or an
    admin) and to delete the checkpoint (its experiment's owner or an editor of its
    workspace), since the version keeps the checkpoint from deletion."""
    version = client().register_model_version(
        name, checkpoint_uuid, notes=notes, labels=list(labels), metadata=parse_metadata(metadata)
    )
    if as_json:
        echo_json(version_dict(version))
        return
    click.echo(
        f"registered checkpoint {version.checkpoint_uuid} as {version.model} version "
        f"{version.version}"
    )


@model.command("list")
@click.option("--name", default="", help="Only models whose name contains this.")
@click.option("--label", default="", help="Only models with this label.")
@click.option("--archived", is_flag=True, help="Only archived models.")
@click.option("--all", "show_all", is_flag=True, help="Archived models too.")
@_JSON
@user_errors
def list_command(name: str, label: str, archived: bool, show_all: bool, as_json: bool) -> None:
    """List the registered models (not archived ones, unless --archived or --all)."""
    found = client().list_models(name=name, label=label, archived=None if show_all else archived)
    if as_json:
        echo_json([model_dict(m) for m in found])
        return
    rows = [
        [
            m.name,
            m.num_versions,
            m.latest_version or None,
            m.owner,
            ",".join(m.labels) or None,
            "yes" if m.archived else None,
            fmt.timestamp(m, "updated_at"),
        ]
        for m in found
    ]
    headers = ["NAME", "VERSIONS", "LATEST", "OWNER", "LABELS", "ARCHIVED", "UPDATED"]
    click.echo(fmt.table(headers, rows))


@model.command("describe")
@click.argument("name")
@_JSON
@user_errors
def describe_command(name: str, as_json: bool) -> None:
    """Show a model and its versions."""
    api = client()
    found = api.get_model(name)
    versions = api.list_model_versions(name)
    if as_json:
        echo_json({**model_dict(found), "versions": [version_dict(v) for v in versions]})
        return
    details = model_dict(found)
    for key in (
        "name",
        "description",
        "owner",
        "workspace",
        "archived",
        "created_at",
        "updated_at",
    ):
        click.echo(f"{key + ':':<13} {details[key]}")
    click.echo(f"{'labels:':<13} {', '.join(found.labels) or '-'}")
    click.echo(
        f"{'metadata:':<13} {json.dumps(details['metadata']) if details['metadata'] else '-'}"
    )
    click.echo("")
    click.echo(_versions_table(versions) if versions else "no versions yet")


@model.command("versions")
@click.argument("name")
@_JSON
@user_errors
def versions_command(name: str, as_json: bool) -> None:
    """List a model's versions, each with its checkpoint's experiment, trial and metrics."""
    versions = client().list_model_versions(name)
    if as_json:
        echo_json([version_dict(v) for v in versions])
        return
    click.echo(_versions_table(versions))


@model.command("download")
@click.argument("args", nargs=-1, metavar="NAME [VERSION] DIR")
@user_errors
def download_command(args: tuple[str, ...]) -> None:
    """Copy a version's checkpoint into DIR (new or empty), every file verified, as
    `assay checkpoint download` does. Without VERSION: the latest version."""
    if len(args) not in (2, 3):
        raise click.UsageError("give NAME [VERSION] DIR")
    name, directory = args[0], Path(args[-1])
    number = 0
    if len(args) == 3:
        try:
            number = int(args[1])
        except ValueError:
            raise click.UsageError(f"the VERSION must be a number, not {args[1]!r}") from None
        if number < 1:
            raise click.UsageError("the VERSION counts from 1")
    from assay.common.archive import format_bytes

    api = client()
    version = api.get_model_version(name, number)
    if version.checkpoint_deleted:
        raise AssayError(
            f"checkpoint {version.checkpoint_uuid} of {version.model} version {version.version} "
            "was deleted by its owner: there is nothing to download"
        )
    count, total = download_checkpoint(api, version.checkpoint_uuid, directory)
    click.echo(
        f"downloaded {version.model} version {version.version} (checkpoint "
        f"{version.checkpoint_uuid}, {count} files, {format_bytes(total)}) to {directory}"
    )


@model.command("set")
@click.argument("name")
@click.option("--description", default=None, help="Replace the description.")
@click.option("--label", "labels", multiple=True, metavar="LABEL", help="Replace the labels.")
@click.option("--clear-labels", is_flag=True, help="Remove every label.")
@_METADATA
@_JSON
@user_errors
def set_command(
    name: str,
    description: str | None,
    labels: tuple[str, ...],
    clear_labels: bool,
    metadata: tuple[str, ...],
    as_json: bool,
) -> None:
    """Change a model's description, labels (replaced) or metadata (merged)."""
    new_labels, new_metadata = _changes(
        "--description", description, labels, clear_labels, metadata
    )
    changed = client().patch_model(
        name, description=description, labels=new_labels, metadata=new_metadata
    )
    if as_json:
        echo_json(model_dict(changed))
        return
    click.echo(f"changed model {changed.name}")


@model.command("set-version")
@click.argument("name")
@click.argument("version", type=click.IntRange(min=1))
@click.option("--notes", default=None, help="Replace the notes.")
@click.option("--label", "labels", multiple=True, metavar="LABEL", help="Replace the labels.")
@click.option("--clear-labels", is_flag=True, help="Remove every label.")
@_METADATA
@_JSON
@user_errors
def set_version_command(
    name: str,
    version: int,
    notes: str | None,
    labels: tuple[str, ...],
    clear_labels: bool,
    metadata: tuple[str, ...],
    as_json: bool,
) -> None:
    """Change a version's notes, labels (replaced) or metadata (merged)."""
    new_labels, new_metadata = _changes("--notes", notes, labels, clear_labels, metadata)
    changed = client().patch_model_version(
        name, version, notes=notes, labels=new_labels, metadata=new_metadata
    )
    if as_json:
        echo_json(version_dict(changed))
        return
    click.echo(f"changed {changed.model} version {changed.version}")


def _changes(
    text_option: str,
    text: str | None,
    labels: tuple[str, ...],
    clear_labels: bool,
    metadata: tuple[str, ...],
) -> tuple[list[str] | None, dict[str, Any] | None]:
    """What `set`/`set-version` send for labels and metadata (None: unchanged), or the
    usage error for options that clash or change nothing."""
    if labels and clear_labels:
        raise click.UsageError("give --label or --clear-labels, not both")
    if text is None and not labels and not clear_labels and not metadata:
        raise click.UsageError(f"nothing to change: give {text_option}, --label or --metadata")
    new_labels = [] if clear_labels else (list(labels) if labels else None)
    return new_labels, (parse_metadata(metadata) if metadata else None)


@model.command("archive")
@click.argument("name")
@_JSON
@user_errors
def archive_command(name: str, as_json: bool) -> None:
    """Archive a model: hidden from `model list`, and it takes no new versions."""
    changed = client().archive_model(name, True)
    if as_json:
        echo_json(model_dict(changed))
        return
    click.echo(f"archived model {name}")


@model.command("unarchive")
@click.argument("name")
@_JSON
@user_errors
def unarchive_command(name: str, as_json: bool) -> None:
    """Unarchive a model."""
    changed = client().archive_model(name, False)
    if as_json:
        echo_json(model_dict(changed))
        return
    click.echo(f"unarchived model {name}")


def _confirm(question: str, yes: bool) -> None:
    if yes:
        return
    try:
        sure = click.confirm(question, default=False)
    except click.Abort:  # no answer (stdin closed, or Ctrl-D)
        sure = False
    if not sure:
        raise AssayError("nothing deleted (pass --yes to skip this question)")


@model.command("delete")
@click.argument("name")
@click.option("--force", is_flag=True, help="Delete the model's versions too.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@_JSON
@user_errors
def delete_command(name: str, force: bool, yes: bool, as_json: bool) -> None:
    """Delete a model. One with versions is refused unless --force, which deletes them
    too; their checkpoints stay, no longer pinned (garbage collection may then take them)."""
    _confirm(f"Delete model {name}{' and its versions' if force else ''}?", yes)
    count = client().delete_model(name, force=force)
    if as_json:
        echo_json({"deleted": name, "versions_deleted": count})
        return
    also = f" and {count} version{'s' if count != 1 else ''}" if count else ""
    click.echo(f"deleted model {name}{also}")


@model.command("delete-version")
@click.argument("name")
@click.argument("version", type=click.IntRange(min=1))
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@_JSON
@user_errors
def delete_version_command(name: str, version: int, yes: bool, as_json: bool) -> None:
    """Delete one version of a model; its checkpoint stays, no longer pinned by it."""
    _confirm(f"Delete {name} version {version}?", yes)
    client().delete_model_version(name, version)
    if as_json:
        echo_json({"model": name, "deleted_version": version})
        return
    click.echo(f"deleted {name} version {version}")


model.aliases["list-versions"] = "versions"  # Determined's name
