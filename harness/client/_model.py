"""`Model` and `ModelVersion`: the model registry, where a checkpoint is handed on."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from assay.cli import _format as fmt
from assay.client._checkpoint import Checkpoint

if TYPE_CHECKING:
    from assay._trial import Trial as UserTrial
    from assay.cli._client import Client
    from assay.proto import api_pb2


class Model:
    """A registered model: a name with numbered versions, each pinning a checkpoint
    (checkpoint GC keeps it). Fields are as of the last `reload()`."""

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
    """One version of a registered model and the checkpoint it pins."""

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
    def checkpoint(self) -> Checkpoint:
        """The checkpoint this version pins (its experiment, trial, metrics, files)."""
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

    def load(self, trial_class: type[UserTrial] | None = None, **trial_kwargs: Any) -> UserTrial:
        """Its checkpoint's Trial with the weights loaded: see `Checkpoint.load`."""
        return self.checkpoint.load(trial_class, **trial_kwargs)

    def delete(self) -> None:
        """Delete this version (its checkpoint is no longer pinned by it)."""
        self._api.delete_model_version(self.model_name, self.version)
