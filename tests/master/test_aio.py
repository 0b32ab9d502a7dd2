"""Messages posted to the event loop from other threads arrive in order, and a commit's
worth of them wakes the loop once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from assay.master._aio import LoopOutbox, LoopThread, loop_mail, one_wakeup
from assay.master.lifecycle import KillRun


def test_posts_inside_one_wakeup_wake_the_loop_once_and_keep_their_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    thread = LoopThread("test-loop")
    loop = thread.loop
    wakeups: list[Any] = []
    original = loop.call_soon_threadsafe

    def counted(callback: Any, *args: Any) -> Any:
        if getattr(callback, "__name__", "") == "_deliver":  # not `thread.call`'s own
            wakeups.append(callback)
        return original(callback, *args)

    try:
        outbox: LoopOutbox = thread.call(lambda: LoopOutbox(loop))
        monkeypatch.setattr(loop, "call_soon_threadsafe", counted)
        messages = [KillRun(allocation_id=f"a{i}", graceful=False) for i in range(100)]
        with one_wakeup():
            for message in messages:
                outbox.put(message)
            assert wakeups == []  # nothing is woken before the block ends
        assert len(wakeups) == 1

        async def drain() -> list[Any]:
            return [await outbox.get() for _ in messages]

        assert thread.call(drain, timeout=10) == messages
        # Outside the block each post wakes the loop (unless one is on its way already).
        wakeups.clear()
        outbox.put(None)
        assert thread.call(outbox.get, timeout=10) is None
        assert len(wakeups) == 1
        assert loop_mail(loop) is loop_mail(loop)
    finally:
        monkeypatch.undo()
        thread.stop()


def test_a_closed_loop_drops_what_is_posted_to_it() -> None:
    loop = asyncio.new_event_loop()
    outbox = LoopOutbox(loop)
    loop.close()
    outbox.put(None)  # no error: the server has stopped and nobody reads
    outbox.put(None)
