"""API handlers that submit experiments (plain and streamed archives), on the event loop."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import grpc

from assay.common.archive import MAX_MODEL_DEF_BYTES
from assay.master import submission, wire
from assay.master.api._servicers._base import ServicerBase
from assay.master.api._status import maps_errors_async
from assay.master.auth import caller
from assay.master.errors import InvalidArgumentError, ResourceExhaustedError
from assay.master.store import ModelDefinition, size_of
from assay.master.submission import Upload, UploadSpool
from assay.proto import api_pb2

# Model archives up to this size are checked on the event loop (a few milliseconds).
INLINE_ARCHIVE_BYTES = 2**20
# Streamed uploads one user may have in flight (each writes up to MAX_MODEL_DEF_BYTES to
# the master's disk, one piece in memory at a time).
UPLOADS_PER_USER = 2
INLINE_CONFIG_CHARS = 2**16


class SubmissionRpcs(ServicerBase):
    """CreateExperiment and CreateExperimentStream."""

    @maps_errors_async
    async def CreateExperiment(  # noqa: N802
        self,
        request: api_pb2.CreateExperimentRequest,
        context: grpc.aio.ServicerContext[
            api_pb2.CreateExperimentRequest, api_pb2.CreateExperimentResponse
        ],
    ) -> api_pb2.CreateExperimentResponse:
        """On the event loop: submissions are the hot path, and thread hops cost most."""
        model_definition = request.model_definition
        if request.model_definition_from:
            model_definition = await self._model_definition_from(request, context)
        return await self._create(request.config_yaml, model_definition, request.activate, context)

    async def _model_definition_from(
        self, request: api_pb2.CreateExperimentRequest, context: Any
    ) -> bytes:
        """A fork's model definition: that of the experiment it names, which the caller
        must be able to read (off the loop: it reads the store)."""
        source = request.model_definition_from
        if request.model_definition:
            raise InvalidArgumentError(
                "give the model definition or model_definition_from (an experiment whose "
                "model definition to use), not both"
            )
        loop = asyncio.get_running_loop()
        who = await self._who_async(context)
        await loop.run_in_executor(self.pool, self.roles.experiment, who, source)
        return await loop.run_in_executor(self.pool, self.store.get_model_definition, source)

    @maps_errors_async
    async def CreateExperimentStream(  # noqa: N802
        self,
        request_iterator: AsyncIterator[api_pb2.CreateExperimentChunk],
        context: grpc.aio.ServicerContext[
            api_pb2.CreateExperimentChunk, api_pb2.CreateExperimentResponse
        ],
    ) -> api_pb2.CreateExperimentResponse:
        """CreateExperiment with the archive in pieces (no message may exceed the master's
        receive limit), written to disk as they come (`_spool`). A user has at most
        `UPLOADS_PER_USER` of these in flight, and each stops reading at the
        model-definition limit."""
        user = caller()
        key = user.username if user is not None else ""
        if self._uploads.get(key, 0) >= UPLOADS_PER_USER:
            raise ResourceExhaustedError(
                f"{UPLOADS_PER_USER} uploads of this user are in progress: wait for one to finish"
            )
        self._uploads[key] = self._uploads.get(key, 0) + 1
        upload = self._spool.new()
        try:
            config_yaml, activate = await self._receive(request_iterator, upload)
        except BaseException:
            upload.discard()
            raise
        finally:
            self._uploads[key] -= 1
            if not self._uploads[key]:
                del self._uploads[key]
        try:
            return await self._create(config_yaml, upload.finish(), activate, context)
        finally:
            # Checked from its file, linked by the model cache, read by the store in the
            # commit that records the experiment: the file goes after the next commit,
            # which is that one (or later), even if this call was cancelled meanwhile.
            with self.master.lock:
                self.master.commit.after(upload.discard)

    @functools.cached_property
    def _spool(self) -> UploadSpool:
        return UploadSpool(self.master.config.state_dir / "uploads")

    async def _receive(
        self, request_iterator: AsyncIterator[api_pb2.CreateExperimentChunk], upload: Upload
    ) -> tuple[str, bool]:
        """The config and `activate` of the first message; every piece of the archive
        written to `upload` as it comes (off the loop), up to the model-definition limit."""
        loop = asyncio.get_running_loop()
        config_yaml: str | None = None
        activate = False
        async for chunk in request_iterator:
            if config_yaml is None:
                config_yaml, activate = chunk.config_yaml, chunk.activate
            piece = chunk.model_definition_part
            if upload.size + len(piece) > MAX_MODEL_DEF_BYTES:
                raise InvalidArgumentError(
                    f"the model definition is over {MAX_MODEL_DEF_BYTES // 2**20} MiB: "
                    "leave data and checkpoints out of the model directory "
                    "(list them in .assayignore) and load data from storage"
                )
            if piece:
                await loop.run_in_executor(self.pool, upload.write, piece)
        if config_yaml is None:
            raise InvalidArgumentError("no message came: the first one carries the config")
        return config_yaml, activate

    async def _create(
        self,
        config_yaml: str,
        model_definition: ModelDefinition,
        activate: bool,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> api_pb2.CreateExperimentResponse:
        loop = asyncio.get_running_loop()
        args = (config_yaml, model_definition)
        who = await self._who_async(context)
        owner = who.username
        size = size_of(model_definition)
        inline = size <= INLINE_ARCHIVE_BYTES
        if not inline or len(config_yaml) > INLINE_CONFIG_CHARS:
            # Checking a big archive takes a while: not on the loop the agents use.
            prepared = await loop.run_in_executor(
                self.pool, partial(self.master.prepare_experiment, owner=owner), *args
            )
        else:
            prepared = self.master.prepare_experiment(*args, owner=owner)
        config = prepared.config
        submission.check_config_cap(config, self.master.config.custom_search_trials)
        # From the store's directory when it is fresh (no thread hop); else off the loop,
        # which also explains a refusal the directory cannot (an unknown name).
        project = self.roles.new_experiment_project_now(who, config.workspace, config.project)
        if project is None:
            project = await loop.run_in_executor(
                self.pool,
                partial(self.roles.new_experiment_project, who, config.workspace, config.project),
            )
        prepared = dataclasses.replace(prepared, project_id=project.id)
        # A pool bound to workspaces takes experiments of those only (_pool_access).
        access = self.master.pool_access
        generation = access.generation
        directory = self.store.directory
        snapshot = directory.cached()
        if snapshot is None:
            snapshot = await loop.run_in_executor(self.pool, directory.get)
        access.check(config.raw, project.workspace_id, snapshot)
        self.master.quota.take(prepared.owner_id, who.admin, size)
        record, ticket, why = self.master.add_experiment(prepared, activate=activate)
        await self.master.commit.wait_async(ticket)
        if access.generation != generation:  # a binding changed since the check
            await loop.run_in_executor(self.pool, access.hold_back, self.master, [record.id])
        experiment = wire.experiment(record, num_trials=1, parsed=prepared.config)
        experiment.workspace, experiment.project = project.workspace, project.name
        experiment.waiting = why or ""
        warnings = (
            [
                f"its trials cannot start on this cluster as it is: each {why}; they wait until "
                "agents that can hold them connect or are enabled"
            ]
            if why
            else []
        )
        return api_pb2.CreateExperimentResponse(experiment=experiment, warnings=warnings)
