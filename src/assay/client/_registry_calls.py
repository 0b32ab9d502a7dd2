"""The model registry's and the workspaces' calls, one typed method per RPC."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._channel import Channel

if TYPE_CHECKING:
    from assay.proto import api_pb2

# The workspace and project RPCs, called through `Client.workspace_call`.
WORKSPACE_RPCS = frozenset(
    {
        "CreateWorkspace",
        "ListWorkspaces",
        "GetWorkspace",
        "ArchiveWorkspace",
        "DeleteWorkspace",
        "ListWorkspaceMembers",
        "SetWorkspaceMember",
        "RemoveWorkspaceMember",
        "CreateProject",
        "ListProjects",
        "GetProject",
        "ArchiveProject",
        "DeleteProject",
        "MoveExperiment",
    }
)


class RegistryCalls(Channel):
    """The calls on models, their versions, workspaces and projects."""

    def create_model(
        self,
        name: str,
        *,
        description: str = "",
        labels: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        workspace: str = "",
    ) -> api_pb2.Model:
        from assay.proto import api_pb2

        request = api_pb2.CreateModelRequest(
            name=name, description=description, labels=labels or [], workspace=workspace
        )
        request.metadata.update(metadata or {})
        model: api_pb2.Model = self._unary("CreateModel", request)
        return model

    def get_model(self, name: str) -> api_pb2.Model:
        from assay.proto import api_pb2

        model: api_pb2.Model = self._unary("GetModel", api_pb2.GetModelRequest(name=name))
        return model

    def list_models(
        self, *, name: str = "", label: str = "", archived: bool | None = None
    ) -> list[api_pb2.Model]:
        from assay.proto import api_pb2

        request = api_pb2.ListModelsRequest(name=name, label=label)
        if archived is not None:
            request.archived = archived
        response: api_pb2.ListModelsResponse = self._unary("ListModels", request)
        return list(response.models)

    def patch_model(
        self,
        name: str,
        *,
        description: str | None = None,
        labels: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> api_pb2.Model:
        """Change what is given; `metadata` keys are merged (a None value removes one)."""
        from assay.proto import api_pb2

        request = api_pb2.PatchModelRequest(name=name)
        if description is not None:
            request.description = description
        if labels is not None:
            request.labels.SetInParent()
            request.labels.labels.extend(labels)
        if metadata is not None:
            request.metadata.SetInParent()
            request.metadata.update(metadata)
        model: api_pb2.Model = self._unary("PatchModel", request)
        return model

    def archive_model(self, name: str, archived: bool = True) -> api_pb2.Model:
        from assay.proto import api_pb2

        model: api_pb2.Model
        if archived:
            model = self._unary("ArchiveModel", api_pb2.ArchiveModelRequest(name=name))
        else:
            model = self._unary("UnarchiveModel", api_pb2.UnarchiveModelRequest(name=name))
        return model

    def delete_model(self, name: str, *, force: bool = False) -> int:
        """Delete a model; with `force`, its versions too. The number of versions deleted."""
        from assay.proto import api_pb2

        request = api_pb2.DeleteModelRequest(name=name, force=force)
        response: api_pb2.DeleteModelResponse = self._unary("DeleteModel", request)
        return response.versions_deleted

    def register_model_version(
        self,
        name: str,
        checkpoint_uuid: str,
        *,
        notes: str = "",
        labels: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> api_pb2.ModelVersion:
        from assay.proto import api_pb2

        request = api_pb2.RegisterModelVersionRequest(
            name=name, checkpoint_uuid=checkpoint_uuid, notes=notes, labels=labels or []
        )
        request.metadata.update(metadata or {})
        version: api_pb2.ModelVersion = self._unary("RegisterModelVersion", request)
        return version

    def list_model_versions(self, name: str) -> list[api_pb2.ModelVersion]:
        from assay.proto import api_pb2

        request = api_pb2.ListModelVersionsRequest(name=name)
        response: api_pb2.ListModelVersionsResponse = self._unary("ListModelVersions", request)
        return list(response.versions)

    def get_model_version(self, name: str, version: int = 0) -> api_pb2.ModelVersion:
        """Version `version` of model `name`; 0: the latest."""
        from assay.proto import api_pb2

        request = api_pb2.GetModelVersionRequest(name=name, version=version)
        found: api_pb2.ModelVersion = self._unary("GetModelVersion", request)
        return found

    def patch_model_version(
        self,
        name: str,
        version: int,
        *,
        notes: str | None = None,
        labels: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> api_pb2.ModelVersion:
        from assay.proto import api_pb2

        request = api_pb2.PatchModelVersionRequest(name=name, version=version)
        if notes is not None:
            request.notes = notes
        if labels is not None:
            request.labels.SetInParent()
            request.labels.labels.extend(labels)
        if metadata is not None:
            request.metadata.SetInParent()
            request.metadata.update(metadata)
        found: api_pb2.ModelVersion = self._unary("PatchModelVersion", request)
        return found

    def delete_model_version(self, name: str, version: int) -> None:
        from assay.proto import api_pb2

        request = api_pb2.DeleteModelVersionRequest(name=name, version=version)
        self._unary("DeleteModelVersion", request)

    # --- workspaces and projects -------------------------------------------------------

    def workspace_call(self, method: str, **fields: Any) -> Any:
        """One of the workspace and project RPCs (CreateWorkspace, ListProjects,
        MoveExperiment, ...) with its request's fields; returns its response."""
        from assay.proto import api_pb2

        if method not in WORKSPACE_RPCS:
            raise ValueError(f"{method} is not a workspace or project RPC")
        request = getattr(api_pb2, f"{method}Request")(**fields)
        return self._unary(method, request)
