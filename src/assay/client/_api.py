"""`Client`: the channel to the master with one typed method per RPC."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ._registry_calls import RegistryCalls

if TYPE_CHECKING:
    from assay.proto import api_pb2, common_pb2

CREATE_TIMEOUT_S = 300.0
# A submission up to this size is one message (the master takes at most 4 MiB); a
# larger model definition is sent in pieces of UPLOAD_CHUNK_BYTES.
INLINE_UPLOAD_BYTES = 3 * 2**20
UPLOAD_CHUNK_BYTES = 2**20


class Client(RegistryCalls):
    """A lazily opened channel to `address` (HOST:PORT; HOST alone: port 8090), with a
    typed method for each of the master's RPCs."""

    def get_master_info(self) -> api_pb2.MasterInfo:
        from assay.proto import api_pb2

        info: api_pb2.MasterInfo = self._unary("GetMasterInfo", api_pb2.GetMasterInfoRequest())
        return info

    def get_master_config(self) -> str:
        """The master's settings as YAML, secrets hidden (administrators only)."""
        from assay.proto import api_pb2

        request = api_pb2.GetMasterConfigRequest()
        response: api_pb2.GetMasterConfigResponse = self._unary("GetMasterConfig", request)
        return response.yaml

    def stream_master_logs(
        self, *, tail: int = 0, follow: bool = False
    ) -> Iterator[api_pb2.MasterLogLine]:
        """The master's recent log lines, then, with `follow`, each new one (admins)."""
        from assay.proto import api_pb2

        request = api_pb2.StreamMasterLogsRequest(tail=tail, follow=follow)
        timeout = None if follow else 10 * self.timeout
        with self._errors(timeout):
            metadata = self._metadata()
            yield from self.stub.StreamMasterLogs(request, timeout=timeout, metadata=metadata)

    def create_experiment(
        self, config_yaml: str, model_definition: bytes, activate: bool
    ) -> api_pb2.CreateExperimentResponse:
        from assay.proto import api_pb2

        response: api_pb2.CreateExperimentResponse
        # Uploads can be up to 96 MiB: allow for a slow link, not just a slow master.
        if len(model_definition) + len(config_yaml.encode()) <= INLINE_UPLOAD_BYTES:
            request = api_pb2.CreateExperimentRequest(
                config_yaml=config_yaml, model_definition=model_definition, activate=activate
            )
            response = self._unary("CreateExperiment", request, timeout=CREATE_TIMEOUT_S)
            return response
        # The master takes at most 4 MiB a message: a larger archive goes in pieces.
        chunks = [
            api_pb2.CreateExperimentChunk(
                model_definition_part=model_definition[at : at + UPLOAD_CHUNK_BYTES]
            )
            for at in range(0, len(model_definition), UPLOAD_CHUNK_BYTES)
        ] or [api_pb2.CreateExperimentChunk()]
        chunks[0].config_yaml, chunks[0].activate = config_yaml, activate
        response = self._unary("CreateExperimentStream", chunks, timeout=CREATE_TIMEOUT_S)
        return response

    def get_experiment(self, experiment_id: int) -> api_pb2.GetExperimentResponse:
        from assay.proto import api_pb2

        request = api_pb2.GetExperimentRequest(id=experiment_id)
        response: api_pb2.GetExperimentResponse = self._unary("GetExperiment", request)
        return response

    def patch_experiment(
        self,
        experiment_id: int,
        *,
        name: str | None = None,
        description: str | None = None,
        labels: list[str] | None = None,
        add_labels: list[str] | None = None,
        remove_labels: list[str] | None = None,
    ) -> common_pb2.Experiment:
        """Change what is given; `labels` replaces them, then the adds and removes apply."""
        from assay.proto import api_pb2

        request = api_pb2.PatchExperimentRequest(
            id=experiment_id, add_labels=add_labels or [], remove_labels=remove_labels or []
        )
        if name is not None:
            request.name = name
        if description is not None:
            request.description = description
        if labels is not None:
            request.labels.SetInParent()
            request.labels.labels.extend(labels)
        experiment: common_pb2.Experiment = self._unary("PatchExperiment", request)
        return experiment

    def create_template(self, name: str, config_yaml: str) -> api_pb2.Template:
        from assay.proto import api_pb2

        request = api_pb2.CreateTemplateRequest(name=name, config_yaml=config_yaml)
        template: api_pb2.Template = self._unary("CreateTemplate", request)
        return template

    def get_template(self, name: str) -> api_pb2.Template:
        from assay.proto import api_pb2

        template: api_pb2.Template = self._unary(
            "GetTemplate", api_pb2.GetTemplateRequest(name=name)
        )
        return template

    def list_templates(self) -> list[api_pb2.Template]:
        from assay.proto import api_pb2

        response: api_pb2.ListTemplatesResponse = self._unary(
            "ListTemplates", api_pb2.ListTemplatesRequest()
        )
        return list(response.templates)

    def delete_template(self, name: str) -> None:
        from assay.proto import api_pb2

        self._unary("DeleteTemplate", api_pb2.DeleteTemplateRequest(name=name))

    def get_model_definition(self, experiment_id: int) -> bytes:
        """The experiment's model definition as uploaded (a tar.gz archive)."""
        from assay.proto import api_pb2

        request = api_pb2.GetModelDefinitionRequest(experiment_id=experiment_id)
        # Up to 96 MiB: allow for a slow link, as an upload does.
        response: api_pb2.GetModelDefinitionResponse = self._unary(
            "GetModelDefinition", request, timeout=CREATE_TIMEOUT_S
        )
        return response.model_definition

    def list_experiments(
        self, request: api_pb2.ListExperimentsRequest
    ) -> api_pb2.ListExperimentsResponse:
        response: api_pb2.ListExperimentsResponse = self._unary("ListExperiments", request)
        return response

    def experiment_action(self, experiment_id: int, action: int) -> common_pb2.Experiment:
        from assay.proto import api_pb2

        request = api_pb2.ExperimentActionRequest(id=experiment_id, action=action)  # type: ignore[arg-type]
        experiment: common_pb2.Experiment = self._unary("ExperimentAction", request)
        return experiment

    def delete_experiment(self, experiment_id: int) -> api_pb2.DeleteExperimentResponse:
        from assay.proto import api_pb2

        request = api_pb2.DeleteExperimentRequest(id=experiment_id)
        # Deleting from object storage takes a request per checkpoint: allow for many.
        response: api_pb2.DeleteExperimentResponse = self._unary(
            "DeleteExperiment", request, timeout=CREATE_TIMEOUT_S
        )
        return response

    def kill_trial(self, trial_id: int) -> common_pb2.Trial:
        from assay.proto import api_pb2

        trial: common_pb2.Trial = self._unary("KillTrial", api_pb2.KillTrialRequest(id=trial_id))
        return trial

    def continue_experiment(self, experiment_id: int, config_yaml: str) -> common_pb2.Experiment:
        """Continue a finished single-trial experiment (`config_yaml`: the keys to change)."""
        from assay.proto import api_pb2

        request = api_pb2.ContinueExperimentRequest(id=experiment_id, config_yaml=config_yaml)
        experiment: common_pb2.Experiment = self._unary("ContinueExperiment", request)
        return experiment

    def set_experiment_resource(
        self, experiment_id: int, name: str, value: str
    ) -> common_pb2.Experiment:
        from assay.proto import api_pb2

        request = api_pb2.SetExperimentResourceRequest(id=experiment_id, name=name, value=value)
        experiment: common_pb2.Experiment = self._unary("SetExperimentResource", request)
        return experiment

    def get_queue(self) -> list[api_pb2.QueuedTrial]:
        from assay.proto import api_pb2

        response: api_pb2.GetQueueResponse = self._unary("GetQueue", api_pb2.GetQueueRequest())
        return list(response.trials)

    def get_trial(self, trial_id: int) -> common_pb2.Trial:
        from assay.proto import api_pb2

        trial: common_pb2.Trial = self._unary("GetTrial", api_pb2.GetTrialRequest(id=trial_id))
        return trial

    def get_trial_metrics(
        self, trial_id: int, group: str, max_points: int = 0
    ) -> api_pb2.GetTrialMetricsResponse:
        """`max_points` 0: every report."""
        from assay.proto import api_pb2

        request = api_pb2.GetTrialMetricsRequest(id=trial_id, group=group, max_points=max_points)
        response: api_pb2.GetTrialMetricsResponse = self._unary("GetTrialMetrics", request)
        return response

    def stream_trial_logs(
        self,
        trial_id: int,
        *,
        after_id: int = 0,
        follow: bool = False,
        tail: int = 0,
        head: int = 0,
        ranks: Sequence[int] = (),
        min_level: str = "",
        since: str = "",
        search_text: str = "",
    ) -> Iterator[common_pb2.LogLine]:
        """Log lines in order. Without `follow` the whole call has a deadline (5 min).

        The master keeps only the lines of `ranks`, of `min_level` or higher (a line
        without a level counts as INFO), stamped at or after `since` (RFC 3339) and
        containing `search_text`, before `head` or `tail` counts them."""
        from assay.proto import api_pb2

        request = api_pb2.StreamTrialLogsRequest(
            trial_id=trial_id,
            after_id=after_id,
            follow=follow,
            tail=tail,
            head=head,
            ranks=list(ranks),
            min_level=min_level,
            since=since,
            search_text=search_text,
        )
        timeout = None if follow else 10 * self.timeout
        with self._errors(timeout):
            metadata = self._metadata()
            yield from self.stub.StreamTrialLogs(request, timeout=timeout, metadata=metadata)

    def list_checkpoints(
        self, experiment_id: int, trial_id: int = 0
    ) -> list[common_pb2.Checkpoint]:
        from assay.proto import api_pb2

        request = api_pb2.ListCheckpointsRequest(experiment_id=experiment_id, trial_id=trial_id)
        response: api_pb2.ListCheckpointsResponse = self._unary("ListCheckpoints", request)
        return list(response.checkpoints)

    def get_checkpoint(self, uuid: str) -> common_pb2.Checkpoint:
        from assay.proto import api_pb2

        request = api_pb2.GetCheckpointRequest(uuid=uuid)
        checkpoint: common_pb2.Checkpoint = self._unary("GetCheckpoint", request)
        return checkpoint

    def delete_checkpoints(self, uuids: list[str]) -> api_pb2.DeleteCheckpointsResponse:
        from assay.proto import api_pb2

        request = api_pb2.DeleteCheckpointsRequest(uuids=uuids)
        # Deleting from object storage takes a request per checkpoint: allow for many.
        response: api_pb2.DeleteCheckpointsResponse = self._unary(
            "DeleteCheckpoints", request, timeout=CREATE_TIMEOUT_S
        )
        return response

    def get_usage(self, *, by: str, since: str, until: str) -> api_pb2.GetUsageResponse:
        from assay.proto import api_pb2

        request = api_pb2.GetUsageRequest(by=by, since=since, until=until)
        response: api_pb2.GetUsageResponse = self._unary("GetUsage", request)
        return response

    def list_agents(self) -> list[common_pb2.Agent]:
        from assay.proto import api_pb2

        response: api_pb2.ListAgentsResponse = self._unary(
            "ListAgents", api_pb2.ListAgentsRequest()
        )
        return list(response.agents)

    def set_agent_enabled(
        self, agent_id: str, enabled: bool, drain: bool = False
    ) -> common_pb2.Agent:
        from assay.proto import api_pb2

        request = api_pb2.SetAgentEnabledRequest(id=agent_id, enabled=enabled, drain=drain)
        agent: common_pb2.Agent = self._unary("SetAgentEnabled", request)
        return agent

    def list_resource_pools(self) -> list[api_pb2.ResourcePool]:
        from assay.proto import api_pb2

        response: api_pb2.ListResourcePoolsResponse = self._unary(
            "ListResourcePools", api_pb2.ListResourcePoolsRequest()
        )
        return list(response.pools)

    def pool_workspaces(self, method: str, pool: str, workspace: str = "") -> list[Any]:
        """The bindings of `pool` (a `PoolBinding` each) after `method`:
        ListResourcePoolWorkspaces, BindResourcePool or UnbindResourcePool."""
        from assay.proto import api_pb2

        request: Any
        if method == "BindResourcePool":
            request = api_pb2.BindResourcePoolRequest(pool=pool, workspace=workspace)
        elif method == "UnbindResourcePool":
            request = api_pb2.UnbindResourcePoolRequest(pool=pool, workspace=workspace)
        else:
            request = api_pb2.ListResourcePoolWorkspacesRequest(pool=pool)
        response: api_pb2.ResourcePoolWorkspaces = self._unary(method, request)
        return list(response.bindings)

    def remove_agent(self, agent_id: str) -> bool:
        """Forget the agent's credential; True if it was connected (now disconnected)."""
        from assay.proto import api_pb2

        request = api_pb2.RemoveAgentRequest(id=agent_id)
        response: api_pb2.RemoveAgentResponse = self._unary("RemoveAgent", request)
        return response.disconnected
