"""API handlers for checkpoints and the model registry."""

from __future__ import annotations

import grpc

from assay.master import checkpoints, wire
from assay.master.api import _registry
from assay.master.api._servicers._base import ServicerBase
from assay.master.api._status import maps_errors
from assay.master.auth import EDITOR, Principal
from assay.master.errors import NotFoundError
from assay.proto import api_pb2, common_pb2


class RegistryRpcs(ServicerBase):
    """Checkpoints, models and model versions (who may do what: `_registry`, `_roles`)."""

    @maps_errors
    def ListCheckpoints(  # noqa: N802
        self, request: api_pb2.ListCheckpointsRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListCheckpointsResponse:
        who = self._who(context)
        if request.trial_id:
            self.roles.trial(who, request.trial_id)
            trials = [self.store.get_trial(request.trial_id)]
        else:
            self.roles.experiment(who, request.experiment_id)
            trials = self.store.list_trials(request.experiment_id)
        return api_pb2.ListCheckpointsResponse(
            checkpoints=[
                wire.checkpoint(c, t.experiment_id)
                for t in trials
                for c in self.store.list_checkpoints(t.id)
            ]
        )

    @maps_errors
    def DeleteCheckpoints(  # noqa: N802
        self, request: api_pb2.DeleteCheckpointsRequest, context: grpc.ServicerContext
    ) -> api_pb2.DeleteCheckpointsResponse:
        who = self._who(context)
        # A checkpoint of another workspace does not exist for you (each uuid as it is
        # looked up below: stripped and lowercased).
        for uuid in checkpoints.normalise_uuids(request.uuids):
            try:
                record = self.store.get_checkpoint(uuid)
            except NotFoundError:
                continue  # named by the deletion below
            self.roles.checkpoint(who, record, EDITOR, owner_may=True)
        return checkpoints.delete_response(
            self.store,
            request,
            user=None,  # the roles above: editors of its workspace, or its owner
            default_root=self.master.config.checkpoint_root,
            policy=self.master.config.storage_policy,
        )

    @maps_errors
    def GetCheckpoint(  # noqa: N802
        self, request: api_pb2.GetCheckpointRequest, context: grpc.ServicerContext
    ) -> common_pb2.Checkpoint:
        record = self.store.get_checkpoint(request.uuid)
        self.roles.checkpoint(self._who(context), record)
        trial = self.store.get_trial(record.trial_id)
        return wire.checkpoint(record, trial.experiment_id)

    @maps_errors
    def CreateModel(  # noqa: N802
        self, request: api_pb2.CreateModelRequest, context: grpc.ServicerContext
    ) -> api_pb2.Model:
        who = self._who(context)
        workspace_id = _registry.workspace_for_new_model(self.roles, who, request.workspace)
        record = self.store.create_model(
            request.name,
            owner_id=who.user_id,
            workspace_id=workspace_id,
            description=request.description,
            labels=list(request.labels),
            metadata=_registry.metadata(request.metadata),
        )
        return _registry.model_message(record)

    @maps_errors
    def GetModel(  # noqa: N802
        self, request: api_pb2.GetModelRequest, context: grpc.ServicerContext
    ) -> api_pb2.Model:
        return _registry.model_message(self.store.get_model(request.name))

    @maps_errors
    def ListModels(  # noqa: N802
        self, request: api_pb2.ListModelsRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListModelsResponse:
        found = self.store.list_models(
            name=request.name or None,
            label=request.label or None,
            archived=request.archived if request.HasField("archived") else None,
        )
        return api_pb2.ListModelsResponse(models=[_registry.model_message(m) for m in found])

    @maps_errors
    def PatchModel(  # noqa: N802
        self, request: api_pb2.PatchModelRequest, context: grpc.ServicerContext
    ) -> api_pb2.Model:
        self._may_change_model(context, request.name, "change")
        record = self.store.patch_model(
            request.name,
            description=request.description if request.HasField("description") else None,
            labels=list(request.labels.labels) if request.HasField("labels") else None,
            metadata=(
                _registry.metadata(request.metadata) if request.HasField("metadata") else None
            ),
        )
        return _registry.model_message(record)

    @maps_errors
    def ArchiveModel(  # noqa: N802
        self, request: api_pb2.ArchiveModelRequest, context: grpc.ServicerContext
    ) -> api_pb2.Model:
        self._may_change_model(context, request.name, "archive")
        return _registry.model_message(self.store.patch_model(request.name, archived=True))

    @maps_errors
    def UnarchiveModel(  # noqa: N802
        self, request: api_pb2.UnarchiveModelRequest, context: grpc.ServicerContext
    ) -> api_pb2.Model:
        self._may_change_model(context, request.name, "unarchive")
        return _registry.model_message(self.store.patch_model(request.name, archived=False))

    @maps_errors
    def DeleteModel(  # noqa: N802
        self, request: api_pb2.DeleteModelRequest, context: grpc.ServicerContext
    ) -> api_pb2.DeleteModelResponse:
        self._may_change_model(context, request.name, "delete")
        deleted = self.store.delete_model(request.name, force=request.force)
        return api_pb2.DeleteModelResponse(versions_deleted=deleted)

    @maps_errors
    def RegisterModelVersion(  # noqa: N802
        self, request: api_pb2.RegisterModelVersionRequest, context: grpc.ServicerContext
    ) -> api_pb2.ModelVersion:
        who = self._who(context)
        model = self.store.get_model(request.name)  # an unknown one is named first
        uuid = _registry.checkpoint_uuid(request.checkpoint_uuid)
        # The checkpoint's workspace first: to a non-member it does not exist.
        _registry.may_register(self.roles, who, self.store.get_checkpoint(uuid))
        _registry.may_change_model(self.roles, who, model, "add versions to")
        record = self.store.register_version(
            request.name,
            uuid,
            user_id=who.user_id,
            notes=request.notes,
            labels=list(request.labels),
            metadata=_registry.metadata(request.metadata),
        )
        return _registry.version_message(self.store, record, readable=True)  # checked above

    @maps_errors
    def ListModelVersions(  # noqa: N802
        self, request: api_pb2.ListModelVersionsRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListModelVersionsResponse:
        who = self._who(context)
        versions = self.store.list_versions(request.name)
        return api_pb2.ListModelVersionsResponse(
            versions=[
                _registry.version_message(
                    self.store, v, readable=self._reads(who, v.checkpoint_uuid)
                )
                for v in versions
            ]
        )

    @maps_errors
    def GetModelVersion(  # noqa: N802
        self, request: api_pb2.GetModelVersionRequest, context: grpc.ServicerContext
    ) -> api_pb2.ModelVersion:
        record = self.store.get_version(request.name, request.version)
        readable = self._reads(self._who(context), record.checkpoint_uuid)
        return _registry.version_message(self.store, record, readable=readable)

    def _may_change_model(self, context: grpc.ServicerContext, name: str, what: str) -> Principal:
        """The caller, if they may `what` model `name` (`_registry.may_change_model`)."""
        who = self._who(context)
        _registry.may_change_model(self.roles, who, self.store.get_model(name), what)
        return who

    def _reads(self, who: Principal, uuid: str) -> bool:
        """Whether `who` may read checkpoint `uuid` (its workspace's members and admins)."""
        try:
            self.roles.checkpoint(who, self.store.get_checkpoint(uuid))
        except NotFoundError:
            return False
        return True

    @maps_errors
    def PatchModelVersion(  # noqa: N802
        self, request: api_pb2.PatchModelVersionRequest, context: grpc.ServicerContext
    ) -> api_pb2.ModelVersion:
        who = self._may_change_model(context, request.name, "change versions of")
        record = self.store.patch_version(
            request.name,
            request.version,
            notes=request.notes if request.HasField("notes") else None,
            labels=list(request.labels.labels) if request.HasField("labels") else None,
            metadata=(
                _registry.metadata(request.metadata) if request.HasField("metadata") else None
            ),
        )
        readable = self._reads(who, record.checkpoint_uuid)
        return _registry.version_message(self.store, record, readable=readable)

    @maps_errors
    def DeleteModelVersion(  # noqa: N802
        self, request: api_pb2.DeleteModelVersionRequest, context: grpc.ServicerContext
    ) -> api_pb2.DeleteModelVersionResponse:
        self._may_change_model(context, request.name, "delete versions of")
        self.store.delete_version(request.name, request.version)
        return api_pb2.DeleteModelVersionResponse()
