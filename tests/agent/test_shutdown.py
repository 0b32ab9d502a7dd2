"""Stopping the agent: what is queued reaches a master that is up, and a master that has
gone (or goes during the flush) does not hold the agent for the flush timeout."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from assay.agent import Agent, AgentSettings
from assay.agent._connection import Backoff, MasterConnection
from assay.proto import agent_pb2, common_pb2
from tests.agent.conftest import HARNESS, FakeMaster, start_message

# Far above what any of these stops may take: a wait for it fails the bound at once.
FLUSH_TIMEOUT = 30.0
# Well under the 5 s default flush, with room for a loaded 2-core machine.
PROMPT = 4.0


class StallingMaster(FakeMaster):
    """Takes the Register, answers Registered, then reads nothing more: the agent's sends
    fill the stream's flow-control window and stay there, as with a master that hangs."""

    def Connect(self, request_iterator: Any, context: Any) -> Iterator[agent_pb2.MasterMessage]:  # noqa: N802
        self._record(next(request_iterator))
        yield agent_pb2.MasterMessage(
            registered=agent_pb2.Registered(cluster_id="test", heartbeat_interval_ms=60_000)
        )
        while context.is_active():
            time.sleep(0.05)


def _connection(master: FakeMaster) -> MasterConnection:
    return MasterConnection(
        f"127.0.0.1:{master.port}",
        register=lambda: agent_pb2.Register(agent_id="test-agent"),
        heartbeat=agent_pb2.Heartbeat,
        on_message=lambda _: None,
        flush_timeout=FLUSH_TIMEOUT,
        backoff=Backoff(initial=60.0, maximum=60.0),  # no second attempt during a test
    )


def _exit(allocation_id: str) -> agent_pb2.AgentMessage:
    return agent_pb2.AgentMessage(
        allocation_state=agent_pb2.AllocationStateChange(
            allocation_id=allocation_id, state=agent_pb2.ALLOCATION_STATE_EXITED
        )
    )


def _logs(allocation_id: str, size: int) -> agent_pb2.AgentMessage:
    line = common_pb2.LogLine(trial_id=1, run_id=1, stream="stdout", message="x" * size)
    return agent_pb2.AgentMessage(
        logs=agent_pb2.LogBatch(allocation_id=allocation_id, lines=[line])
    )


def test_close_delivers_what_is_queued_to_a_master_that_is_up(master: FakeMaster) -> None:
    connection = _connection(master)
    thread = threading.Thread(target=connection.run, daemon=True)
    thread.start()
    try:
        assert connection.connected.wait(10)
        for i in range(300):
            connection.send(_logs(f"a{i % 3}", 1000))
        for i in range(3):
            connection.send(_exit(f"a{i}"))
    finally:
        connection.close()
    thread.join(5)

    exits = master.of("allocation_state")
    assert sorted(e.allocation_id for e in exits) == ["a0", "a1", "a2"]
    assert len(master.of("logs")) == 300
    assert len(connection.outbox) == 0


def test_close_returns_at_once_when_the_master_has_gone(master: FakeMaster) -> None:
    connection = _connection(master)
    thread = threading.Thread(target=connection.run, daemon=True)
    thread.start()
    assert connection.connected.wait(10)
    master.stop()
    deadline = time.monotonic() + 10
    while connection.connected.is_set() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not connection.connected.is_set(), "the agent did not see the stream break"
    connection.send(_exit("lost"))

    started = time.monotonic()
    connection.close()
    elapsed = time.monotonic() - started
    thread.join(5)

    assert elapsed < PROMPT, f"close() took {elapsed:.1f}s with the master gone"
    assert not thread.is_alive()


def test_a_stream_that_breaks_during_the_flush_ends_it() -> None:
    master = StallingMaster()
    master.start()
    connection = _connection(master)
    thread = threading.Thread(target=connection.run, daemon=True)
    thread.start()
    try:
        assert connection.connected.wait(10)
        for _ in range(60):  # 6 MB: far more than the stream takes unread
            connection.send(_logs("big", 100_000))
        connection.send(_exit("big"))
        closing = threading.Thread(target=connection.close, daemon=True)
        closing.start()
        closing.join(1.0)
        assert closing.is_alive(), "the flush should wait while the stream is up"
    finally:
        stopped = time.monotonic()
        master.stop()
    closing.join(FLUSH_TIMEOUT)
    elapsed = time.monotonic() - stopped
    thread.join(5)

    assert elapsed < PROMPT, f"close() took {elapsed:.1f}s after the master went"
    assert len(connection.outbox) > 0  # what the stream did not take is still queued


@pytest.mark.slow
def test_an_agent_stopped_after_its_master_has_gone_exits_promptly(
    master: FakeMaster, tmp_path: Path
) -> None:
    settings = AgentSettings(
        master=f"127.0.0.1:{master.port}",
        agent_id="test-agent",
        slot_type="cpu",
        slots=2,
        work_dir=tmp_path / "work",
        grace=5.0,
        address="127.0.0.1",
        isolation="none",
    )
    # The long backoff keeps the broken stream the agent's last one until it stops.
    agent = Agent(settings, harness_command=HARNESS, backoff=Backoff(initial=60.0, maximum=60.0))
    agent.connection.flush_timeout = FLUSH_TIMEOUT
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    try:
        master.wait_for("register")
        master.send(start_message("trap", {"mode": "trap"}))
        master.wait_ready("trap", 2)
        master.stop()
        deadline = time.monotonic() + 10
        while agent.connection.connected.is_set() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not agent.connection.connected.is_set(), "the agent did not see the stream break"

        started = time.monotonic()
        agent.stop()
        thread.join(FLUSH_TIMEOUT + 10)
        elapsed = time.monotonic() - started
    finally:
        agent.stop()
        agent.stop()  # SIGKILLs what is left
        thread.join(20)

    assert not thread.is_alive()
    assert not agent.running_allocations
    # The final state could not go out: it was queued when the agent exited.
    assert agent.connection.outbox.unreported_exits() == {"trap"}
    assert elapsed < PROMPT, f"the agent took {elapsed:.1f}s to stop with the master gone"
