"""Group commit: the master's state changes reach the store in batches, before any action.

Under the master's lock a state change updates memory, records its rows in the open
`WriteBatch` and queues the actions that must follow it (a message to an agent). One
thread takes the open batch, writes it in a single transaction, then runs its actions
in order and wakes the callers waiting on it. While one batch commits the next one
fills, so a busy master writes hundreds of changes per transaction instead of one
transaction per change, and nothing is sent to an agent or answered to a client before
the change it reports is durable (DESIGN.md: "The database is the truth").

A batch costs about as much to write for one change as for a dozen (a transaction and a
statement per kind of row), so under load the committer gathers: when the last batch
was asked for by more than one change (concurrent callers, agents' reports), the next
one waits until as many callers wait for it as waited for the last one (the callers
answered by a commit come back at about the same time), for at most `gather_s` after
the last one started. A lone caller is never held back, and an idle master commits at
once.

If a batch cannot be written after a few tries, memory is ahead of the store with no
way back: the committer stops, every waiter gets `StoreUnavailableError`, and
`on_fatal` tells the process to exit so a restart recovers from the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable

from sqlalchemy.exc import OperationalError

from assay.master._aio import loop_mail, one_wakeup
from assay.master.errors import StoreUnavailableError
from assay.master.store import Store, WriteBatch
from assay.master.telemetry import NO_TELEMETRY, Telemetry

log = logging.getLogger("assay.master")
RETRIES = 5
# How long a busy committer may let the next batch fill, from the start of the last one:
# a waiter's answer comes up to this much later, and each batch carries that much more.
GATHER_S = 0.02


class GroupCommit:
    """The open batch (changed under the master's lock) and the thread that commits it."""

    def __init__(
        self,
        store: Store,
        lock: threading.RLock,
        on_fatal: Callable[[BaseException], None] = lambda e: None,
        gather_s: float = GATHER_S,
        telemetry: Telemetry = NO_TELEMETRY,
    ) -> None:
        """`telemetry` times each batch's write (`Telemetry.committed`)."""
        if gather_s < 0:
            raise ValueError(f"gather_s must be 0 or more, got {gather_s}")
        self.store = store
        self.lock = lock  # the master's: batch and actions change only under it
        self.on_fatal = on_fatal
        self.gather_s = gather_s
        self.telemetry = telemetry
        self.batch = WriteBatch()
        self._actions: list[Callable[[], None]] = []
        self._open = 1  # number of the batch being filled
        self._done = 0  # number of the last batch committed and acted on
        self._requested = 0  # the last batch a caller waits for
        self._asked = 0  # tickets taken on the open batch: how many changes want it
        self._busy = False  # the last batch was asked for by more than one change
        self._last_start = 0.0  # when (monotonic) the committer took the last batch
        self._waiting: dict[int, int] = {}  # batch number -> callers waiting for it
        self._expected = 1  # callers a gathering batch waits for: as many as the last had
        self._gathered = threading.Event()  # the committer: they are all there
        self._hurry = False  # a flush wants the open batch committed without gathering
        self._failed: BaseException | None = None
        self._async_waiters: list[tuple[int, asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._stopping = False
        self._cond = threading.Condition()  # waiters: a batch was committed, or failed
        self._work = threading.Event()  # the committer: there is something to commit
        self._thread = threading.Thread(target=self._run, name="group-commit", daemon=True)
        self._thread.start()

    # --- under the master's lock ----------------------------------------------------------

    def after(self, action: Callable[[], None]) -> None:
        """Run `action` once the open batch is committed (in the order given)."""
        self._actions.append(action)
        self._wake()

    def ticket(self) -> int:
        """The number of the open batch: `wait(ticket)` returns once it is committed."""
        self._requested = self._open
        self._asked += 1
        self._wake()
        return self._open

    def _wake(self) -> None:
        if not self._work.is_set():
            self._work.set()

    # --- outside the master's lock --------------------------------------------------------

    def wait(self, ticket: int, timeout: float | None = None) -> None:
        """Block until batch `ticket` is committed; raise if the store has failed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            if self._done < ticket:
                self._arrived(ticket)
            while self._done < ticket:
                if self._failed is not None:
                    raise StoreUnavailableError(
                        f"the master could not write to its database ({self._failed}); "
                        "it is shutting down, and a restart resumes from the database"
                    )
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"batch {ticket} was not committed in {timeout} s")
                self._cond.wait(left)

    async def wait_async(self, ticket: int) -> None:
        """`wait` for a coroutine: the event loop is not blocked meanwhile."""
        loop = asyncio.get_running_loop()
        with self._cond:
            if self._done >= ticket:
                return
            if self._failed is None:
                future: asyncio.Future[None] = loop.create_future()
                self._async_waiters.append((ticket, loop, future))
                self._arrived(ticket)
        if self._failed is not None:
            self.wait(ticket, 0)  # raises StoreUnavailableError
        await future

    def _arrived(self, ticket: int) -> None:
        """A caller waits for batch `ticket` (under `_cond`)."""
        count = self._waiting[ticket] = self._waiting.get(ticket, 0) + 1
        if count >= self._expected:
            self._gathered.set()

    def flush(self, timeout: float | None = None) -> None:
        """Commit what has been recorded so far (now: a gathering batch goes at once)."""
        with self.lock:
            ticket = self.ticket()
            self._hurry = True
        self._gathered.set()
        self.wait(ticket, timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Commit what is pending, then stop the thread."""
        if self._failed is None and self._thread.is_alive():
            with contextlib.suppress(StoreUnavailableError, TimeoutError):
                self.flush(timeout)
        self._stopping = True
        self._work.set()
        self._gathered.set()
        self._thread.join(timeout)

    @property
    def failed(self) -> BaseException | None:
        return self._failed

    # --- the committer thread -------------------------------------------------------------

    def _run(self) -> None:
        while True:
            if not self._has_work():
                if self._stopping:
                    return
                self._work.wait()
                self._work.clear()
                continue  # look again: a change may have come between the wait and the clear
            if self._busy:
                self._gather()
            with self.lock:
                batch, actions, number = self.batch, self._actions, self._open
                self.batch, self._actions = WriteBatch(), []
                self._open += 1
                self._busy, self._asked, self._hurry = self._asked > 1, 0, False
            self._last_start = time.monotonic()
            try:
                self._write(batch)
            except BaseException as e:
                log.critical("cannot write to the store; the master must restart: %s", e)
                with self._cond:
                    self._failed = e
                    self._cond.notify_all()
                    waiters, self._async_waiters = self._async_waiters, []
                error = StoreUnavailableError(f"the master could not write to its database ({e})")
                _settle_all(waiters, error)
                self.on_fatal(e)
                return
            with one_wakeup():  # the messages and the answers leave together
                for action in actions:
                    try:
                        action()
                    except Exception:
                        log.exception("an action after a commit failed")
                with self._cond:
                    self._done = number
                    self._cond.notify_all()
                    self._expected = max(1, self._waiting.pop(number, 0))
                    ready = [w for w in self._async_waiters if w[0] <= number]
                    if ready:
                        self._async_waiters = [w for w in self._async_waiters if w[0] > number]
                _settle_all(ready, None)

    def _gather(self) -> None:
        """Let the open batch fill: until as many callers wait for it as waited for the
        last one, or `gather_s` after the last one started."""
        deadline = self._last_start + self.gather_s
        while not (self._stopping or self._hurry):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._gathered.clear()  # before looking: a caller arriving now sets it again
            with self._cond:
                if self._waiting.get(self._open, 0) >= self._expected:
                    return
            self._gathered.wait(left)

    def _has_work(self) -> bool:
        # Read without the master's lock: a change made after this check sets _work
        # again, and the swap itself happens under the lock.
        return bool(self.batch) or bool(self._actions) or self._requested >= self._open

    def _write(self, batch: WriteBatch) -> None:
        started = time.perf_counter()
        for attempt in range(RETRIES):
            try:
                self.store.apply(batch)
                self.telemetry.committed(time.perf_counter() - started)
                return
            except OperationalError as e:
                # Busy or a dropped connection: the transaction rolled back as a whole.
                if attempt == RETRIES - 1:
                    raise
                log.warning("writing a batch failed (%s); retrying", e)
                time.sleep(min(2.0, 0.1 * 2**attempt))


def _settle_all(
    waiters: list[tuple[int, asyncio.AbstractEventLoop, asyncio.Future[None]]],
    error: BaseException | None,
) -> None:
    """Complete the waiters' futures, each on its own loop (asyncio futures are not
    thread-safe), with the messages this commit sent there: one wake-up per loop."""

    def settle(future: asyncio.Future[None]) -> None:
        if future.done():
            return
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)

    for _, loop, future in waiters:
        loop_mail(loop).post(settle, future)
