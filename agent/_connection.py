"""The agent's one bidirectional stream to the master, kept open across master restarts.

Each attempt opens a fresh channel, sends `Register`, waits for `Registered`, then sends
a `Heartbeat` every interval the master asked for, interleaved with whatever the agent
queued (state changes, logs). When the master cannot be reached or the stream breaks,
the loop waits (0.5 s doubling to 10 s, with jitter) and tries again; queued messages
wait in the outbox meanwhile. A message already handed to a stream that then breaks may
be lost: `Register.running_allocations` lets the master reconcile after a reconnect.
A master that refuses the agent for good (a version it is not compatible with) ends the
loop instead: retrying could not succeed, and the reason is kept in `refused`.
"""

from __future__ import annotations

import collections
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator

import grpc

from assay.common.tls import ClientTls
from assay.proto import agent_pb2, agent_pb2_grpc

log = logging.getLogger("assay.agent")

DEFAULT_HEARTBEAT_INTERVAL = 5.0
MAX_LOG_BATCHES = 2000
# How the master words a refusal that retrying cannot change (FAILED_PRECONDITION also
# says "already connected", which a retry outlives).
_INCOMPATIBLE = "is not compatible with master version"
_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 256 << 20),  # StartAllocation carries the model
    ("grpc.max_send_message_length", 64 << 20),
]


class Backoff:
    """Reconnection delays: `initial` doubling up to `maximum`, each shortened by jitter."""

    def __init__(
        self,
        initial: float = 0.5,
        maximum: float = 10.0,
        jitter: float = 0.2,
        rng: Callable[[], float] = random.random,
    ) -> None:
        if not 0 < initial <= maximum:
            raise ValueError(f"need 0 < initial <= maximum, got {initial} and {maximum}")
        if not 0 <= jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), got {jitter}")
        self.initial, self.maximum, self.jitter = initial, maximum, jitter
        self._rng = rng
        self._attempt = 0

    def next(self) -> float:
        base = min(self.maximum, self.initial * 2.0**self._attempt)
        self._attempt += 1
        return base * (1 - self.jitter * self._rng())

    def reset(self) -> None:
        self._attempt = 0


class Outbox:
    """Messages waiting for the stream. Log batches are dropped oldest-first past
    `max_log_batches` (a long disconnection); other messages are never dropped."""

    def __init__(self, max_log_batches: int = MAX_LOG_BATCHES) -> None:
        self._items: collections.deque[agent_pb2.AgentMessage] = collections.deque()
        self._cond = threading.Condition()
        self._max_logs = max_log_batches
        self._logs = 0
        self.dropped_log_batches = 0

    def put(self, message: agent_pb2.AgentMessage) -> None:
        with self._cond:
            if message.HasField("logs"):
                self._logs += 1
                if self._logs > self._max_logs:
                    self._drop_oldest_logs()
            self._items.append(message)
            self._cond.notify()

    def _drop_oldest_logs(self) -> None:
        for i, item in enumerate(self._items):
            if item.HasField("logs"):
                del self._items[i]
                self._logs -= 1
                self.dropped_log_batches += 1
                if self.dropped_log_batches % 100 == 1:
                    log.warning(
                        "master unreachable: dropped %d log batches", self.dropped_log_batches
                    )
                return

    def unreported_exits(self) -> set[str]:
        """Allocations whose exit is still queued: the master has not heard it yet."""
        with self._cond:
            return {
                m.allocation_state.allocation_id
                for m in self._items
                if m.HasField("allocation_state")
                and m.allocation_state.state == agent_pb2.ALLOCATION_STATE_EXITED
            }

    def get(self, timeout: float) -> agent_pb2.AgentMessage | None:
        with self._cond:
            if not self._items:
                self._cond.wait(timeout)
            if not self._items:
                return None
            item = self._items.popleft()
            if item.HasField("logs"):
                self._logs -= 1
            return item

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)


class _Session:
    """One attempt: one channel, one `Connect` call."""

    def __init__(self) -> None:
        self.registered = threading.Event()
        self.closed = threading.Event()
        self.draining = threading.Event()
        self.drained = threading.Event()
        self.timed_out = False
        self.interval = DEFAULT_HEARTBEAT_INTERVAL
        self.call: grpc.Future | None = None


