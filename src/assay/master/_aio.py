"""The master's gRPC server on asyncio, with its blocking handlers on a thread pool.

Every agent keeps one stream open. A thread-per-stream server spends most of its time
handing messages between threads (two per agent), so the agents' streams are served
on one event loop instead (see `AgentServicer` in `assay.master.api`). The API and trial
handlers block on the store and the master's lock; they stay plain functions, written
against the synchronous `grpc.ServicerContext`, and run on a thread pool behind
`SyncAdapter`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import threading
import weakref
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc

from assay.master.lifecycle import AgentMessage


class _Aborted(BaseException):
    """Raised by `SyncContext.abort`; turned into the status on the event loop."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, details)
        self.code = code
        self.details = details


class SyncContext:
    """What a synchronous handler needs of its context, safe to use off the loop."""

    def __init__(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        self._peer: str = str(context.peer())
        self._metadata = tuple(context.invocation_metadata() or ())
        self._active = True
        context.add_done_callback(self._done)

    def _done(self, _context: object) -> None:
        self._active = False

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise _Aborted(code, details)

    def peer(self) -> str:
        return self._peer

    def invocation_metadata(self) -> tuple[Any, ...]:
        return self._metadata

    def is_active(self) -> bool:
        return self._active


class SyncAdapter:
    """Serves a synchronous servicer's methods on `pool`, as coroutines for grpc.aio.

    Plain (unary) methods run whole on the pool. Methods that are coroutines or async
    generators already are served as they are: a streaming method must be one, so that
    a long stream (a log follower) holds no thread while it waits.
    """

    def __init__(self, servicer: object, pool: futures.Executor) -> None:
        self._servicer = servicer
        self._pool = pool

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method: Callable[..., Any] = getattr(self._servicer, name)
        if inspect.iscoroutinefunction(method) or inspect.isasyncgenfunction(method):
            return method  # written for the loop already
        return self._unary(method)

    def _unary(self, method: Callable[..., Any]) -> Callable[..., Any]:
        pool = self._pool

        async def handler(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            shim = SyncContext(context)
            loop = asyncio.get_running_loop()
            # In a copy of the call's context: what the guard recorded (the caller) goes along.
            call = contextvars.copy_context().run
            try:
                return await loop.run_in_executor(pool, call, method, request, shim)
            except _Aborted as a:
                await context.abort(a.code, a.details)

        return handler


class GenericOnly:
    """What the generated `add_*Servicer_to_server` functions need of a server, passing
    on their generic handlers and leaving out their registered-method copies.

    For every call it takes, grpc.aio's accept loop waits on one pending future per
    registered method (`asyncio.wait` over all of them: some 80 for these services,
    each given a callback and then relieved of it), and on one in all when the methods
    are only known through generic handlers, which find a method by name in a dict.
    """

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, handlers: tuple[grpc.GenericRpcHandler, ...]) -> None:
        self._server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        """Left out: the generic handler added with them serves the same methods."""


class LoopMail:
    """Calls posted to an event loop from other threads, in order. One wake-up of the
    loop runs every call posted since the last: a commit that sends a thousand agents
    their messages wakes the loop once, not a thousand times."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._calls: list[tuple[Callable[[Any], object], Any]] = []

    def post(self, call: Callable[[Any], object], arg: Any) -> None:
        with self._lock:
            self._calls.append((call, arg))
            if len(self._calls) > 1:
                return  # the wake-up for the first is on its way
        held: set[LoopMail] | None = getattr(_HELD, "mail", None)
        if held is not None:
            held.add(self)  # woken when this thread's `one_wakeup` block ends
        else:
            self._wake()

    def _wake(self) -> None:
        try:
            self._loop.call_soon_threadsafe(self._deliver)
        except RuntimeError:  # the loop is closed: the server has stopped, nobody reads
            with self._lock:
                self._calls.clear()

    def _deliver(self) -> None:
        with self._lock:
            calls, self._calls = self._calls, []
        for call, arg in calls:
            call(arg)


_MAIL: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopMail] = weakref.WeakKeyDictionary()
_MAIL_LOCK = threading.Lock()


_HELD = threading.local()


@contextlib.contextmanager
def one_wakeup() -> Iterator[None]:
    """Posts this thread makes inside the block wake each loop once, when it ends (a
    wake-up is a system call, and each lets the loop's thread take the GIL for a
    moment: the group commit posts all a commit's messages and answers in one)."""
    held: set[LoopMail] = set()
    _HELD.mail = held
    try:
        yield
    finally:
        _HELD.mail = None
        for mail in held:
            mail._wake()


def loop_mail(loop: asyncio.AbstractEventLoop) -> LoopMail:
    """The one `LoopMail` of `loop`."""
    with _MAIL_LOCK:
        mail = _MAIL.get(loop)
        if mail is None:
            mail = _MAIL[loop] = LoopMail(loop)
        return mail


class LoopOutbox:
    """An agent's outgoing messages: put from any thread, read on the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._mail = loop_mail(loop)
        self._queue: asyncio.Queue[AgentMessage | None] = asyncio.Queue()

    def put(self, message: AgentMessage | None) -> None:
        self._mail.post(self._queue.put_nowait, message)

    async def get(self) -> AgentMessage | None:
        return await self._queue.get()


class LoopThread:
    """An event loop running in its own thread, for a server that other threads drive."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def call(self, fn: Callable[[], Any], timeout: float | None = None) -> Any:
        """Run `fn` on the loop (a coroutine function is awaited) and return its result."""

        async def run() -> Any:
            result = fn()
            if asyncio.iscoroutine(result):
                result = await result
            return result

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self.loop.close()
