"""API handlers for trials: read, kill, metrics, and the streamed logs."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import TypeVar

import grpc

from assay.master import wire
from assay.master.api._servicers._base import ServicerBase
from assay.master.api._status import maps_errors, maps_errors_stream
from assay.master.auth import EDITOR, metadata_dict
from assay.master.telemetry import log_filter, stream_trial_logs
from assay.proto import api_pb2, common_pb2

_T = TypeVar("_T")


class TrialRpcs(ServicerBase):
    """One trial, its metrics and its logs (who may read: `_roles`)."""

    @maps_errors
    def KillTrial(  # noqa: N802
        self, request: api_pb2.KillTrialRequest, context: grpc.ServicerContext
    ) -> common_pb2.Trial:
        self.roles.trial(self._who(context), request.id, EDITOR)  # as killing its experiment
        self.master.kill_trial(request.id)
        return wire.trial(self.store.get_trial(request.id))

    @maps_errors
    def GetTrial(  # noqa: N802
        self, request: api_pb2.GetTrialRequest, context: grpc.ServicerContext
    ) -> common_pb2.Trial:
        self.roles.trial(self._who(context), request.id)
        trial = wire.trial(self.store.get_trial(request.id))
        allocation_id = self.master.run_of_trial.get(request.id)
        if allocation_id is not None:  # running: each rank's latest utilisation
            trial.ranks.extend(self.master.rank_usage.ranks(allocation_id))
        return trial

    @maps_errors
    def GetTrialMetrics(  # noqa: N802
        self, request: api_pb2.GetTrialMetricsRequest, context: grpc.ServicerContext
    ) -> api_pb2.GetTrialMetricsResponse:
        self.roles.trial(self._who(context), request.id)
        group = request.group or "validation"
        curves = self.store.trial_curves(
            request.id, group=group, max_points=request.max_points or 100_000
        )
        by_batch: dict[int, dict[str, float]] = {}
        for name, curve in curves.items():
            for batches, value in curve:
                by_batch.setdefault(batches, {})[name] = value
        return api_pb2.GetTrialMetricsResponse(
            reports=[
                common_pb2.MetricsReport(total_batches=b, metrics=m)
                for b, m in sorted(by_batch.items())
            ]
        )

    @maps_errors_stream
    async def StreamTrialLogs(  # noqa: N802
        self,
        request: api_pb2.StreamTrialLogsRequest,
        context: grpc.aio.ServicerContext[api_pb2.StreamTrialLogsRequest, common_pb2.LogLine],
    ) -> AsyncIterator[common_pb2.LogLine]:
        """On the event loop: a follower waits with asyncio, holding no thread; each read
        of the store runs on the pool. A user follows at most `log_followers_per_user`
        logs at once."""
        loop = asyncio.get_running_loop()
        metadata = metadata_dict(context.invocation_metadata())

        async def read(call: Callable[[], _T]) -> _T:
            return await loop.run_in_executor(self.pool, call)

        who = await self._who_async(context)
        await read(partial(self.roles.trial, who, request.trial_id))
        where = log_filter(
            request.ranks,
            request.min_level,
            request.since,
            request.search_text,
            head=request.head,
            tail=request.tail,
            follow=request.follow,
        )
        lines = stream_trial_logs(
            self.store,
            read,
            request.trial_id,
            after_id=request.after_id,
            tail=request.tail,
            head=request.head,
            follow=request.follow,
            where=where,
            still_allowed=partial(read, partial(self.guard.principal, metadata)),
        )
        slot: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
        if request.follow:
            slot = self.log_followers.hold(who.username)
        with slot:
            async with contextlib.aclosing(lines):
                async for line in lines:
                    yield wire.log_line(line, request.trial_id)
