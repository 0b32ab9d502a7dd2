"""Output lines of the ranks, batched for the master: every 0.25 s, 500 lines or 1 MiB."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable

from google.protobuf.timestamp_pb2 import Timestamp

from assay.proto import agent_pb2, common_pb2

FLUSH_INTERVAL = 0.25
MAX_LINES = 500
# The master takes at most 4 MiB a message; a line is at most 64 KiB as read
# (_process.MAX_LINE_BYTES), so a batch stops at the first line past this.
MAX_BATCH_BYTES = 2**20

_LEVEL = re.compile(r"^\s*\[?(DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\b")
_ALIASES = {"WARN": "WARNING", "FATAL": "CRITICAL"}


def parse_level(message: str) -> str:
    """The log level a line starts with ("ERROR: ...", "[WARNING] ...", ...), else ""."""
    match = _LEVEL.match(message)
    if match is None:
        return ""
    level = match.group(1)
    return _ALIASES.get(level, level)


class LogBatcher:
    """Collects lines from any thread; a flusher thread sends them as `LogBatch`es."""

    def __init__(
        self,
        allocation_id: str,
        send: Callable[[agent_pb2.LogBatch], None],
        *,
        trial_id: int = 0,
        run_id: int = 0,
        flush_interval: float = FLUSH_INTERVAL,
        max_lines: int = MAX_LINES,
    ) -> None:
        self.allocation_id = allocation_id
        self._send = send
        self._trial_id = trial_id
        self._run_id = run_id
        self._interval = flush_interval
        self._max = max_lines
        self._lines: list[common_pb2.LogLine] = []
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"logs-{allocation_id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def add(self, rank: int, stream: str, message: str) -> None:
        stamp = Timestamp()
        stamp.FromNanoseconds(time.time_ns())
        line = common_pb2.LogLine(
            trial_id=self._trial_id,
            run_id=self._run_id,
            rank=rank,
            stream=stream,
            level=parse_level(message),
            timestamp=stamp,
            message=message,
        )
        with self._cond:
            self._lines.append(line)
            if len(self._lines) >= self._max:
                self._cond.notify()

    def close(self) -> None:
        """Send what is left and stop the flusher."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join()
        else:
            self._flush()

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._closed and len(self._lines) < self._max:
                    self._cond.wait(self._interval)
                closed = self._closed
            self._flush()
            if closed:
                return

    def _flush(self) -> None:
        with self._cond:
            lines, self._lines = self._lines, []
        chunk: list[common_pb2.LogLine] = []
        size = 0
        for line in lines:
            chunk.append(line)
            size += line.ByteSize()
            if len(chunk) >= self._max or size >= MAX_BATCH_BYTES:
                self._send(agent_pb2.LogBatch(allocation_id=self.allocation_id, lines=chunk))
                chunk, size = [], 0
        if chunk:
            self._send(agent_pb2.LogBatch(allocation_id=self.allocation_id, lines=chunk))


__all__ = ["FLUSH_INTERVAL", "MAX_BATCH_BYTES", "MAX_LINES", "LogBatcher", "parse_level"]
