"""API handlers for experiments: read, list, steer, edit, delete."""

from __future__ import annotations

import grpc

from assay.master import checkpoints, wire
from assay.master.api._servicers._base import ServicerBase
from assay.master.api._status import maps_errors
from assay.master.auth import EDITOR
from assay.master.errors import InvalidArgumentError
from assay.master.telemetry import fill_pareto
from assay.proto import api_pb2, common_pb2

_ACTIONS = {
    api_pb2.EXPERIMENT_ACTION_PAUSE: "pause",
    api_pb2.EXPERIMENT_ACTION_ACTIVATE: "activate",
    api_pb2.EXPERIMENT_ACTION_CANCEL: "cancel",
    api_pb2.EXPERIMENT_ACTION_KILL: "kill",
    api_pb2.EXPERIMENT_ACTION_ARCHIVE: "archive",
    api_pb2.EXPERIMENT_ACTION_UNARCHIVE: "unarchive",
}


class ExperimentRpcs(ServicerBase):
    """One experiment or a page of them; its actions, config, labels and metrics."""

    @maps_errors
    def GetExperiment(  # noqa: N802
        self, request: api_pb2.GetExperimentRequest, context: grpc.ServicerContext
    ) -> api_pb2.GetExperimentResponse:
        who = self._may_read(context, request.id)
        experiment = self._experiment(request.id, with_text=True)
        trials = [wire.trial(t) for t in self.store.list_trials(request.id)]
        waiting = self.master.unplaceable
        for trial in trials:
            if trial.state == common_pb2.TRIAL_STATE_QUEUED:
                trial.waiting = waiting.get(trial.id, "")
        names = [
            api_pb2.MetricName(group=group, name=name)
            for group, name in self.store.experiment_metric_names(request.id)
        ]
        response = api_pb2.GetExperimentResponse(
            experiment=experiment, trials=trials, metric_names=names
        )
        record = self.store.get_experiment(request.id)
        fill_pareto(self.store, request.id, record.config, response)  # searcher.metrics
        if who.admin or experiment.owner == who.username:  # usage is its owner's to see
            response.slot_seconds = self.store.experiment_slot_seconds([request.id])[request.id]
        return response

    @maps_errors
    def ListExperiments(  # noqa: N802
        self, request: api_pb2.ListExperimentsRequest, context: grpc.ServicerContext
    ) -> api_pb2.ListExperimentsResponse:
        states = [
            common_pb2.ExperimentState.Name(s).removeprefix("EXPERIMENT_STATE_")
            for s in request.states
        ]
        page = self.store.list_experiments(
            states=states,
            name=request.name or None,
            label=request.label or None,
            owner=request.owner or None,
            archived=request.archived if request.HasField("archived") else None,
            workspaces=self.roles.visible(self._who(context)),
            workspace=request.workspace or None,
            project=request.project or None,
            sort=request.sort_by or "id",
            descending=not request.ascending,
            limit=request.limit or 50,
            offset=request.offset,
        )
        return api_pb2.ListExperimentsResponse(
            experiments=[self._experiment(e.id) for e in page.items], total=page.total
        )

    @maps_errors
    def ExperimentAction(  # noqa: N802
        self, request: api_pb2.ExperimentActionRequest, context: grpc.ServicerContext
    ) -> common_pb2.Experiment:
        action = _ACTIONS.get(request.action)
        if action is None:
            raise InvalidArgumentError(
                "unknown experiment action; give one of pause, "
                "activate, cancel, kill, archive, unarchive"
            )
        self._may_change(self._who(context), request.id)
        self.master.experiment_action(request.id, action)
        return self._experiment(request.id)

    @maps_errors
    def ContinueExperiment(  # noqa: N802
        self, request: api_pb2.ContinueExperimentRequest, context: grpc.ServicerContext
    ) -> common_pb2.Experiment:
        from assay.master.submission import parse_overrides

        self._may_change(self._who(context), request.id)  # an editor, as for activate
        overrides = parse_overrides(request.id, request.config_yaml)
        self.master.pool_access.may_continue(request.id)  # a continue keeps its pool
        self.master.continue_experiment(request.id, overrides)
        self.master.pool_access.hold_back(self.master, [request.id])
        return self._experiment(request.id)

    @maps_errors
    def SetExperimentResource(  # noqa: N802
        self, request: api_pb2.SetExperimentResourceRequest, context: grpc.ServicerContext
    ) -> common_pb2.Experiment:
        self._may_change(self._who(context), request.id)
        self.master.set_experiment_resource(request.id, request.name, request.value)
        return self._experiment(request.id)

    @maps_errors
    def GetExperimentMetrics(  # noqa: N802
        self, request: api_pb2.GetExperimentMetricsRequest, context: grpc.ServicerContext
    ) -> api_pb2.GetExperimentMetricsResponse:
        self._may_read(context, request.id)
        curves = self.store.experiment_curves(
            request.id,
            request.name,
            group=request.group or "validation",
            max_points=request.max_points or 1000,
        )
        return api_pb2.GetExperimentMetricsResponse(
            curves=[
                api_pb2.Curve(trial_id=t, total_batches=[b for b, _ in c], values=[v for _, v in c])
                for t, c in curves.items()
            ]
        )

    @maps_errors
    def PatchExperiment(  # noqa: N802
        self, request: api_pb2.PatchExperimentRequest, context: grpc.ServicerContext
    ) -> common_pb2.Experiment:
        from assay.config import text_problems

        self._may_change(self._who(context), request.id)
        name = request.name.strip() if request.HasField("name") else None
        description = request.description if request.HasField("description") else None
        labels = list(request.labels.labels) if request.HasField("labels") else None
        added, removed = list(request.add_labels), list(request.remove_labels)
        problems = (
            [] if description is None else text_problems(description, "description", "description")
        )
        for text, kind in [
            *([(name, "name")] if name is not None else []),
            *((label, "label") for label in [*(labels or []), *added]),
        ]:
            if not text.strip() or "\x00" in text:
                problems.append(f"{kind} {text!r}: give 1 or more characters, without NUL")
            problems.extend(text_problems(text, kind, kind))  # type: ignore[arg-type]
        if problems:
            raise InvalidArgumentError("; ".join(problems))
        self.store.patch_experiment(
            request.id,
            name=name,
            description=description,
            labels=labels,
            add_labels=added,
            remove_labels=removed,
        )
        return self._experiment(request.id)

    @maps_errors
    def GetModelDefinition(  # noqa: N802
        self, request: api_pb2.GetModelDefinitionRequest, context: grpc.ServicerContext
    ) -> api_pb2.GetModelDefinitionResponse:
        self._may_read(context, request.experiment_id)
        data = self.store.get_model_definition(request.experiment_id)  # NOT_FOUND names the id
        return api_pb2.GetModelDefinitionResponse(model_definition=data)

    @maps_errors
    def DeleteExperiment(  # noqa: N802
        self, request: api_pb2.DeleteExperimentRequest, context: grpc.ServicerContext
    ) -> api_pb2.DeleteExperimentResponse:
        # Editors of its workspace (and its owner) delete it; see checkpoints.delete_experiment.
        self.roles.experiment(self._who(context), request.id, EDITOR, owner_may=True)
        result = checkpoints.delete_experiment(
            self.store,
            request.id,
            default_root=self.master.config.checkpoint_root,
            policy=self.master.config.storage_policy,
            delete_rows=self.master.delete_experiment_rows,
        )
        return api_pb2.DeleteExperimentResponse(
            deleted_checkpoints=list(result.deleted), failed=dict(result.failed)
        )
