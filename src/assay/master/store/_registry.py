"""The model registry: named models and their numbered versions, each a checkpoint.

A model belongs to a workspace. A version keeps its checkpoint from garbage collection
(`checkpoint_references`). Deleting the checkpoint, or its experiment, is refused while
a version of a model in the checkpoint's own workspace names it (`checkpoint_pins` says
which); a version of a model in another workspace never stops it: once the checkpoint is
deleted such a version stays, marked (`checkpoint_deleted_at`), so that its owner's
workspace, not a reader elsewhere, decides how long a checkpoint lives. Models are
edited by people, one call at a time, so these writes are the store's direct ones (like
users'), each one transaction. Version numbers count up from 1 per model and are never
reused: the model row is locked while one is given. Names, labels and metadata are
checked here, so every way in (gRPC, HTTP, Python) gets the same errors.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from assay.config import name_problem
from assay.master.errors import ConflictError, InvalidArgumentError, NotFoundError
from assay.master.store._base import StoreBase, now
from assay.master.store._checkpoints import DELETED
from assay.master.store._models import (
    DEFAULT_WORKSPACE_ID,
    Checkpoint,
    Experiment,
    ModelVersion,
    Project,
    RegisteredModel,
    Trial,
    User,
    Workspace,
)

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
MAX_LABELS = 64
MAX_LABEL_CHARS = 255
MAX_METADATA_BYTES = 64 * 1024
MAX_TEXT_CHARS = 64 * 1024
MAX_METADATA_DEPTH = 16  # what protobuf readers take back as a Struct, with room to spare


@dataclass(frozen=True)
class ModelRecord:
    id: int
    name: str
    description: str
    labels: tuple[str, ...]
    metadata: Mapping[str, Any]
    archived: bool
    owner: str
    owner_id: int
    workspace_id: int
    workspace: str
    num_versions: int
    latest_version: int  # 0: none yet
    created_at: dt.datetime
    updated_at: dt.datetime


@dataclass(frozen=True)
class ModelVersionRecord:
    model: str
    version: int
    checkpoint_uuid: str
    # Of the checkpoint's trial; None once its experiment was deleted with it.
    experiment_id: int | None
    notes: str
    labels: tuple[str, ...]
    metadata: Mapping[str, Any]
    user: str  # who registered it
    created_at: dt.datetime
    updated_at: dt.datetime
    # When its checkpoint's owner deleted the checkpoint (None: it is there).
    checkpoint_deleted_at: dt.datetime | None = None
    # Who owns the checkpoint's experiment, and uploaded its code (None: deleted).
    code_owner: str | None = None


def check_name(name: str) -> str:
    """`name` if it may name a model (it goes in URLs): `InvalidArgumentError` otherwise."""
    if not NAME.fullmatch(name):
        raise InvalidArgumentError(
            f"model name {name!r} is not allowed: use 1 to 128 letters, digits, '.', '_' or "
            "'-', starting with a letter or digit"
        )
    return name


def check_labels(labels: Iterable[str]) -> list[str]:
    """The labels stripped and deduplicated, in order; each must be non-empty text."""
    out: list[str] = []
    for raw in labels:
        label = raw.strip()
        if not label or len(label) > MAX_LABEL_CHARS or "\x00" in label:
            raise InvalidArgumentError(
                f"label {raw!r} is not allowed: give 1 to {MAX_LABEL_CHARS} characters"
            )
        problem = name_problem(label)
        if problem is not None:
            raise InvalidArgumentError(f"label {raw!r} {problem}")
        if label not in out:
            out.append(label)
    if len(out) > MAX_LABELS:
        raise InvalidArgumentError(f"at most {MAX_LABELS} labels, not {len(out)}")
    return out


def check_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """`metadata` as a plain JSON object of at most MAX_METADATA_BYTES."""
    try:
        text = json.dumps(dict(metadata), allow_nan=False, sort_keys=True)
    except (TypeError, ValueError) as e:
        raise InvalidArgumentError(f"metadata must be a JSON object: {e}") from None
    if len(text.encode()) > MAX_METADATA_BYTES or "\\u0000" in text:
        raise InvalidArgumentError(
            f"metadata is over {MAX_METADATA_BYTES // 1024} KiB as JSON (or holds a NUL "
            "character): keep large data in the checkpoint's files"
        )
    loaded: dict[str, Any] = json.loads(text)
    if _depth(loaded) > MAX_METADATA_DEPTH:
        raise InvalidArgumentError(
            f"metadata is nested more than {MAX_METADATA_DEPTH} levels deep: flatten it"
        )
    return loaded


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def merge_metadata(old: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """`old` with `patch`'s keys set; a key whose value is None is removed."""
    merged = dict(old)
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return check_metadata(merged)


