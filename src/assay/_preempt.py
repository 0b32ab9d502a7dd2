"""Graceful preemption: notice a stop request, checkpoint at the next batch, exit 0.

Two signals ask a running trial to stop: SIGTERM (what the agent sends first when it
stops an allocation: a pause, a cancel, a shutdown) and the master's answer to
`ShouldPreempt`, which rank 0 polls every few seconds in a background thread. Either
sets a flag; the training loop looks at it between batches, and every rank stops at the
same batch (see `TrialController`), checkpoints and returns, so the process exits 0 and
a later run resumes from that batch.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

log = logging.getLogger("assay")
POLL_INTERVAL_S = 5.0


class PreemptWatcher:
    """Sets `requested` on SIGTERM, or when `ask()` (polled in a thread) says so."""

    def __init__(
        self,
        ask: Callable[[], bool] | None = None,
        interval_s: float = POLL_INTERVAL_S,
        *,
        quiet: bool = False,
    ) -> None:
        """`quiet`: log nothing (the Core API says so itself, where the script asks)."""
        self._quiet = quiet
        self.reason: str | None = None  # who asked ("a SIGTERM", "the master ..."), once asked
        self._flag = threading.Event()
        self._stop = threading.Event()
        self._previous: Any = None
        self._installed = False
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
            self._installed = True
        self._thread: threading.Thread | None = None
        if ask is not None:
            self._thread = threading.Thread(
                target=self._poll, args=(ask, interval_s), name="preempt-poll", daemon=True
            )
            self._thread.start()

    @property
    def requested(self) -> bool:
        return self._flag.is_set()

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        if not self._flag.is_set():
            self.reason = "a SIGTERM"
            if not self._quiet:
                log.info("SIGTERM: checkpointing at the next batch, then exiting")
        self._flag.set()

    def _poll(self, ask: Callable[[], bool], interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                if ask():
                    if not self._flag.is_set():
                        self.reason = "the master (a pause, a cancel or a preemption)"
                        if not self._quiet:
                            log.info(
                                "the master asks this trial to stop: checkpointing, then exiting"
                            )
                    self._flag.set()
                    return
            except Exception as e:  # the master may be restarting: ask again later
                log.debug("asking the master about preemption failed: %s", e)

    def close(self) -> None:
        self._stop.set()
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)
            self._installed = False