class MasterConnection:
    """Runs the connect / register / heartbeat / reconnect loop in `run()`."""

    def __init__(
        self,
        target: str,
        *,
        register: Callable[[], agent_pb2.Register],
        heartbeat: Callable[[], agent_pb2.Heartbeat],
        on_message: Callable[[agent_pb2.MasterMessage], None],
        timeout: float = 30.0,
        backoff: Backoff | None = None,
        on_refused: Callable[[str], None] | None = None,
        join_token: str | None = None,
        tls: ClientTls | None = None,
    ) -> None:
        self.target = target
        self.join_token = join_token
        # Read the CA file once: a reconnect must not depend on it staying readable.
        self.tls = tls or ClientTls()
        self._credentials = self.tls.credentials() if self.tls.enabled else None
        self._on_refused = on_refused
        self.refused: str | None = None
        self._register = register
        self._heartbeat = heartbeat
        self._on_message = on_message
        self.timeout = timeout
        self.backoff = backoff or Backoff()
        self.outbox = Outbox()
        self.connected = threading.Event()
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._session: _Session | None = None

    def send(self, message: agent_pb2.AgentMessage) -> None:
        """Queue a message; it goes out on this stream or the next."""
        self.outbox.put(message)

    def run(self) -> None:
        """Connect and reconnect until `close()` or a refusal for good."""
        while not self._stopping.is_set():
            reason = self._attempt()
            if self._stopping.is_set():
                break
            if self.refused is not None:
                log.error("the master at %s refused this agent: %s", self.target, reason)
                if self._on_refused is not None:
                    self._on_refused(reason)
                break
            delay = self.backoff.next()
            log.warning(
                "cannot reach master at %s (%s); retrying in %.1fs", self.target, reason, delay
            )
            self._stopping.wait(delay)

    def close(self, flush_timeout: float = 5.0) -> None:
        """Send what is queued (up to `flush_timeout` seconds), then end the stream."""
        self._stopping.set()
        with self._lock:
            session = self._session
        if session is None:
            return
        session.draining.set()
        if session.registered.is_set() and session.drained.wait(flush_timeout):
            session.closed.wait(1.0)  # let the master end its side; cancel if it does not
        if session.call is not None:
            session.call.cancel()

    def _attempt(self) -> str:
        """One connection, until it breaks; returns why it ended."""
        session = _Session()
        with self._lock:
            self._session = session
        channel = self.tls.channel(self.target, _CHANNEL_OPTIONS, self._credentials)
        timer = threading.Timer(self.timeout, self._give_up, args=(session,))
        try:
            stub = agent_pb2_grpc.AgentServiceStub(channel)
            metadata = (("x-assay-join-token", self.join_token),) if self.join_token else ()
            responses = stub.Connect(self._requests(session), metadata=metadata)
            session.call = responses
            timer.start()
            for message in responses:
                self._receive(session, message)
            return "the master ended the stream"
        except grpc.RpcError as e:
            if session.timed_out:
                return f"no Registered reply within {self.timeout:g}s"
            details = e.details() or ""
            if e.code() == grpc.StatusCode.FAILED_PRECONDITION and _INCOMPATIBLE in details:
                self.refused = details
                return details
            if e.code() == grpc.StatusCode.UNAUTHENTICATED:
                # A wrong join token stays wrong: retrying would only knock on the door.
                self.refused = f"the master refused this agent: {details}"
                return self.refused
            return f"{e.code().name}: {details}"
        finally:
            timer.cancel()
            session.closed.set()
            self.connected.clear()
            channel.close()

    def _give_up(self, session: _Session) -> None:
        if not session.registered.is_set() and session.call is not None:
            session.timed_out = True
            session.call.cancel()

    def _receive(self, session: _Session, message: agent_pb2.MasterMessage) -> None:
        if message.HasField("registered"):
            interval_ms = message.registered.heartbeat_interval_ms
            session.interval = interval_ms / 1000 if interval_ms > 0 else DEFAULT_HEARTBEAT_INTERVAL
            session.registered.set()
            self.connected.set()
            self.backoff.reset()
            log.info(
                "registered with master at %s (cluster %r, heartbeat every %gs)",
                self.target,
                message.registered.cluster_id,
                session.interval,
            )
            return
        if not session.registered.is_set():
            log.warning("ignoring a master message that came before Registered")
            return
        try:
            self._on_message(message)
        except Exception:
            log.exception("cannot handle a message from the master")

    def _requests(self, session: _Session) -> Iterator[agent_pb2.AgentMessage]:
        yield agent_pb2.AgentMessage(register=self._register())
        while not session.registered.wait(0.05):
            if session.closed.is_set():
                return
        next_beat = 0.0
        while not session.closed.is_set():
            now = time.monotonic()
            if now >= next_beat:
                next_beat = now + session.interval
                beat = self._safe_heartbeat()
                if beat is not None:
                    yield agent_pb2.AgentMessage(heartbeat=beat)
                continue
            message = self.outbox.get(timeout=min(next_beat - now, 0.1))
            if message is not None:
                yield message
            elif session.draining.is_set():
                session.drained.set()
                return

    def _safe_heartbeat(self) -> agent_pb2.Heartbeat | None:
        try:
            return self._heartbeat()
        except Exception:
            log.exception("cannot sample the devices for a heartbeat")
            return None


__all__ = ["Backoff", "MasterConnection", "Outbox"]
