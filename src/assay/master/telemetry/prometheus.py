"""The master's Prometheus metrics, served at /metrics on the HTTP port (`metrics`).

Imported only when the `metrics` setting is not `off`: a master without metrics loads
no Prometheus code. Two kinds of series:

- Counted as the master works (`PrometheusTelemetry`, called from the hot paths through
  `_telemetry.Telemetry`): scheduling rounds, group commits, RPCs, allocations started
  and ended, metric rows stored. Each is one `inc` or `observe`.
- Read at scrape time from the master's snapshot (`Master.cluster_view`, as
  GetMasterInfo and ListAgents read it) by `ClusterCollector`: slots, queue, agents and
  the agents' latest heartbeat samples. Nothing is maintained between scrapes.

Labels name pools, slot types, agents, devices, RPC methods and outcomes: never a user,
an experiment or a trial, so one tenant's scrape shows nothing of another's work, and the
number of series does not grow with the number of allocations.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

from assay.master.fleet import AgentView, ClusterView, QueuedView
from assay.master.lifecycle.run import Outcome
from assay.master.telemetry._telemetry import Telemetry
from assay.proto import agent_pb2, api_pb2, trial_pb2

# The text format every Prometheus since 2.0 reads (what generate_latest writes).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DEFAULT_POOL = "default"
# Seconds; a round over a few thousand queued trials takes milliseconds.
_ROUND_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
_COMMIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)
_RPC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)


def pool_of(item: AgentView | QueuedView) -> str:
    """The resource pool an agent or a queued trial belongs to, as the cluster view
    names it ("" or absent: the one default pool)."""
    return str(getattr(item, "pool", "") or DEFAULT_POOL)


def pools_of(view: ClusterView) -> list[str]:
    """The pools declared, each with a series even while it has no agent."""
    return [str(p.name) for p in getattr(view, "pools", ())] or [DEFAULT_POOL]


def rpc_names() -> dict[str, str]:
    """`/assay.v1.Api/Login` -> `Api.Login` for every method of the master's services:
    the RPC histogram's label values (a method no service has gets no series)."""
    names = {}
    for module, service in (
        (api_pb2, "Api"),
        (agent_pb2, "AgentService"),
        (trial_pb2, "TrialService"),
    ):
        descriptor = module.DESCRIPTOR.services_by_name[service]
        for method in descriptor.methods:
            names[f"/{descriptor.full_name}/{method.name}"] = f"{service}.{method.name}"
    return names


class PrometheusTelemetry(Telemetry):
    """The master's instruments, in a registry of its own (several masters may share a
    process, as they do in tests)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self._rounds = Histogram(
            "assay_scheduling_round_seconds",
            "Time the scheduler took to place the queue, per round.",
            buckets=_ROUND_BUCKETS,
            registry=r,
        )
        self._commits = Histogram(
            "assay_store_commit_seconds",
            "Time one group commit took to write its batch to the store.",
            buckets=_COMMIT_BUCKETS,
            registry=r,
        )
        self.rpcs = Histogram(
            "assay_rpc_duration_seconds",
            "Time the master took to answer a unary gRPC call, by method (the HTTP API "
            "calls the servicer directly and is not counted here).",
            ["method"],
            buckets=_RPC_BUCKETS,
            registry=r,
        )
        self._started = Counter(
            "assay_allocations_started", "Allocations (runs of trials) started.", registry=r
        )
        self._ended = Counter(
            "assay_allocations_ended",
            "Allocations ended, by what their end made of the trial.",
            ["outcome"],
            registry=r,
        )
        for outcome in Outcome:  # every outcome has a series (rate() needs one at 0)
            self._ended.labels(outcome.name.lower())
        self._rows = Counter(
            "assay_metric_rows_ingested",
            "Metric rows trials reported and the store kept.",
            registry=r,
        )

    def watch(self, view: Callable[[], ClusterView]) -> None:
        """Read the cluster's gauges from `view()` at every scrape."""
        self.registry.register(ClusterCollector(view))

    content_type = CONTENT_TYPE

    def render(self) -> bytes:
        """The scrape's body (reads the cluster view: call off the event loop)."""
        return generate_latest(self.registry)

    def interceptor(self) -> RpcTimer:
        return RpcTimer(self.rpcs)

    # --- the hot paths --------------------------------------------------------------------

    def scheduled(self, seconds: float) -> None:
        self._rounds.observe(seconds)

    def committed(self, seconds: float) -> None:
        self._commits.observe(seconds)

    def allocation_started(self) -> None:
        self._started.inc()

    def allocation_ended(self, outcome: str) -> None:
        self._ended.labels(outcome).inc()

    def metric_rows(self, count: int) -> None:
        if count:
            self._rows.inc(count)


