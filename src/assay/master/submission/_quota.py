"""What one user may submit: experiments per minute, and model-definition bytes in all.

Cluster admins are not limited (they run the benchmarks, the CI and the cluster). A
user over a limit gets RESOURCE_EXHAUSTED with what to wait for or remove, and nothing
is stored. The rate is a token bucket (`per_minute` at once, refilled at `per_minute`
a minute); the stored bytes are read from the store once per user and master start,
then counted here as submissions are taken.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from assay.master.errors import ResourceExhaustedError


class SubmissionQuota:
    """Thread-safe; `per_minute` or `max_bytes` 0: that limit is off."""

    def __init__(
        self,
        per_minute: int,
        max_bytes: int,
        stored_bytes: Callable[[int], int],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._per_minute = per_minute
        self._max_bytes = max_bytes
        self._stored_bytes = stored_bytes
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[int, tuple[float, float]] = {}  # owner -> (tokens, at)
        self._bytes: dict[int, int] = {}

    def take(self, owner_id: int, admin: bool, size: int) -> None:
        """Count one submission of `size` archive bytes, or raise ResourceExhaustedError."""
        if admin or (not self._per_minute and not self._max_bytes):
            return
        used = None
        if self._max_bytes and owner_id not in self._bytes:
            used = self._stored_bytes(owner_id)  # off the lock: a store read
        with self._lock:
            if used is not None:
                self._bytes.setdefault(owner_id, used)
            now = self._clock()
            tokens = float(self._per_minute)
            if self._per_minute:
                tokens, at = self._buckets.get(owner_id, (tokens, now))
                tokens = min(float(self._per_minute), tokens + (now - at) * self._per_minute / 60)
                if tokens < 1:
                    wait = (1 - tokens) * 60 / self._per_minute
                    raise ResourceExhaustedError(
                        f"more than {self._per_minute} experiments a minute: wait {wait:.0f} s "
                        "(the master's experiments_per_minute)"
                    )
            if self._max_bytes:
                total = self._bytes[owner_id] + size
                if total > self._max_bytes:
                    raise ResourceExhaustedError(
                        f"your experiments' model definitions would take {total / 2**20:.0f} "
                        f"MiB, over the {self._max_bytes / 2**20:.0f} MiB a user may store "
                        "(the master's model_definitions_mb): keep data and checkpoints out of "
                        "model directories, or ask an administrator"
                    )
                self._bytes[owner_id] = total
            if self._per_minute:
                self._buckets[owner_id] = (tokens - 1, now)


__all__ = ["SubmissionQuota"]
