"""`core.preempt`: whether this trial should checkpoint and exit now.

On a cluster `should_preempt()` turns True after a SIGTERM (what the agent sends first
when it stops an allocation), when the master asks (a pause, a cancel, a preemption for
a higher priority: the chief polls it in a background thread), or when the searcher
stops this trial at a target (see `assay.core._searcher`). The script then saves a
checkpoint and exits 0 (or 80); a later run resumes from
`get_cluster_info().latest_checkpoint`. With several processes the answer is one
collective, so every process gets the same answer at the same call: call it from every
process, at the same points (in every mode but `ChiefOnly`, which only the chief calls;
`WorkersAskMaster` is answered the same way as `WorkersAskChief`). Under `assay trial
run-local` it turns True once a validation reaches `searcher.max_length` (the one target
there); with plain `python` it is always False.
"""

from __future__ import annotations

import enum
import os
import threading

from assay._backend import Backend, report_line
from assay._preempt import POLL_INTERVAL_S, PreemptWatcher
from assay.core._distributed import DistributedContext


class PreemptMode(enum.Enum):
    """Determined's modes; every process learns the chief's answer either way."""

    WorkersAskChief = "WORKERS_ASK_CHIEF"
    ChiefOnly = "CHIEF_ONLY"
    WorkersAskMaster = "WORKERS_ASK_MASTER"


class PreemptContext:
    """See the module docstring."""

    def __init__(
        self,
        distributed: DistributedContext,
        backend: Backend | None,
        *,
        on_cluster: bool,
        mode: PreemptMode = PreemptMode.WorkersAskChief,
    ) -> None:
        self._dist = distributed
        self._mode = mode
        self._stop = threading.Event()  # set by the searcher
        self._watcher: PreemptWatcher | None = None
        if on_cluster:
            ask = backend.preempt_requested if backend is not None else None
            interval = float(os.environ.get("ASSAY_PREEMPT_POLL_S", POLL_INTERVAL_S))
            self._watcher = PreemptWatcher(ask, interval, quiet=True)
        self._said = False

    def _local(self) -> bool:
        return self._stop.is_set() or (self._watcher is not None and self._watcher.requested)

    def should_preempt(self, auto_ack: bool = True) -> bool:
        """True when the trial should checkpoint and exit (the same on every process)."""
        if self._mode is PreemptMode.ChiefOnly and not self._dist.is_chief:
            raise RuntimeError("preempt_mode=ChiefOnly: only the chief may call should_preempt")
        if self._mode is PreemptMode.ChiefOnly:
            answer = self._local()
        else:
            answer = self._dist.any(self._local())
        if answer and not self._said and self._dist.is_chief:
            self._said = True  # once, from the script's own thread (not a signal handler)
            report_line("%s", self._why())
        return answer

    def _why(self) -> str:
        if self._watcher is not None and self._watcher.reason is not None:
            return (
                f"asked to stop by {self._watcher.reason}: should_preempt() is True from now "
                "on; checkpoint and exit, and the trial resumes from its latest checkpoint"
            )
        return "the searcher's target is reached: should_preempt() is True from now on"

    def acknowledge_preemption_signal(self) -> None:
        """Determined's call; a preemption here needs no acknowledgement."""

    def _searcher_stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None


__all__ = ["PreemptContext", "PreemptMode"]
