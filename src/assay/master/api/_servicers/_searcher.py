"""API handlers for a custom searcher: the events it reads, the operations it posts."""

from __future__ import annotations

import grpc

from assay.master.api._servicers._base import ServicerBase
from assay.master.api._status import maps_errors
from assay.proto import api_pb2


class SearcherRpcs(ServicerBase):
    """A custom search's runner steers its experiment (see `_custom_search`)."""

    @maps_errors
    def GetSearcherEvents(  # noqa: N802
        self, request: api_pb2.GetSearcherEventsRequest, context: grpc.ServicerContext
    ) -> api_pb2.GetSearcherEventsResponse:
        from assay.master import submission

        # The runner steers the search: an editor's role, as pausing the experiment is.
        self._may_change(self._who(context), request.experiment_id)
        view = submission.searcher_events(
            self.master, request.experiment_id, request.after_event_id
        )
        return submission.events_response(view)

    @maps_errors
    def PostSearcherOperations(  # noqa: N802
        self, request: api_pb2.PostSearcherOperationsRequest, context: grpc.ServicerContext
    ) -> api_pb2.PostSearcherOperationsResponse:
        from assay.master import submission

        self._may_change(self._who(context), request.experiment_id)
        acknowledged = submission.post_operations(
            self.master,
            request.experiment_id,
            request.triggered_by_event_id,
            submission.operations_of(request),
            method_state=request.method_state,
            progress=request.progress if request.HasField("progress") else None,
            cap=self.master.config.custom_search_trials,
        )
        return api_pb2.PostSearcherOperationsResponse(acknowledged_event_id=acknowledged)
