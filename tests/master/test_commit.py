"""Group commit: writes land before the actions that follow them; a dead store stops all."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time
from pathlib import Path

import grpc
import pytest
from sqlalchemy.exc import OperationalError

from assay.master._commit import GroupCommit
from assay.master._server import MasterServer
from assay.master.errors import StoreUnavailableError
from assay.master.store import Store, WriteBatch
from assay.proto import api_pb2, api_pb2_grpc
from tests.credentials import authed_channel, master_config
from tests.master.conftest import experiment_yaml, model_archive

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store.open(f"sqlite:///{tmp_path / 'assay.db'}")


def _record_experiment(batch: WriteBatch, store: Store) -> int:
    experiment_id = store.reserve_id("experiments")
    batch.add_experiment(
        experiment_id,
        name="e",
        owner_id=store.user_id("admin"),
        config={},
        model_definition=b"",
        state="ACTIVE",
        description="",
        labels=(),
        priority=42,
        now=NOW,
    )
    return experiment_id


def test_actions_run_after_their_writes_commit_and_in_order(store: Store) -> None:
    lock = threading.RLock()
    commit = GroupCommit(store, lock)
    seen: list[tuple[int, str]] = []
    try:
        with lock:
            first = _record_experiment(commit.batch, store)
            commit.after(lambda: seen.append((first, store.get_experiment(first).state)))
            ticket = commit.ticket()
        with lock:
            second = _record_experiment(commit.batch, store)
            commit.after(lambda: seen.append((second, store.get_experiment(second).state)))
            later = commit.ticket()
        commit.wait(ticket, timeout=10)
        commit.wait(later, timeout=10)
        assert seen == [(first, "ACTIVE"), (second, "ACTIVE")]
    finally:
        commit.close()
        store.close()


def test_async_waiters_are_woken_by_the_commit(store: Store) -> None:
    lock = threading.RLock()
    commit = GroupCommit(store, lock)

    async def submit() -> int:
        with lock:
            experiment_id = _record_experiment(commit.batch, store)
            ticket = commit.ticket()
        await asyncio.wait_for(commit.wait_async(ticket), 10)
        return experiment_id

    try:
        experiment_id = asyncio.run(submit())
        assert store.get_experiment(experiment_id).state == "ACTIVE"
    finally:
        commit.close()
        store.close()


def _timed_applies(store: Store, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """When (monotonic) each batch's write started."""
    starts: list[float] = []
    apply = store.apply

    def timed(batch: WriteBatch) -> None:
        starts.append(time.monotonic())
        apply(batch)

    monkeypatch.setattr(store, "apply", timed)
    return starts


def test_a_lone_caller_is_never_held_back(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    starts = _timed_applies(store, monkeypatch)
    lock = threading.RLock()
    commit = GroupCommit(store, lock, gather_s=30.0)
    try:
        began = time.monotonic()
        for _ in range(5):
            with lock:
                _record_experiment(commit.batch, store)
                ticket = commit.ticket()
            commit.wait(ticket, timeout=10)
        assert len(starts) == 5
        assert time.monotonic() - began < 10  # nowhere near one gathering window
    finally:
        commit.close()
        store.close()


def _changes_waited_for(commit: GroupCommit, store: Store, callers: int) -> list[int]:
    """`callers` threads each record a change and wait for its commit, all in one batch;
    their tickets."""
    tickets: list[int] = []
    threads = []
    with commit.lock:  # the committer cannot take the batch before they all wait
        for _ in range(callers):
            _record_experiment(commit.batch, store)
            ticket = commit.ticket()
            tickets.append(ticket)
            threads.append(threading.Thread(target=commit.wait, args=(ticket, 10)))
        for thread in threads:
            thread.start()
        time.sleep(0.2)
    for thread in threads:
        thread.join(10)
    return tickets


def test_a_busy_committer_gathers_the_next_batch(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a batch two callers waited for, the next one waits for two callers too, for
    at most `gather_s` from the start of the last: what is recorded meanwhile joins it."""
    starts = _timed_applies(store, monkeypatch)
    lock = threading.RLock()
    commit = GroupCommit(store, lock, gather_s=0.5)
    try:
        first = _changes_waited_for(commit, store, 2)
        assert len(set(first)) == 1
        tickets = []
        for _ in range(3):
            with lock:
                _record_experiment(commit.batch, store)
                tickets.append(commit.ticket())
        commit.wait(tickets[-1], timeout=10)  # one caller of the two expected
        assert len(starts) == 2  # the three changes went in one batch
        assert starts[1] - starts[0] >= 0.45
        assert len(set(tickets)) == 1
        assert store.list_experiments().total == 5
    finally:
        commit.close()
        store.close()


def test_a_gathering_batch_goes_once_its_callers_are_back(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    starts = _timed_applies(store, monkeypatch)
    lock = threading.RLock()
    commit = GroupCommit(store, lock, gather_s=30.0)
    try:
        _changes_waited_for(commit, store, 3)
        began = time.monotonic()
        _changes_waited_for(commit, store, 3)
        assert time.monotonic() - began < 10  # not the 30 s window
        assert len(starts) == 2
    finally:
        commit.close()
        store.close()


def test_a_store_that_keeps_failing_fails_every_waiter_and_calls_on_fatal(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("assay.master._commit.time.sleep", lambda s: None)
    attempts: list[int] = []

    def broken(batch: WriteBatch) -> None:
        attempts.append(len(batch))
        raise OperationalError("INSERT", {}, Exception("disk I/O error"))

    monkeypatch.setattr(store, "apply", broken)
    lock = threading.RLock()
    fatal: list[BaseException] = []
    commit = GroupCommit(store, lock, on_fatal=fatal.append)
    ran: list[str] = []

    async def wait_async(ticket: int) -> None:
        await asyncio.wait_for(commit.wait_async(ticket), 10)

    try:
        with lock:
            _record_experiment(commit.batch, store)
            commit.after(lambda: ran.append("sent"))
            ticket = commit.ticket()
        with pytest.raises(StoreUnavailableError, match="disk I/O error"):
            commit.wait(ticket, timeout=10)
        with pytest.raises(StoreUnavailableError):
            asyncio.run(wait_async(ticket))
        assert len(attempts) == 5  # retried, then given up
        assert ran == []  # nothing acted on what was never written
        assert len(fatal) == 1
    finally:
        commit.close()
        store.close()


def test_a_master_whose_store_fails_answers_unavailable_and_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("assay.master._commit.time.sleep", lambda s: None)
    server = MasterServer(
        master_config(
            state_dir=tmp_path,
        )
    )
    server.start()

    def broken(batch: WriteBatch) -> None:
        raise OperationalError("INSERT", {}, Exception("database is gone"))

    monkeypatch.setattr(server.store, "apply", broken)
    try:
        with authed_channel(f"127.0.0.1:{server.port}") as channel:
            api = api_pb2_grpc.ApiStub(channel)
            request = api_pb2.CreateExperimentRequest(
                config_yaml=experiment_yaml(), model_definition=model_archive(), activate=False
            )
            with pytest.raises(grpc.RpcError) as info:
                api.CreateExperiment(request, timeout=20)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "could not write to its database" in str(info.value.details())
        deadline = time.monotonic() + 10
        while server.fatal is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.fatal is not None
        with pytest.raises(Exception, match="could not write to its database"):
            server.wait()
    finally:
        server.stop(grace=0)
