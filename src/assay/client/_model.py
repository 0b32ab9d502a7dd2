"""`Model` and `ModelVersion`: the model registry, where a checkpoint is handed on."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from assay.errors import AssayError

from . import _records as fmt
from ._checkpoint import Checkpoint

if TYPE_CHECKING:
    from assay import Trial as UserTrial
    from assay.proto import api_pb2

    from ._api import Client


class Model:
    """A registered model: a name with numbered versions, each pinning a checkpoint
    (checkpoint GC keeps it). Its owner, the editors of its workspace and administrators
    change it. Fields are as of the last `reload()`."""

    def __init__(self, api: Client, record: api_pb2.Model) -> None:
        self._api = api
        self._record = record

    def __repr__(self) -> str:
        return f"Model(name={self.name!r})"

    @property
    def name(self) -> str:
        return str(self._record.name)

    @property
    def description(self) -> str:
        return str(self._record.description)

    @property
    def labels(self) -> list[str]:
        return list(self._record.labels)

    @property
    def metadata(self) -> dict[str, Any]:
        return fmt.struct(self._record.metadata)

    @property
    def archived(self) -> bool:
        return bool(self._record.archived)

    @property
    def owner(self) -> str:
        return str(self._record.owner)

    @property
    def workspace(self) -> str:
        """The workspace whose editors may change it (beside its owner and admins)."""
        return str(self._record.workspace)

    def reload(self) -> Model:
        """Read the model again from the master."""
        self._record = self._api.get_model(self.name)
        return self

    def register_version(
        self,
        checkpoint: Checkpoint | str,
        notes: str = "",
        *,
        labels: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> ModelVersion:
        """Register `checkpoint` (a `Checkpoint` or its UUID) as the next version."""
        uuid = checkpoint.uuid if isinstance(checkpoint, Checkpoint) else checkpoint
        found = self._api.register_model_version(
            self.name, uuid, notes=notes, labels=labels, metadata=metadata
        )
        self.reload()
        return ModelVersion(self._api, found)

    def versions(self) -> list[ModelVersion]:
        """Its versions, oldest first."""
        found = self._api.list_model_versions(self.name)
        return sorted((ModelVersion(self._api, v) for v in found), key=lambda v: v.version)

    def get_version(self, version: int = 0) -> ModelVersion:
        """Version `version`; 0: the latest."""
        return ModelVersion(self._api, self._api.get_model_version(self.name, version))

    def set_description(self, description: str) -> None:
        self._record = self._api.patch_model(self.name, description=description)

    def set_labels(self, labels: list[str]) -> None:
        self._record = self._api.patch_model(self.name, labels=labels)

    def set_metadata(self, metadata: dict[str, Any]) -> None:
        """Merge `metadata` into the model's (a None value removes a key)."""
        self._record = self._api.patch_model(self.name, metadata=metadata)

    def archive(self) -> None:
        self._record = self._api.archive_model(self.name, True)

    def unarchive(self) -> None:
        self._record = self._api.archive_model(self.name, False)

    def delete(self, force: bool = False) -> None:
        """Delete the model; one with versions only with `force` (they go with it)."""
        self._api.delete_model(self.name, force=force)


class ModelVersion:
    """One version of a registered model and the checkpoint it pins. A version of a
    model in another workspace than its checkpoint's does not stop the checkpoint's
    owner from deleting it: then `checkpoint_deleted` is True, and loading or
    downloading it says so."""

    def __init__(self, api: Client, record: api_pb2.ModelVersion) -> None:
        self._api = api
        self._record = record

    def __repr__(self) -> str:
        return f"ModelVersion(model={self.model_name!r}, version={self.version})"

    @property
    def model_name(self) -> str:
        return str(self._record.model)

    @property
    def version(self) -> int:
        return int(self._record.version)

    @property
    def checkpoint_uuid(self) -> str:
        return str(self._record.checkpoint_uuid)

    @property
    def checkpoint_deleted(self) -> bool:
        """Whether its checkpoint's owner deleted the checkpoint (nothing to load)."""
        return bool(self._record.checkpoint_deleted)

    @property
    def code_owner(self) -> str:
        """Who uploaded the code of the checkpoint's experiment, which `load()` without
        a Trial class runs ("" when the checkpoint is not shown to you, or deleted)."""
        return str(self._record.code_owner)

    @property
    def checkpoint(self) -> Checkpoint:
        """The checkpoint this version pins (its experiment, trial, metrics, files);
        `AssayError` when it was deleted or is in a workspace you are not a member of."""
        if self.checkpoint_deleted:
            raise AssayError(
                f"checkpoint {self.checkpoint_uuid} of {self.model_name} version "
                f"{self.version} was deleted by its owner: there is nothing to load or "
                "download (register another checkpoint as a new version)"
            )
        if not self._record.HasField("checkpoint"):
            raise AssayError(
                f"checkpoint {self.checkpoint_uuid} of {self.model_name} version "
                f"{self.version} is in a workspace you are not a member of: ask its "
                "admins to add you (assay workspace add-member)"
            )
        return Checkpoint(self._api, self._record.checkpoint)

    @property
    def notes(self) -> str:
        return str(self._record.notes)

    @property
    def labels(self) -> list[str]:
        return list(self._record.labels)

    @property
    def metadata(self) -> dict[str, Any]:
        return fmt.struct(self._record.metadata)

    @property
    def user(self) -> str:
        """Who registered it."""
        return str(self._record.user)

    def load(
        self,
        trial_class: type[UserTrial] | None = None,
        *,
        trust: bool = False,
        **trial_kwargs: Any,
    ) -> UserTrial:
        """Its checkpoint's Trial with the weights loaded: see `Checkpoint.load` (another
        user's model code runs only with `trust=True`)."""
        return self.checkpoint.load(trial_class, trust=trust, **trial_kwargs)

    def delete(self) -> None:
        """Delete this version (its checkpoint is no longer pinned by it)."""
        self._api.delete_model_version(self.model_name, self.version)
