"""`TrialService`: the calls of a trial's processes (the Trial harness and Core API
scripts), authenticated by their allocation's token; thin: parse, call `Master`, reply."""

from __future__ import annotations

import os
import random

import grpc

from assay.master import checkpoints
from assay.master._core import Master
from assay.master.api._status import maps_errors
from assay.master.lifecycle import Run
from assay.master.store import CheckpointRecord, MetricReport
from assay.proto import trial_pb2, trial_pb2_grpc

TOKEN_HEADER = "x-assay-token"
# Fault injection for the reliability tests: this fraction of ReportMetrics replies is
# replaced by UNAVAILABLE after the metrics were stored, as a lost reply would be.
DROP_METRIC_REPLIES = float(os.environ.get("ASSAY_FAULT_DROP_METRIC_REPLIES", "0") or 0)


class TrialServicer(trial_pb2_grpc.TrialServiceServicer):
    def __init__(self, master: Master) -> None:
        self.master = master

    def _run(self, context: grpc.ServicerContext, trial_id: int, run_id: int) -> Run:
        token = dict(context.invocation_metadata()).get(TOKEN_HEADER, "")
        run = self.master.run_for_token(str(token), trial_id, run_id)
        return run

    @maps_errors
    def NextOperation(  # noqa: N802
        self, request: trial_pb2.NextOperationRequest, context: grpc.ServicerContext
    ) -> trial_pb2.Operation:
        run = self._run(context, request.trial_id, request.run_id)
        target = self.master.next_operation(run, request.total_batches)
        if target is None:
            return trial_pb2.Operation(stop=True)
        return trial_pb2.Operation(total_batches=target)

    @maps_errors
    def CompleteOperation(  # noqa: N802
        self, request: trial_pb2.CompleteOperationRequest, context: grpc.ServicerContext
    ) -> trial_pb2.CompleteOperationResponse:
        run = self._run(context, request.trial_id, request.run_id)
        self.master.complete_operation(
            run,
            request.total_batches,
            request.searcher_metric,
            stop_requested=request.stop_requested,
        )
        return trial_pb2.CompleteOperationResponse()

    @maps_errors
    def ReportMetrics(  # noqa: N802
        self, request: trial_pb2.ReportMetricsRequest, context: grpc.ServicerContext
    ) -> trial_pb2.ReportMetricsResponse:
        run = self._run(context, request.trial_id, request.run_id)
        reports = [MetricReport(r.total_batches, dict(r.metrics)) for r in request.reports]
        stored = self.master.report_metrics(run, request.group, reports)
        if DROP_METRIC_REPLIES and random.random() < DROP_METRIC_REPLIES:
            # Fault injection (tests only): the rows are committed, the reply is lost.
            context.abort(grpc.StatusCode.UNAVAILABLE, "reply dropped (fault injection)")
        return trial_pb2.ReportMetricsResponse(stored=stored)

    @maps_errors
    def ReportCheckpoint(  # noqa: N802
        self, request: trial_pb2.ReportCheckpointRequest, context: grpc.ServicerContext
    ) -> trial_pb2.ReportCheckpointResponse:
        run = self._run(context, request.trial_id, request.run_id)
        checkpoint = request.checkpoint
        files = checkpoint.files
        record = CheckpointRecord(
            uuid=checkpoint.uuid,
            trial_id=run.trial_id,
            run_id=run.run_id,
            total_batches=checkpoint.total_batches,
            state="COMPLETED",
            location=checkpoint.location,
            files={f.name: f.size_bytes for f in files},
            user_metadata={
                "sha256": {f.name: f.sha256 for f in files},
                "validation_metrics": dict(checkpoint.validation_metrics),
                "metadata": checkpoints.reported_metadata(checkpoint),
            },
        )
        self.master.report_checkpoint(run, record)
        return trial_pb2.ReportCheckpointResponse()

    @maps_errors
    def ShouldPreempt(  # noqa: N802
        self, request: trial_pb2.ShouldPreemptRequest, context: grpc.ServicerContext
    ) -> trial_pb2.ShouldPreemptResponse:
        run = self._run(context, request.trial_id, request.run_id)
        return trial_pb2.ShouldPreemptResponse(preempt=run.stopping is not None)

    @maps_errors
    def GetBestValidation(  # noqa: N802
        self, request: trial_pb2.GetBestValidationRequest, context: grpc.ServicerContext
    ) -> trial_pb2.GetBestValidationResponse:
        run = self._run(context, request.trial_id, request.run_id)
        best = self.master.best_validation(run)
        if best is None:
            return trial_pb2.GetBestValidationResponse(found=False)
        return trial_pb2.GetBestValidationResponse(found=True, value=best)

    @maps_errors
    def ReportProgress(  # noqa: N802
        self, request: trial_pb2.ReportProgressRequest, context: grpc.ServicerContext
    ) -> trial_pb2.ReportProgressResponse:
        run = self._run(context, request.trial_id, request.run_id)
        self.master.report_progress(run, request.progress)
        return trial_pb2.ReportProgressResponse()

    @maps_errors
    def DeleteTrialCheckpoints(  # noqa: N802
        self, request: trial_pb2.DeleteTrialCheckpointsRequest, context: grpc.ServicerContext
    ) -> trial_pb2.DeleteTrialCheckpointsResponse:
        run = self._run(context, request.trial_id, request.run_id)
        result = checkpoints.delete_checkpoints(
            self.master.store,
            list(request.uuids),
            trial_id=run.trial_id,
            default_root=self.master.config.checkpoint_root,
            policy=self.master.config.storage_policy,
        )
        return trial_pb2.DeleteTrialCheckpointsResponse(
            deleted=list(result.deleted),
            missing=list(result.missing),
            failed=dict(result.failed),
        )