class RpcTimer(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Times every unary-answer call the guard lets through, by method. Calls that stream
    their answers (agents' connections, followed logs) last as long as their client wants
    and are not timed; neither are refused calls or methods no service declares."""

    def __init__(self, histogram: Histogram) -> None:
        self._by_method = {path: histogram.labels(name) for path, name in rpc_names().items()}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        child = self._by_method.get(str(handler_call_details.method))
        if child is None or handler is None or handler.response_streaming:
            return handler
        streaming_in = handler.request_streaming
        behavior = handler.stream_unary if streaming_in else handler.unary_unary
        if not inspect.iscoroutinefunction(behavior):
            return handler

        async def timed(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            started = time.perf_counter()
            try:
                return await behavior(request, context)
            finally:
                child.observe(time.perf_counter() - started)

        make = (
            grpc.stream_unary_rpc_method_handler
            if streaming_in
            else grpc.unary_unary_rpc_method_handler
        )
        return make(
            timed,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


class ClusterCollector:
    """The cluster's gauges, computed from one snapshot per scrape."""

    def __init__(self, view: Callable[[], ClusterView]) -> None:
        self._view = view

    def collect(self) -> Iterator[Metric]:
        view = self._view()
        yield from _slot_gauges(view)
        yield from _agent_gauges(view.agents)


def _slot_gauges(view: ClusterView) -> Iterator[Metric]:
    pool_type = ["pool", "slot_type"]
    total = GaugeMetricFamily("assay_slots", "Slots of connected agents.", labels=pool_type)
    used = GaugeMetricFamily("assay_slots_used", "Slots a trial holds.", labels=pool_type)
    free = GaugeMetricFamily(
        "assay_slots_free", "Slots no trial holds (disabled agents' included).", labels=pool_type
    )
    disabled = GaugeMetricFamily(
        "assay_slots_disabled", "Slots of disabled agents.", labels=pool_type
    )
    declared = pools_of(view)
    counts = {(pool, str(view.slot_type)): [0, 0, 0] for pool in declared}
    for agent in view.connected:
        count = counts.setdefault((pool_of(agent), str(agent.slot_type)), [0, 0, 0])
        count[0] += len(agent.slots)
        count[1] += sum(1 for s in agent.slots if s.trial_id)
        count[2] += 0 if agent.enabled else len(agent.slots)
    for (pool, kind), (all_slots, held, off) in sorted(counts.items()):
        total.add_metric([pool, kind], all_slots)
        used.add_metric([pool, kind], held)
        free.add_metric([pool, kind], all_slots - held)
        disabled.add_metric([pool, kind], off)
    yield from (total, used, free, disabled)
    queued = GaugeMetricFamily("assay_queued_trials", "Trials waiting for slots.", labels=["pool"])
    waiting = dict.fromkeys(declared, 0)
    for item in view.queue:
        waiting[pool_of(item)] = waiting.get(pool_of(item), 0) + 1
    for pool, trials in sorted(waiting.items()):
        queued.add_metric([pool], trials)
    yield queued
    agents = GaugeMetricFamily(
        "assay_agents_connected", "Agents connected to the master.", labels=["pool"]
    )
    connected = dict.fromkeys(declared, 0)
    for agent in view.connected:
        connected[pool_of(agent)] = connected.get(pool_of(agent), 0) + 1
    for pool, number in sorted(connected.items()):
        agents.add_metric([pool], number)
    yield agents


def _agent_gauges(agents: tuple[AgentView, ...]) -> Iterator[Metric]:
    """Each connected agent's latest heartbeat samples."""
    cpu = GaugeMetricFamily(
        "assay_agent_cpu_utilization", "The agent machine's CPU use (0-1).", labels=["agent"]
    )
    memory = GaugeMetricFamily(
        "assay_agent_memory_used_fraction",
        "The agent machine's memory in use (0-1).",
        labels=["agent"],
    )
    memory_total = GaugeMetricFamily(
        "assay_agent_memory_bytes", "The agent machine's memory.", labels=["agent"]
    )
    heard = GaugeMetricFamily(
        "assay_agent_last_heartbeat_timestamp_seconds",
        "When the agent was last heard from (seconds since the epoch).",
        labels=["agent"],
    )
    device_labels = ["agent", "device", "slot_type"]
    device_use = GaugeMetricFamily(
        "assay_device_utilization",
        "A slot's device use (0-1): the GPU's, or the machine's CPU use for a CPU slot.",
        labels=device_labels,
    )
    device_memory = GaugeMetricFamily(
        "assay_device_memory_bytes", "A slot's device memory.", labels=device_labels
    )
    for agent in agents:
        if not agent.connected:
            continue
        cpu.add_metric([agent.id], agent.cpu_utilization)
        memory.add_metric([agent.id], agent.memory_used_fraction)
        memory_total.add_metric([agent.id], agent.memory_bytes)
        heard.add_metric([agent.id], agent.last_heartbeat)
        for device in agent.devices:
            labels = [agent.id, str(device.index), agent.slot_type]
            device_use.add_metric(labels, device.utilization)
            device_memory.add_metric(labels, device.memory_bytes)
    yield from (cpu, memory, memory_total, heard, device_use, device_memory)


__all__ = [
    "CONTENT_TYPE",
    "ClusterCollector",
    "PrometheusTelemetry",
    "RpcTimer",
    "pool_of",
    "rpc_names",
]