def _text(value: str, what: str) -> str:
    if len(value) > MAX_TEXT_CHARS or "\x00" in value:
        raise InvalidArgumentError(
            f"the {what} must be at most {MAX_TEXT_CHARS} characters, without NUL"
        )
    return value


class RegistryQueries(StoreBase):
    """Models and their versions."""

    # --- models ---------------------------------------------------------------------------

    def create_model(
        self,
        name: str,
        *,
        owner_id: int,
        workspace_id: int = DEFAULT_WORKSPACE_ID,
        description: str = "",
        labels: Sequence[str] = (),
        metadata: Mapping[str, Any] | None = None,
    ) -> ModelRecord:
        """Create a model in workspace `workspace_id`; a model of that name already
        existing is a `ConflictError`."""
        row = RegisteredModel(
            name=check_name(name),
            description=_text(description, "description"),
            labels=check_labels(labels),
            user_metadata=check_metadata(metadata or {}),
            owner_id=owner_id,
            workspace_id=workspace_id,
        )
        try:
            with self.write() as s:
                s.add(row)
                s.flush()
                return _model(s, row)
        except IntegrityError:
            raise ConflictError(
                f"a model named {name!r} exists already: choose another name, or register a "
                "version of that one"
            ) from None

    def get_model(self, name: str) -> ModelRecord:
        with self.read() as s:
            return _model(s, _find_model(s, name))

    def list_models(
        self, *, name: str | None = None, label: str | None = None, archived: bool | None = None
    ) -> list[ModelRecord]:
        """Models by name; `name`: a part of it (any case); `archived` None: both."""
        query = select(RegisteredModel).order_by(RegisteredModel.name)
        if archived is not None:
            query = query.where(RegisteredModel.archived == archived)
        if name:
            query = query.where(
                func.lower(RegisteredModel.name).contains(name.lower(), autoescape=True)
            )
        with self.read() as s:
            rows = [m for m in s.execute(query).scalars() if not label or label in m.labels]
            return _models(s, rows)

    def patch_model(
        self,
        name: str,
        *,
        description: str | None = None,
        labels: Sequence[str] | None = None,
        metadata: Mapping[str, Any] | None = None,
        archived: bool | None = None,
    ) -> ModelRecord:
        """Change what is given (None: left as it is); `metadata` is merged (see
        `merge_metadata`). Idempotent."""
        with self.write() as s:
            row = _find_model(s, name, lock=True)
            if description is not None:
                row.description = _text(description, "description")
            if labels is not None:
                row.labels = check_labels(labels)
            if metadata is not None:
                row.user_metadata = merge_metadata(row.user_metadata, metadata)
            if archived is not None:
                row.archived = archived
            row.updated_at = now()
            s.flush()
            return _model(s, row)

    def delete_model(self, name: str, *, force: bool = False) -> int:
        """Delete a model; one with versions only with `force`, deleting them too (their
        checkpoints are then no longer pinned). The number of versions deleted."""
        with self.write() as s:
            row = _find_model(s, name, lock=True)
            count = _count_versions(s, row.id)
            if count and not force:
                raise ConflictError(
                    f"model {name!r} has {count} version{'s' if count != 1 else ''}: delete "
                    "them first, or delete the model with force (its versions go with it)"
                )
            for version in s.execute(
                select(ModelVersion).where(ModelVersion.model_id == row.id)
            ).scalars():
                s.delete(version)
            s.delete(row)
            return count

    # --- versions ---------------------------------------------------------------------------

    def register_version(
        self,
        name: str,
        checkpoint_uuid: str,
        *,
        user_id: int,
        notes: str = "",
        labels: Sequence[str] = (),
        metadata: Mapping[str, Any] | None = None,
    ) -> ModelVersionRecord:
        """Add the next version of model `name`: checkpoint `checkpoint_uuid`, which must
        exist and not be deleted; an archived model takes no new versions."""
        labels = check_labels(labels)
        meta = check_metadata(metadata or {})
        notes = _text(notes, "notes")
        with self.write() as s:
            model = _find_model(s, name, lock=True)
            if model.archived:
                raise ConflictError(
                    f"model {name!r} is archived: unarchive it to register new versions"
                )
            checkpoint = s.get(Checkpoint, checkpoint_uuid, with_for_update=True)
            if checkpoint is None:
                raise NotFoundError(f"checkpoint {checkpoint_uuid} does not exist")
            if checkpoint.state == DELETED:
                raise ConflictError(
                    f"checkpoint {checkpoint_uuid} was deleted: register one whose files exist"
                )
            model.last_version += 1
            model.updated_at = now()
            row = ModelVersion(
                model_id=model.id,
                version=model.last_version,
                checkpoint_uuid=checkpoint_uuid,
                notes=notes,
                labels=labels,
                user_metadata=meta,
                user_id=user_id,
            )
            s.add(row)
            s.flush()
            return _version(s, model, row)

    def list_versions(self, name: str) -> list[ModelVersionRecord]:
        with self.read() as s:
            model = _find_model(s, name)
            rows = s.execute(
                select(ModelVersion)
                .where(ModelVersion.model_id == model.id)
                .order_by(ModelVersion.version)
            ).scalars()
            return [_version(s, model, v) for v in rows]

    def get_version(self, name: str, version: int) -> ModelVersionRecord:
        """Version `version` of model `name`; 0 is the latest one."""
        with self.read() as s:
            model = _find_model(s, name)
            return _version(s, model, _find_version(s, model, version))

    def patch_version(
        self,
        name: str,
        version: int,
        *,
        notes: str | None = None,
        labels: Sequence[str] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> ModelVersionRecord:
        _numbered(version)
        with self.write() as s:
            model = _find_model(s, name, lock=True)
            row = _find_version(s, model, version)
            if notes is not None:
                row.notes = _text(notes, "notes")
            if labels is not None:
                row.labels = check_labels(labels)
            if metadata is not None:
                row.user_metadata = merge_metadata(row.user_metadata, metadata)
            row.updated_at = now()
            s.flush()
            return _version(s, model, row)

    def delete_version(self, name: str, version: int) -> None:
        """Delete one version (its number is not given again); its checkpoint is no
        longer pinned by it."""
        _numbered(version)
        with self.write() as s:
            model = _find_model(s, name, lock=True)
            s.delete(_find_version(s, model, version))
            model.updated_at = now()

    def checkpoint_references(self, uuids: Collection[str]) -> dict[str, list[tuple[str, int]]]:
        """For each of `uuids` that a version registers: [(model name, version), ...]
        (garbage collection keeps these checkpoints)."""
        return self._references(uuids, pins=False)

    def checkpoint_pins(self, uuids: Collection[str]) -> dict[str, list[tuple[str, int]]]:
        """For each of `uuids` that a version of a model in the checkpoint's own
        workspace registers: [(model name, version), ...]. Only these refuse the
        checkpoint's deletion; other workspaces' versions are marked instead."""
        return self._references(uuids, pins=True)

    def _references(
        self, uuids: Collection[str], *, pins: bool
    ) -> dict[str, list[tuple[str, int]]]:
        found: dict[str, list[tuple[str, int]]] = {}
        wanted = list(dict.fromkeys(uuids))
        with self.read() as s:
            for start in range(0, len(wanted), 500):
                chunk = wanted[start : start + 500]
                query = pinning_versions(chunk) if pins else _versions_naming(chunk)
                for uuid, model, version in s.execute(query):
                    found.setdefault(uuid, []).append((model, version))
        return found


def _versions_naming(uuids: Any) -> Any:  # Select[...]: its spelling differs in 2.0/2.1
    """(checkpoint uuid, model name, version) of the versions naming one of `uuids` (a
    list, or a select of uuids), whose checkpoint is not marked deleted."""
    return (
        select(ModelVersion.checkpoint_uuid, RegisteredModel.name, ModelVersion.version)
        .join(RegisteredModel, RegisteredModel.id == ModelVersion.model_id)
        .where(
            ModelVersion.checkpoint_uuid.in_(uuids), ModelVersion.checkpoint_deleted_at.is_(None)
        )
        .order_by(RegisteredModel.name, ModelVersion.version)
    )


def pinning_versions(uuids: Any) -> Any:  # a Select, as `_versions_naming`
    """`_versions_naming(uuids)` of models in the workspace of the checkpoint they name:
    those that keep it from deletion."""
    return (
        _versions_naming(uuids)
        .join(Checkpoint, Checkpoint.uuid == ModelVersion.checkpoint_uuid)
        .join(Trial, Trial.id == Checkpoint.trial_id)
        .join(Experiment, Experiment.id == Trial.experiment_id)
        .join(Project, Project.id == Experiment.project_id)
        .where(Project.workspace_id == RegisteredModel.workspace_id)
    )


def _numbered(version: int) -> None:
    """Changes name their version: 0 (the latest, for reads) is refused."""
    if version < 1:
        raise InvalidArgumentError(f"give a version number (1, 2, ...), not {version}")


def _find_model(s: Session, name: str, *, lock: bool = False) -> RegisteredModel:
    query = select(RegisteredModel).where(RegisteredModel.name == name)
    if lock:
        query = query.with_for_update()
    row = s.execute(query).scalar()
    if row is None:
        raise NotFoundError(f"model {name!r} does not exist (assay model list shows the models)")
    return row


def _find_version(s: Session, model: RegisteredModel, version: int) -> ModelVersion:
    query = select(ModelVersion).where(ModelVersion.model_id == model.id)
    if version:
        query = query.where(ModelVersion.version == version)
    else:
        query = query.order_by(ModelVersion.version.desc()).limit(1)
    row = s.execute(query).scalar()
    if row is None:
        which = f"version {version}" if version else "any version"
        raise NotFoundError(f"model {model.name!r} has no {which}")
    return row


def _count_versions(s: Session, model_id: int) -> int:
    return int(
        s.execute(
            select(func.count()).select_from(ModelVersion).where(ModelVersion.model_id == model_id)
        ).scalar_one()
    )


def _username(s: Session, user_id: int) -> str:
    return str(s.execute(select(User.username).where(User.id == user_id)).scalar_one())


def _models(s: Session, rows: Sequence[RegisteredModel]) -> list[ModelRecord]:
    ids = [m.id for m in rows]
    counts: dict[int, tuple[int, int]] = {}
    for start in range(0, len(ids), 500):
        for model_id, count, latest in s.execute(
            select(ModelVersion.model_id, func.count(), func.max(ModelVersion.version))
            .where(ModelVersion.model_id.in_(ids[start : start + 500]))
            .group_by(ModelVersion.model_id)
        ):
            counts[model_id] = (int(count), int(latest))
    owners: dict[int, str] = {
        uid: name
        for uid, name in s.execute(
            select(User.id, User.username).where(User.id.in_({m.owner_id for m in rows}))
        )
    }
    workspaces: dict[int, str] = {
        wid: name
        for wid, name in s.execute(
            select(Workspace.id, Workspace.name).where(
                Workspace.id.in_({m.workspace_id for m in rows})
            )
        )
    }
    return [
        _record(m, owners[m.owner_id], workspaces[m.workspace_id], *counts.get(m.id, (0, 0)))
        for m in rows
    ]


def _model(s: Session, row: RegisteredModel) -> ModelRecord:
    [record] = _models(s, [row])
    return record


def _record(
    row: RegisteredModel, owner: str, workspace: str, count: int, latest: int
) -> ModelRecord:
    return ModelRecord(
        id=row.id,
        name=row.name,
        description=row.description,
        labels=tuple(row.labels),
        metadata=dict(row.user_metadata),
        archived=row.archived,
        owner=owner,
        owner_id=row.owner_id,
        workspace_id=row.workspace_id,
        workspace=workspace,
        num_versions=count,
        latest_version=latest,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def _version(s: Session, model: RegisteredModel, row: ModelVersion) -> ModelVersionRecord:
    found = s.execute(
        select(Trial.experiment_id, User.username)
        .join(Checkpoint, Checkpoint.trial_id == Trial.id)
        .join(Experiment, Experiment.id == Trial.experiment_id)
        .join(User, User.id == Experiment.owner_id)
        .where(Checkpoint.uuid == row.checkpoint_uuid)
    ).first()
    experiment_id, code_owner = found if found is not None else (None, None)
    return ModelVersionRecord(
        model=model.name,
        version=row.version,
        checkpoint_uuid=row.checkpoint_uuid,
        experiment_id=None if experiment_id is None else int(experiment_id),
        notes=row.notes,
        labels=tuple(row.labels),
        metadata=dict(row.user_metadata),
        user=_username(s, row.user_id),
        created_at=row.created_at,
        updated_at=row.updated_at,
        checkpoint_deleted_at=row.checkpoint_deleted_at,
        code_owner=None if row.checkpoint_deleted_at or code_owner is None else str(code_owner),
    )


__all__ = [
    "MAX_LABELS",
    "MAX_METADATA_BYTES",
    "ModelRecord",
    "ModelVersionRecord",
    "RegistryQueries",
    "check_labels",
    "check_metadata",
    "check_name",
    "merge_metadata",
    "pinning_versions",
]
