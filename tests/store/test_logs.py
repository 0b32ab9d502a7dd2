"""Trial logs in the store, on SQLite and PostgreSQL: the tail, the quota, retention."""

from __future__ import annotations

import datetime as dt

from sqlalchemy import event

from assay.master.store import LogLine, Store, WriteBatch
from assay.master.store._logs import MARKER_STREAM, QUOTA_MARKER
from assay.master.telemetry import LogKeeper
from tests.store import _seed as seed


def _lines(n: int, prefix: str = "line") -> list[LogLine]:
    return [LogLine(f"{prefix} {i}") for i in range(n)]


def _statements(store: Store) -> list[str]:
    seen: list[str] = []
    event.listen(store.engine, "before_cursor_execute", lambda *a: seen.append(a[2]))
    return seen


def test_the_tail_is_the_last_lines_read_backwards(store: Store) -> None:
    _, tid, run = seed.trial_with_run(store)
    _, other, other_run = seed.trial_with_run(store, name="other")
    for start in range(0, 3000, 1000):
        store.append_logs(tid, run, [LogLine(f"line {i}") for i in range(start, start + 1000)])
        store.append_logs(other, other_run, _lines(10, "other"))
    seen = _statements(store)

    tail = store.last_logs(tid, 3)

    assert [line.message for line in tail] == ["line 2997", "line 2998", "line 2999"]
    assert tail[0].id < tail[1].id < tail[2].id
    selects = [s for s in seen if s.startswith("SELECT")]
    assert len(selects) == 1  # one query, newest first with a limit: no scan of the log
    assert "ORDER BY task_logs.id DESC" in selects[0]
    assert "LIMIT" in selects[0]
    if store.engine.dialect.name == "sqlite":
        with store.engine.connect() as c:
            plan = " ".join(
                str(row[-1])
                for row in c.exec_driver_sql(
                    "EXPLAIN QUERY PLAN SELECT * FROM task_logs WHERE trial_id = ? "
                    "ORDER BY id DESC LIMIT 3",
                    (tid,),
                )
            )
        assert "USING INDEX ix_task_logs_trial_id_id" in plan
        assert "TEMP B-TREE" not in plan
    assert [line.message for line in store.last_logs(tid, 1)] == ["line 2999"]
    assert len(store.last_logs(tid, 5000)) == 3000
    assert store.last_logs(other + 1000, 5) == []


def test_the_tail_of_one_level(store: Store) -> None:
    _, tid, run = seed.trial_with_run(store)
    store.append_logs(tid, run, [LogLine("ERROR a", level="ERROR"), *_lines(50)])
    store.append_logs(tid, run, [LogLine("ERROR b", level="ERROR"), *_lines(50)])
    assert [line.message for line in store.last_logs(tid, 1, level="ERROR")] == ["ERROR b"]


def test_a_trial_over_its_quota_keeps_a_prefix_and_one_marker(store: Store) -> None:
    _, tid, run = seed.trial_with_run(store)
    quota = 1000
    store.append_logs(tid, run, [LogLine("x" * 100)] * 6, quota_bytes=quota)
    store.append_logs(tid, run, [LogLine("é" * 100)] * 6, quota_bytes=quota)  # 200 bytes each
    store.append_logs(tid, run, [LogLine("y" * 10)] * 6, quota_bytes=quota)

    lines = store.tail_logs(tid)
    text = [line for line in lines if line.stream != MARKER_STREAM]
    markers = [line for line in lines if line.stream == MARKER_STREAM]
    assert [len(line.message) for line in text] == [100] * 6 + [100] * 2  # 600 + 400 bytes
    assert len(markers) == 1
    assert markers[0].message.startswith(QUOTA_MARKER)
    assert lines[-1] == markers[0]


def test_the_quota_counts_what_was_stored_before_a_restart(store: Store, db_url: str) -> None:
    _, tid, run = seed.trial_with_run(store)
    store.append_logs(tid, run, [LogLine("x" * 100)] * 9)  # before any quota
    restarted = Store.open(db_url)
    try:
        restarted.append_logs(tid, run, [LogLine("y" * 100)] * 3, quota_bytes=1000)
        restarted.append_logs(tid, run, [LogLine("z")], quota_bytes=1000)
        again = Store.open(db_url)
        again.append_logs(tid, run, [LogLine("z")], quota_bytes=1000)
        again.close()
    finally:
        restarted.close()
    messages = [line.message for line in store.tail_logs(tid)]
    assert messages.count("y" * 100) == 1
    assert "z" not in messages
    assert sum(m.startswith(QUOTA_MARKER) for m in messages) == 1


def test_logs_of_trials_that_ended_long_ago_are_deleted_in_batches(store: Store) -> None:
    _, old, old_run = seed.trial_with_run(store)
    _, recent, recent_run = seed.trial_with_run(store, name="recent")
    _, running, running_run = seed.trial_with_run(store, name="running")
    for tid, run in [(old, old_run), (recent, recent_run), (running, running_run)]:
        store.append_logs(tid, run, _lines(25))
    now = seed.now()
    batch = WriteBatch()
    batch.set_trial(old, state="COMPLETED", end_time=now - dt.timedelta(days=10))
    batch.set_trial(recent, state="COMPLETED", end_time=now - dt.timedelta(days=1))
    store.apply(batch)

    expired = store.expired_log_trials(now - dt.timedelta(days=7))
    assert expired == [old]
    assert [store.delete_logs(old, 10) for _ in range(4)] == [10, 10, 5, 0]
    assert store.tail_logs(old) == []
    assert store.expired_log_trials(now - dt.timedelta(days=7)) == []
    assert len(store.tail_logs(recent)) == len(store.tail_logs(running)) == 25


def test_the_keeper_deletes_expired_logs_and_keeps_the_rest(store: Store) -> None:
    _, old, old_run = seed.trial_with_run(store)
    _, kept, kept_run = seed.trial_with_run(store, name="kept")
    store.append_logs(old, old_run, _lines(23))
    store.append_logs(kept, kept_run, _lines(5))
    batch = WriteBatch()
    batch.set_trial(old, state="ERROR", end_time=seed.now() - dt.timedelta(days=3))
    store.apply(batch)

    keeper = LogKeeper(store, retention_days=2, first_s=3600, batch=10)
    try:
        assert keeper.expire() == 23
        assert keeper.expire() == 0
    finally:
        keeper.close()
    assert store.tail_logs(old) == []
    assert len(store.tail_logs(kept)) == 5
