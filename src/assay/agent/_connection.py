"""The agent's one bidirectional stream to the master, kept open across master restarts.

Each attempt opens a fresh channel, sends `Register`, waits for `Registered`, then sends
a `Heartbeat` every interval the master asked for, interleaved with whatever the agent
queued (state changes, logs). When the master cannot be reached or the stream breaks,
the loop waits (0.5 s doubling to 10 s, with jitter) and tries again; queued messages
wait in the outbox meanwhile. A message already handed to a stream that then breaks may
be lost: `Register.running_allocations` lets the master reconcile after a reconnect.
A master that refuses the agent for good (a version it is not compatible with, a wrong
join token, a name held by another agent's credential) ends the loop instead: retrying
could not succeed, and the reason is kept in `refused`.

Each attempt presents the join token and the agent's own credential, whichever it has;
a credential the master issues in `Registered` (at the first join) is kept at once.
"""

from __future__ import annotations

import collections
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from assay.agent._credential import CredentialFile
from assay.common.tls import ClientTls
from assay.proto import agent_pb2, agent_pb2_grpc, common_pb2

log = logging.getLogger("assay.agent")

DEFAULT_HEARTBEAT_INTERVAL = 5.0
# How long `close()` waits for the queued messages to go out on a stream that is up.
FLUSH_TIMEOUT = 5.0
MAX_LOG_BATCHES = 2000
# At most one warning about dropped log lines in this many seconds (the logs say where).
_WARN_EVERY_S = 10.0
# How the master words a refusal that retrying cannot change (FAILED_PRECONDITION also
# says "already connected", which a retry outlives).
_INCOMPATIBLE = "is not compatible with master version"
_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 256 << 20),  # StartAllocation carries the model
    ("grpc.max_send_message_length", 64 << 20),
]


class Backoff:
    """Reconnection delays: `initial` for the first `steady` attempts, then doubling up
    to `maximum`; each shortened by jitter.

    The steady start is for a master that is starting or restarting: agents started
    beside it (`deploy local`, Compose, a host's boot) or waiting out its restart reach
    it within `initial` of it listening, instead of sleeping through a doubled delay
    that began while it was still loading. A master that stays away is retried every
    `maximum` seconds.
    """

    def __init__(
        self,
        initial: float = 0.5,
        maximum: float = 10.0,
        jitter: float = 0.2,
        rng: Callable[[], float] = random.random,
        steady: int = 8,
    ) -> None:
        if not 0 < initial <= maximum:
            raise ValueError(f"need 0 < initial <= maximum, got {initial} and {maximum}")
        if not 0 <= jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), got {jitter}")
        if steady < 1:
            raise ValueError(f"steady must be 1 or more (1: doubling at once), got {steady}")
        self.initial, self.maximum, self.jitter, self.steady = initial, maximum, jitter, steady
        self._rng = rng
        self._attempt = 0

    def next(self) -> float:
        doublings = max(0, self._attempt - self.steady + 1)
        base = min(self.maximum, self.initial * 2.0**doublings)
        self._attempt += 1
        return base * (1 - self.jitter * self._rng())

    def reset(self) -> None:
        self._attempt = 0


