"""The agents' gRPC service: one bidirectional stream per agent, served on the event loop.

An agent registers (its credential or the join token checked, see `Fleet`), then sends
heartbeats, allocation states and log batches; the master's messages to it (starts,
kills) come from its `LoopOutbox`, sent once the change they belong to is committed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from concurrent import futures
from functools import partial

import grpc

from assay import __version__
from assay.errors import AssayError
from assay.master import wire
from assay.master._aio import LoopOutbox
from assay.master._core import Master
from assay.master.api._status import status_of
from assay.master.auth import AgentPass, agent_pass
from assay.master.fleet import AgentHandle
from assay.proto import agent_pb2, agent_pb2_grpc

log = logging.getLogger("assay.master")


class AgentServicer(agent_pb2_grpc.AgentServiceServicer):
    """Agents' streams, all on the event loop: no thread per agent.

    Heartbeats and allocation states are handled on the loop (they only take the
    master's lock briefly); registration waits for a commit and log batches write to
    the store, so those two run on `pool`. Messages to the agent arrive in a
    `LoopOutbox` from whichever thread committed them.
    """

    def __init__(self, master: Master, pool: futures.Executor) -> None:
        self.master = master
        self.pool = pool

    async def Connect(  # noqa: N802
        self,
        request_iterator: AsyncIterator[agent_pb2.AgentMessage],
        context: grpc.aio.ServicerContext[agent_pb2.AgentMessage, agent_pb2.MasterMessage],
    ) -> AsyncIterator[agent_pb2.MasterMessage]:
        loop = asyncio.get_running_loop()
        messages = aiter(request_iterator)
        try:
            first = await anext(messages)
        except StopAsyncIteration:
            return
        if first.WhichOneof("message") != "register":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "an agent must register first")
        # Agents run the master's release line (major.minor); a patch apart is allowed. An
        # agent that reports no version (a hand-written client) is taken at its word.
        version = first.register.version
        if version and version != __version__:
            if version.split(".")[:2] != __version__.split(".")[:2]:
                await context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"agent version {version} is not compatible with master version "
                    f"{__version__}: install assay=={__version__} on this agent",
                )
            log.warning(
                "agent %s runs assay %s, the master %s: install assay==%s on it",
                first.register.agent_id,
                version,
                __version__,
                __version__,
            )
        outbox = LoopOutbox(loop)
        peer = _peer_host(context.peer())
        registration = wire.registration(first.register, peer)
        # Checked against the name under the master's lock (Fleet.check_credential).
        presented = agent_pass() or AgentPass(joined=False, credential="")
        registering = loop.run_in_executor(
            self.pool,
            partial(
                self.master.register_agent,
                registration,
                peer,
                outbox,
                credential=presented.credential,
                joined=presented.joined,
            ),
        )
        try:
            handle = await asyncio.shield(registering)
        except AssayError as e:
            await context.abort(status_of(e), str(e))
        except asyncio.CancelledError:
            # The agent hung up while its registration committed: once that is done,
            # it is disconnected, not left registered with nobody reading its messages.
            def hung_up(done: asyncio.Future[AgentHandle]) -> None:
                if not done.cancelled() and done.exception() is None:
                    self.master.agent_hung_up(done.result())

            registering.add_done_callback(hung_up)
            raise
        reader = asyncio.create_task(self._read(handle, messages))
        try:
            interval = int(self.master.config.heartbeat_interval_s * 1000)
            issued, handle.credential = handle.credential, ""  # told once, then forgotten
            yield agent_pb2.MasterMessage(
                registered=agent_pb2.Registered(
                    cluster_id=self.master.cluster_id,
                    heartbeat_interval_ms=interval,
                    credential=issued,
                )
            )
            while True:
                message = await outbox.get()
                if message is None:
                    return
                yield wire.master_message(message)
        finally:
            reader.cancel()
            self.master.rank_usage.forget(handle.id)
            self.master.agent_disconnected(handle.id, handle)

    async def _read(
        self, handle: AgentHandle, messages: AsyncIterator[agent_pb2.AgentMessage]
    ) -> None:
        agent_id = handle.id
        loop = asyncio.get_running_loop()
        try:
            async for message in messages:
                kind = message.WhichOneof("message")
                try:
                    if kind != "heartbeat":
                        # Alive, whatever waits behind a flood of logs (its heartbeats).
                        self.master.heard_from(agent_id)
                    if kind == "heartbeat":
                        self.master.heartbeat(agent_id, wire.load(message.heartbeat))
                        self.master.rank_usage.heard(agent_id, message.heartbeat.ranks)
                    elif kind == "allocation_state":
                        self._allocation_state(agent_id, message.allocation_state)
                    elif kind == "logs":
                        # In order: the next message waits for this batch to be stored.
                        allocation_id, lines = (
                            message.logs.allocation_id,
                            wire.log_lines(message.logs),
                        )
                        await loop.run_in_executor(
                            self.pool, self.master.ship_logs, agent_id, allocation_id, lines
                        )
                except Exception:
                    log.exception("agent %s: handling %s failed", agent_id, kind)
        except (grpc.RpcError, asyncio.CancelledError):
            pass
        finally:
            # The agent hung up (or the stream broke): the writer's loop ends too.
            self.master.agent_disconnected(agent_id, handle)

    def _allocation_state(self, agent_id: str, change: agent_pb2.AllocationStateChange) -> None:
        if change.state == agent_pb2.ALLOCATION_STATE_RUNNING:
            self.master.allocation_running(agent_id, change.allocation_id)
        elif change.state == agent_pb2.ALLOCATION_STATE_EXITED:
            self.master.allocation_exited(
                agent_id, change.allocation_id, change.exit_codes, change.message, change.failure
            )


def _peer_host(peer: str) -> str:
    # "ipv4:127.0.0.1:5432" | "ipv6:[::1]:5432"
    kind, _, rest = peer.partition(":")
    if kind == "ipv6":
        return rest.rsplit(":", 1)[0].strip("[]")
    return rest.rsplit(":", 1)[0] if rest else ""


__all__ = ["AgentServicer"]
