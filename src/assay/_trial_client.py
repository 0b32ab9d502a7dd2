"""The harness's gRPC client of the master's TrialService: token, deadlines and retries.

Every call carries the allocation's token (metadata `x-assay-token`) and a deadline. A
call that fails with UNAVAILABLE or DEADLINE_EXCEEDED (the master restarting, a network
blip) is retried with exponential backoff (0.2 s doubling to 5 s) for up to `retry_s`
(default 15 minutes, env `ASSAY_MASTER_RETRY_S`); the master makes every report
idempotent, so repeating a call whose answer was lost stores nothing twice. Any other
status (a fenced run's FAILED_PRECONDITION, PERMISSION_DENIED, ...) raises a
`TrialAPIError` carrying the master's message on one line. The channel is TLS when the
agent that started the process connects with TLS (`assay.common.tls.ClientTls.from_env`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message

from assay.common.tls import ClientTls
from assay.errors import AssayError
from assay.proto import trial_pb2, trial_pb2_grpc

log = logging.getLogger("assay")

R = TypeVar("R", bound=Message)

RETRY_ENV = "ASSAY_MASTER_RETRY_S"
DEFAULT_RETRY_S = 15 * 60.0
INITIAL_BACKOFF_S = 0.2
MAX_BACKOFF_S = 5.0
DEFAULT_CALL_TIMEOUT_S = 60.0
TOKEN_HEADER = "x-assay-token"

RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})

# The channel's own reconnect backoff: gRPC's default grows to 120 s, so a master that is
# back after a restart could go unnoticed for minutes; keep it in step with ours.
_CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", int(INITIAL_BACKOFF_S * 1000)),
    ("grpc.min_reconnect_backoff_ms", int(INITIAL_BACKOFF_S * 1000)),
    ("grpc.max_reconnect_backoff_ms", int(MAX_BACKOFF_S * 1000)),
    ("grpc.enable_retries", 0),  # retries are ours, with the budget above
]


class TrialAPIError(AssayError):
    """The master refused a trial call (or could not be reached); the message says why."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code


class MasterUnreachableError(TrialAPIError):
    """The master stayed unreachable for the whole retry budget."""


def retry_budget_from_env(env: Mapping[str, str] | None = None) -> float:
    """Seconds to keep retrying an unreachable master: `ASSAY_MASTER_RETRY_S` or 15 min."""
    env = os.environ if env is None else env
    raw = env.get(RETRY_ENV, "").strip()
    if not raw:
        return DEFAULT_RETRY_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also rejects nan
        raise AssayError(f"{RETRY_ENV}={raw!r} must be a number of seconds (>= 0)")
    return value


def _one_line(text: str) -> str:
    return " ".join(text.split())


class TrialClient:
    """TrialService calls for one trial run, with token, deadlines and retries."""

    def __init__(
        self,
        target: str,
        token: str,
        *,
        retry_s: float = DEFAULT_RETRY_S,
        call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        tls: ClientTls | None = None,
    ) -> None:
        """`tls` None: as ASSAY_TLS, ASSAY_CA_FILE and ASSAY_TLS_SERVER_NAME say (the
        agent sets them as it connects itself)."""
        self.target = target
        self.retry_s = retry_s
        self.call_timeout_s = call_timeout_s
        self._metadata = ((TOKEN_HEADER, token),)
        self._sleep = sleep
        self._clock = clock
        tls = ClientTls.from_env() if tls is None else tls
        self._channel = tls.channel(target, _CHANNEL_OPTIONS)
        self._stub = trial_pb2_grpc.TrialServiceStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    # --- the service --------------------------------------------------------------------

    def next_operation(self, request: trial_pb2.NextOperationRequest) -> trial_pb2.Operation:
        return self._call("NextOperation", request, trial_pb2.Operation)

    def complete_operation(
        self, request: trial_pb2.CompleteOperationRequest
    ) -> trial_pb2.CompleteOperationResponse:
        return self._call("CompleteOperation", request, trial_pb2.CompleteOperationResponse)

    def report_metrics(
        self, request: trial_pb2.ReportMetricsRequest
    ) -> trial_pb2.ReportMetricsResponse:
        return self._call("ReportMetrics", request, trial_pb2.ReportMetricsResponse)

    def report_checkpoint(
        self, request: trial_pb2.ReportCheckpointRequest
    ) -> trial_pb2.ReportCheckpointResponse:
        return self._call("ReportCheckpoint", request, trial_pb2.ReportCheckpointResponse)

    def should_preempt(
        self, request: trial_pb2.ShouldPreemptRequest
    ) -> trial_pb2.ShouldPreemptResponse:
        return self._call("ShouldPreempt", request, trial_pb2.ShouldPreemptResponse)

    def get_best_validation(
        self, request: trial_pb2.GetBestValidationRequest
    ) -> trial_pb2.GetBestValidationResponse:
        return self._call("GetBestValidation", request, trial_pb2.GetBestValidationResponse)

    def report_progress(
        self, request: trial_pb2.ReportProgressRequest
    ) -> trial_pb2.ReportProgressResponse:
        return self._call("ReportProgress", request, trial_pb2.ReportProgressResponse)

    def delete_checkpoints(
        self, request: trial_pb2.DeleteTrialCheckpointsRequest
    ) -> trial_pb2.DeleteTrialCheckpointsResponse:
        return self._call(
            "DeleteTrialCheckpoints", request, trial_pb2.DeleteTrialCheckpointsResponse
        )

    # --- retries ------------------------------------------------------------------------

    def _call(self, method: str, request: Message, response_type: type[R]) -> R:
        rpc: Any = getattr(self._stub, method)
        backoff = INITIAL_BACKOFF_S
        outage_start: float | None = None
        while True:
            try:
                response = rpc(request, timeout=self.call_timeout_s, metadata=self._metadata)
            except grpc.RpcError as e:
                code, details = _status(e)
                if code not in RETRYABLE:
                    raise TrialAPIError(
                        f"the master refused {method} ({code.name}): "
                        f"{_one_line(details) or 'no details'}",
                        code,
                    ) from None
                now = self._clock()
                if outage_start is None:
                    outage_start = now
                    log.warning(
                        "master unreachable at %s (%s on %s: %s); retrying for up to %gs",
                        self.target,
                        code.name,
                        method,
                        _one_line(details),
                        self.retry_s,
                    )
                waited = now - outage_start
                if waited + backoff > self.retry_s:
                    raise MasterUnreachableError(
                        f"the master at {self.target} was unreachable for {waited:.0f}s "
                        f"({code.name} on {method}: {_one_line(details)}); giving up "
                        f"(retry budget {self.retry_s:g}s, set {RETRY_ENV})",
                        code,
                    ) from None
                self._sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                continue
            if outage_start is not None:
                log.warning(
                    "master at %s reachable again after %.1fs",
                    self.target,
                    self._clock() - outage_start,
                )
            if not isinstance(response, response_type):
                raise TrialAPIError(
                    f"the master answered {method} with {type(response).__name__}, "
                    f"expected {response_type.__name__}"
                )
            return response


def _status(error: grpc.RpcError) -> tuple[grpc.StatusCode, str]:
    code_fn = getattr(error, "code", None)
    details_fn = getattr(error, "details", None)
    code = code_fn() if callable(code_fn) else None
    details = details_fn() if callable(details_fn) else None
    return code or grpc.StatusCode.UNKNOWN, str(details or "")
