"""The model registry's RPCs between the wire and the store: who may do what, and records
to messages.

Who may do what is decided here, through the workspace roles of `assay.master.auth`:

- any logged-in user reads the registry (a version's checkpoint details only when they
  may read the checkpoint's workspace);
- a model is created in a workspace by those who may create experiments there (its
  editors; every user is one of `Default`);
- a model's owner, the editors of its workspace, and administrators change it: its
  description, labels and metadata, archiving, deletion, and adding, changing and
  deleting its versions (`may_change_model`). A model is a thing its owner files in a
  workspace, as an experiment is (`Roles.owned`): in `Default`, which every user
  shares, only its owner and administrators change it;
- a checkpoint is registered as a version only by who may delete it: its experiment's
  owner, or an editor of the checkpoint's workspace (`may_register`), since a version
  of a model in that same workspace keeps it from deletion.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from google.protobuf import json_format
from google.protobuf.struct_pb2 import Struct

from assay.common import storage
from assay.master import wire
from assay.master.auth import EDITOR, VIEWER, Principal, Roles
from assay.master.errors import InvalidArgumentError, NotFoundError, PermissionDeniedError
from assay.master.store import (
    DEFAULT_WORKSPACE_ID,
    CheckpointRecord,
    ModelRecord,
    ModelVersionRecord,
    Store,
)
from assay.proto import api_pb2


def may_change_model(roles: Roles, who: Principal, model: ModelRecord, what: str) -> None:
    """`who` may `what` `model` (change, archive, delete it, add, change or delete its
    versions): its owner, an editor of its workspace (not of `Default`) or an
    administrator; else `PermissionDeniedError` naming who may (the registry is read by
    all, so a non-member of the workspace is told so too, not that it does not exist).
    An owner who has left the workspace changes it no more, as with an experiment."""
    need = VIEWER if model.owner_id == who.user_id else EDITOR
    try:
        roles.owned(who, model.workspace_id, model.owner_id, need, "", lambda: "")
        return
    except (NotFoundError, PermissionDeniedError):
        pass
    if model.workspace_id == DEFAULT_WORKSPACE_ID:
        allowed = "only they and administrators"
    else:
        allowed = f"only they, editors of its workspace {model.workspace!r} and administrators"
    raise PermissionDeniedError(
        f"model {model.name!r} belongs to {model.owner}: {allowed} may {what} it "
        f"({who.username} may not); register your checkpoint in a model of your own "
        "(`assay model create`)"
    )


def workspace_for_new_model(roles: Roles, who: Principal, name: str) -> int:
    """The id of workspace `name` (empty: Default) if `who` may create a model there:
    as an experiment, an editor's right; not when archived."""
    found = roles.workspace(who, name or "Default")  # not a member: it does not exist
    try:
        roles.workspace(who, found.name, EDITOR)
    except PermissionDeniedError as e:
        raise PermissionDeniedError(
            f"cannot create a model in workspace {found.name!r}: {e}"
        ) from None
    if found.archived:
        raise InvalidArgumentError(
            f"workspace {found.name!r} is archived: unarchive it, or create the model in another"
        )
    return found.id


def may_register(roles: Roles, who: Principal, checkpoint: CheckpointRecord) -> None:
    """`who` may register `checkpoint`: its experiment's owner, or an editor of its
    workspace (as for deleting it: a version keeps it from deletion). A non-member gets
    `NotFoundError` (the checkpoint does not exist for them)."""
    try:
        roles.checkpoint(who, checkpoint, EDITOR, owner_may=True)
    except PermissionDeniedError as e:
        raise PermissionDeniedError(
            f"cannot register checkpoint {checkpoint.uuid}: a version keeps it from "
            "deletion, so only its experiment's owner and editors of its workspace may "
            f"register it. {e}"
        ) from None


def checkpoint_uuid(raw: str) -> str:
    """`raw` as a checkpoint uuid, or `InvalidArgumentError` saying what to give."""
    text = raw.strip().lower()
    if not text:
        raise InvalidArgumentError("give the uuid of the checkpoint to register")
    try:
        return storage.checkpoint_uuid(text)
    except storage.StorageError as e:
        raise InvalidArgumentError(f"cannot register checkpoint {raw.strip()!r}: {e}") from None


def metadata(struct: Struct) -> dict[str, Any]:
    """A request's metadata as plain JSON values (None for a null)."""
    found: dict[str, Any] = json_format.MessageToDict(struct)
    return found


def model_message(record: ModelRecord) -> api_pb2.Model:
    message = api_pb2.Model(
        id=record.id,
        name=record.name,
        description=record.description,
        labels=list(record.labels),
        archived=record.archived,
        owner=record.owner,
        num_versions=record.num_versions,
        latest_version=record.latest_version,
        created_at=wire.timestamp(record.created_at),
        updated_at=wire.timestamp(record.updated_at),
        workspace=record.workspace,
    )
    _fill(message.metadata, record.metadata)
    return message


def version_message(
    store: Store, record: ModelVersionRecord, *, readable: bool
) -> api_pb2.ModelVersion:
    """The version; its checkpoint's details (experiment, trial, location, files,
    metrics) and whose code it holds only when `readable` (the caller may read its
    workspace) and the checkpoint was not deleted: otherwise the version names the
    checkpoint's uuid alone."""
    message = api_pb2.ModelVersion(
        model=record.model,
        version=record.version,
        checkpoint_uuid=record.checkpoint_uuid,
        notes=record.notes,
        labels=list(record.labels),
        user=record.user,
        created_at=wire.timestamp(record.created_at),
        updated_at=wire.timestamp(record.updated_at),
        checkpoint_deleted=record.checkpoint_deleted_at is not None,
        checkpoint_deleted_at=wire.timestamp(record.checkpoint_deleted_at),
    )
    if readable and record.checkpoint_deleted_at is None and record.experiment_id is not None:
        checkpoint = store.get_checkpoint(record.checkpoint_uuid)
        message.checkpoint.CopyFrom(wire.checkpoint(checkpoint, record.experiment_id))
        message.code_owner = record.code_owner or ""
    _fill(message.metadata, record.metadata)
    return message


def _fill(struct: Struct, value: Mapping[str, Any]) -> None:
    struct.update(dict(value))