class Outbox:
    """Messages waiting for the stream: state changes in order, each allocation's log
    batches in a queue of its own, taken in turns.

    Past `max_log_batches` queued in all, the oldest batch of the longest queue is
    dropped: a trial that prints faster than the master stores (or while the master is
    unreachable) loses its own lines, not a quieter trial's. Where lines were dropped,
    the allocation's next batch starts with one line of stream `assay` that says how
    many and why. An allocation's state change goes out after the log batches it queued
    before it, so the master has its last lines when it hears that it exited. State
    changes are never dropped.
    """

    def __init__(
        self,
        max_log_batches: int = MAX_LOG_BATCHES,
        connected: Callable[[], bool] = lambda: True,
    ) -> None:
        self._cond = threading.Condition()
        self._max_logs = max_log_batches
        self._connected = connected
        self._seq = 0  # the order of `put`s, to keep each allocation's own order
        self._control: collections.deque[tuple[int, agent_pb2.AgentMessage]] = collections.deque()
        self._queues: dict[str, collections.deque[tuple[int, agent_pb2.AgentMessage]]] = {}
        self._gaps: dict[str, _Gap] = {}
        # Allocations with a batch or a gap to send, in the order of their next turn.
        self._turns: collections.deque[str] = collections.deque()
        self._logs = 0
        self._warned_at = -_WARN_EVERY_S
        self.dropped_log_batches = 0
        self.dropped_log_lines = 0

    def put(self, message: agent_pb2.AgentMessage) -> None:
        with self._cond:
            self._seq += 1
            if message.HasField("logs"):
                allocation = message.logs.allocation_id
                if allocation not in self._queues and allocation not in self._gaps:
                    self._turns.append(allocation)
                self._queues.setdefault(allocation, collections.deque()).append(
                    (self._seq, message)
                )
                self._logs += 1
                if self._logs > self._max_logs:
                    self._drop_from_longest()
            else:
                self._control.append((self._seq, message))
            self._cond.notify()

    def _drop_from_longest(self) -> None:
        allocation = max(self._queues, key=lambda a: len(self._queues[a]))
        queue = self._queues[allocation]
        _, dropped = queue.popleft()
        if not queue:
            del self._queues[allocation]  # its turn stays: the gap's line is still to go
        self._logs -= 1
        lines = dropped.logs.lines
        gap = self._gaps.setdefault(
            allocation,
            _Gap(
                trial_id=lines[0].trial_id if lines else 0,
                run_id=lines[0].run_id if lines else 0,
                reason=(
                    "the trial printed faster than the master stored its log"
                    if self._connected()
                    else "the master was unreachable"
                ),
            ),
        )
        gap.lines += len(lines)
        self.dropped_log_batches += 1
        self.dropped_log_lines += len(lines)
        now = time.monotonic()
        if now - self._warned_at >= _WARN_EVERY_S:
            self._warned_at = now
            log.warning(
                "dropped %d log lines of allocation %s (%d in all since the agent started): "
                "%s; the trial's log says where",
                gap.lines,
                allocation,
                self.dropped_log_lines,
                gap.reason,
            )

    def unreported_exits(self) -> set[str]:
        """Allocations whose exit is still queued: the master has not heard it yet."""
        with self._cond:
            return {
                m.allocation_state.allocation_id
                for _, m in self._control
                if m.HasField("allocation_state")
                and m.allocation_state.state == agent_pb2.ALLOCATION_STATE_EXITED
            }

    def get(self, timeout: float) -> agent_pb2.AgentMessage | None:
        with self._cond:
            if not self._control and not self._turns:
                self._cond.wait(timeout)
            if self._control:
                seq, message = self._control[0]
                allocation = message.allocation_state.allocation_id
                queue = self._queues.get(allocation)
                if allocation in self._gaps or (queue and queue[0][0] < seq):
                    return self._next_logs(allocation, before=seq)
                self._control.popleft()
                return message
            if self._turns:
                allocation = self._turns.popleft()
                batch = self._next_logs(allocation)
                if allocation in self._queues:
                    self._turns.append(allocation)  # its next batch waits for the others
                return batch
            return None

    def _next_logs(self, allocation: str, before: int | None = None) -> agent_pb2.AgentMessage:
        """The allocation's oldest batch (if queued `before` that put), after the line
        that marks a gap before it."""
        queue = self._queues.get(allocation)
        if queue and (before is None or queue[0][0] < before):
            _, message = queue.popleft()
            self._logs -= 1
            if not queue:
                del self._queues[allocation]
        else:
            message = agent_pb2.AgentMessage(logs=agent_pb2.LogBatch(allocation_id=allocation))
        if allocation not in self._queues and allocation in self._turns:
            self._turns.remove(allocation)
        gap = self._gaps.pop(allocation, None)
        if gap is None:
            return message
        lines = [gap.line(), *message.logs.lines]
        return agent_pb2.AgentMessage(
            logs=agent_pb2.LogBatch(allocation_id=allocation, lines=lines)
        )

    def __len__(self) -> int:
        with self._cond:
            return len(self._control) + self._logs


