"""The master's own log, kept in memory for `assay master logs` (StreamMasterLogs).

`MasterLogBuffer` is a logging handler on the root logger holding the newest
`MASTER_LOG_LINES` records as lines with ids that count up, as Determined's master keeps
its recent log for `det master logs`. A record logged with `extra={SECRET_ARGS: True}`
(the admin password made at a first start) keeps its text but not its arguments; values
given to secret names (`password=...`) are masked in every line.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import threading
from collections import deque
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from assay.master.auth import MASK, mask_text

MASTER_LOG_LINES = 10_000
SECRET_ARGS = "assay_secret_args"
POLL_S = 0.25


@dataclass(frozen=True)
class MasterLogLine:
    id: int
    timestamp: dt.datetime
    level: str
    logger: str
    message: str


class MasterLogBuffer(logging.Handler):
    """The newest `size` records of the process's log; `close()` detaches it."""

    def __init__(self, size: int = MASTER_LOG_LINES, level: int = logging.INFO) -> None:
        super().__init__(level)
        self._lines: deque[MasterLogLine] = deque(maxlen=size)
        self._next = 1
        self._guard = threading.Lock()
        logging.getLogger().addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if getattr(record, SECRET_ARGS, False):
                text = str(record.msg) % tuple(MASK for _ in record.args or ())
            else:
                text = record.getMessage()
            if record.exc_info:
                text += "\n" + logging.Formatter().formatException(record.exc_info)
            text = mask_text(text)
            stamp = dt.datetime.fromtimestamp(record.created, dt.UTC)
            with self._guard:
                line = MasterLogLine(self._next, stamp, record.levelname, record.name, text)
                self._lines.append(line)
                self._next += 1
        except Exception:
            self.handleError(record)

    def after(self, after_id: int = 0, tail: int = 0) -> list[MasterLogLine]:
        """The lines kept with id > `after_id`, only the last `tail` when `tail` > 0."""
        with self._guard:
            found = [line for line in self._lines if line.id > after_id]
        return found[-tail:] if tail > 0 else found

    def close(self) -> None:
        logging.getLogger().removeHandler(self)
        super().close()


async def stream_master_logs(
    buffer: MasterLogBuffer, *, tail: int = 0, follow: bool = False
) -> AsyncGenerator[MasterLogLine, None]:
    """The kept lines (the last `tail` when `tail` > 0), then, following, each new one
    until the caller goes away."""
    after = 0
    lines = buffer.after(0, tail)
    while True:
        for line in lines:
            yield line
            after = line.id
        if not follow:
            return
        await asyncio.sleep(POLL_S)
        lines = buffer.after(after)


__all__ = [
    "MASTER_LOG_LINES",
    "SECRET_ARGS",
    "MasterLogBuffer",
    "MasterLogLine",
    "stream_master_logs",
]
