"""The model registry's RPCs between the wire and the store: who may do what, and records
to messages.

Who may edit a model is decided here, in `may_edit_model`: any logged-in user reads the
registry; a model's owner or an administrator edits, archives and deletes it and its
versions; a version is registered by anyone who may read the checkpoint's experiment
(a viewer of its workspace: `Roles.checkpoint`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from google.protobuf import json_format
from google.protobuf.struct_pb2 import Struct

from assay.common import storage
from assay.master import _convert
from assay.master._auth import Principal
from assay.master.errors import InvalidArgumentError, PermissionDeniedError
from assay.master.store import ModelRecord, ModelVersionRecord, Store
from assay.proto import api_pb2


def may_edit_model(store: Store, who: Principal, name: str, what: str) -> None:
    """A model's owner or an administrator may `what` it (edit, archive, delete, and
    change or delete its versions); `NotFoundError` for an unknown model."""
    owner = store.get_model(name).owner
    if not who.admin and owner != who.username:
        raise PermissionDeniedError(
            f"model {name!r} belongs to {owner}: only they or an administrator may {what} it"
        )


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
        created_at=_convert.timestamp(record.created_at),
        updated_at=_convert.timestamp(record.updated_at),
    )
    _fill(message.metadata, record.metadata)
    return message


def version_message(
    store: Store, record: ModelVersionRecord, *, readable: bool
) -> api_pb2.ModelVersion:
    """The version; its checkpoint's details (experiment, trial, location, files,
    metrics) only when `readable` (the caller may read its workspace): to others the
    version names the checkpoint's uuid alone."""
    message = api_pb2.ModelVersion(
        model=record.model,
        version=record.version,
        checkpoint_uuid=record.checkpoint_uuid,
        notes=record.notes,
        labels=list(record.labels),
        user=record.user,
        created_at=_convert.timestamp(record.created_at),
        updated_at=_convert.timestamp(record.updated_at),
    )
    if readable:
        checkpoint = store.get_checkpoint(record.checkpoint_uuid)
        message.checkpoint.CopyFrom(_convert.checkpoint(checkpoint, record.experiment_id))
    _fill(message.metadata, record.metadata)
    return message


def _fill(struct: Struct, value: Mapping[str, Any]) -> None:
    struct.update(dict(value))