@dataclass
class _Gap:
    """Lines of one allocation dropped since it last sent a batch."""

    trial_id: int
    run_id: int
    reason: str
    lines: int = 0

    def line(self) -> common_pb2.LogLine:
        stamp = Timestamp()
        stamp.FromNanoseconds(time.time_ns())
        return common_pb2.LogLine(
            trial_id=self.trial_id,
            run_id=self.run_id,
            stream="assay",
            level="WARNING",
            timestamp=stamp,
            message=f"assay-agent: {self.lines} log lines were dropped here: {self.reason}",
        )


class _Session:
    """One attempt: one channel, one `Connect` call."""

    def __init__(self) -> None:
        self.registered = threading.Event()
        self.closed = threading.Event()
        self.draining = threading.Event()
        self.drained = threading.Event()
        # Set with `drained` or `closed`, whichever comes first: what `close()` waits on.
        self.settled = threading.Event()
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
        flush_timeout: float = FLUSH_TIMEOUT,
        backoff: Backoff | None = None,
        on_refused: Callable[[str], None] | None = None,
        join_token: str | None = None,
        tls: ClientTls | None = None,
        credential: CredentialFile | None = None,
    ) -> None:
        self.target = target
        self.join_token = join_token
        self.credential = credential
        # Read the CA file once: a reconnect must not depend on it staying readable.
        self.tls = tls or ClientTls()
        self._credentials = self.tls.credentials() if self.tls.enabled else None
        self._on_refused = on_refused
        self.refused: str | None = None
        self._register = register
        self._heartbeat = heartbeat
        self._on_message = on_message
        self.timeout = timeout
        self.flush_timeout = flush_timeout
        self.backoff = backoff or Backoff()
        self.connected = threading.Event()
        self.outbox = Outbox(connected=self.connected.is_set)
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

    def close(self) -> None:
        """Send what is queued (up to `flush_timeout` seconds), then end the stream.

        The wait is for a stream that is up: one that is broken (the master went away, or
        goes during the wait) cannot carry the messages, so `close()` returns as soon as
        it is, rather than at the timeout. What was queued is lost with the process, as
        on any exit: `Register.running_allocations` lets the restarted master reconcile.
        """
        self._stopping.set()
        with self._lock:
            session = self._session
        if session is None:
            return
        session.draining.set()
        if session.registered.is_set() and session.settled.wait(self.flush_timeout):
            if not session.drained.is_set() and len(self.outbox):
                log.warning(
                    "the stream to the master is broken: %d queued message(s) not sent",
                    len(self.outbox),
                )
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
            responses = stub.Connect(self._requests(session), metadata=self._metadata())
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
            if e.code() in (
                grpc.StatusCode.UNAUTHENTICATED,
                grpc.StatusCode.PERMISSION_DENIED,
                grpc.StatusCode.INVALID_ARGUMENT,
            ):
                # A wrong join token stays wrong, a name held by another agent's
                # credential stays held, and a registration the master cannot take (a
                # resource pool it does not declare) stays so: retrying would only
                # knock on the door.
                self.refused = f"the master refused this agent: {details}"
                return self.refused
            return f"{e.code().name}: {details}"
        finally:
            timer.cancel()
            session.closed.set()
            session.settled.set()
            self.connected.clear()
            channel.close()

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        metadata: list[tuple[str, str]] = []
        if self.join_token:
            metadata.append(("x-assay-join-token", self.join_token))
        credential = self.credential.value if self.credential is not None else ""
        if credential:
            metadata.append(("x-assay-agent-credential", credential))
        return tuple(metadata)

    def _give_up(self, session: _Session) -> None:
        if not session.registered.is_set() and session.call is not None:
            session.timed_out = True
            session.call.cancel()

    def _receive(self, session: _Session, message: agent_pb2.MasterMessage) -> None:
        if message.HasField("registered"):
            if message.registered.credential and self.credential is not None:
                self.credential.save(message.registered.credential)
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
                session.settled.set()
                return

    def _safe_heartbeat(self) -> agent_pb2.Heartbeat | None:
        try:
            return self._heartbeat()
        except Exception:
            log.exception("cannot sample the devices for a heartbeat")
            return None


__all__ = ["Backoff", "MasterConnection", "Outbox"]
