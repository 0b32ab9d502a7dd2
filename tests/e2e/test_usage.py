"""Usage accounting on a real cluster: the slot-seconds the master accounts match what the
agents saw of each allocation, and an agent killed mid-trial leaves no record open."""

from __future__ import annotations

import datetime as dt
import functools
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select

from assay.master.store import Store
from assay.master.store._models import SlotUsage
from tests.conftest import REGRESSION_DIR, regression_config
from tests.e2e.conftest import Cluster, start_cluster, stop_cluster

pytestmark = pytest.mark.slow

# Yesterday: the reports cover every allocation of the tests.
SINCE = (dt.datetime.now(dt.UTC) - dt.timedelta(days=1)).date().isoformat()
_STAMP = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO assay\.agent[\w.]*: "


@pytest.fixture(scope="module")
def three_agents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("usage")
    env = {"ASSAY_AGENT_RECONNECT_WAIT_S": "3", "ASSAY_HEARTBEAT_INTERVAL_S": "1"}
    cluster = start_cluster(tmp, None, agents=3, slots=1, master_env=env)
    try:
        yield cluster
    finally:
        stop_cluster(cluster)


def _create(cluster: Cluster, tmp: Path, name: str, **config: Any) -> int:
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(regression_config(**config)))
    created = cluster.json("experiment", "create", str(path), str(REGRESSION_DIR))
    return int(created["id"])


def _eventually(check: Callable[[], bool], timeout: float, cluster: Cluster, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached in {timeout:.0f} s:\n{cluster.dump_logs()}")
        time.sleep(0.3)


def _state(cluster: Cluster, eid: int) -> str:
    return str(cluster.json("experiment", "describe", str(eid))["state"])


def _completed(cluster: Cluster, eid: int) -> bool:
    return _state(cluster, eid) == "COMPLETED"


def _agent_spans(cluster: Cluster) -> dict[str, float]:
    """Allocation id -> seconds from the first of its agents starting it to the last
    seeing its processes exit, as the agents' own logs time them (one clock: one host)."""
    starts: dict[str, list[dt.datetime]] = {}
    ends: dict[str, list[dt.datetime]] = {}
    for log in cluster.logs[1:]:
        text = log.read_text()
        for m in re.finditer(_STAMP + r"starting allocation (\S+) ", text):
            starts.setdefault(m[2], []).append(_parse(m[1]))
        for m in re.finditer(_STAMP + r"allocation (\S+): (?!ranks .* started)", text):
            ends.setdefault(m[2], []).append(_parse(m[1]))
    return {
        a: (max(ends[a]) - min(times)).total_seconds() for a, times in starts.items() if a in ends
    }


def _parse(stamp: str) -> dt.datetime:
    return dt.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f")


def _rows(cluster: Cluster) -> list[Any]:
    store = Store.open(f"sqlite:///{cluster.state_dir / 'assay.db'}", migrate_schema=False)
    try:
        with store.read() as s:
            return list(s.execute(select(SlotUsage).order_by(SlotUsage.started_at)).scalars())
    finally:
        store.close()


def test_accounted_slot_seconds_match_what_the_agents_saw(
    three_agents: Cluster, tmp_path: Path
) -> None:
    cluster = three_agents
    # A gang of 2 over two 1-slot agents, and a 1-slot trial beside it.
    gang = _create(cluster, tmp_path, "gang", batches=300, slots=2, sleep_s=0.02)
    single = _create(cluster, tmp_path, "single", batches=300, sleep_s=0.02)
    for eid in (gang, single):
        ended = functools.partial(_completed, cluster, eid)
        _eventually(ended, 180, cluster, f"experiment {eid} completed")
    accounted = {
        int(g["key"]): g["slot_seconds"]
        for g in cluster.json("usage", "--by", "experiment", "--since", SINCE)["groups"]
    }
    rows = _rows(cluster)
    assert all(r.ended_at is not None for r in rows)
    assert sorted((r.experiment_id, r.slots) for r in rows) == [(gang, 1), (gang, 1), (single, 1)]
    assert len({r.agent_id for r in rows if r.experiment_id == gang}) == 2  # one row per part
    spans = _agent_spans(cluster)
    for eid in (gang, single):
        seen = sum(spans[r.allocation_id] * r.slots for r in rows if r.experiment_id == eid)
        assert seen > 5  # a real run, long enough for 5% to mean something
        print(f"experiment {eid}: accounted {accounted[eid]:.2f} slot-s, agents saw {seen:.2f}")
        assert accounted[eid] == pytest.approx(seen, rel=0.05), (eid, accounted[eid], seen)
    by_agent = cluster.json("usage", "--by", "agent", "--since", SINCE)
    assert {g["key"] for g in by_agent["groups"]} == {r.agent_id for r in rows}
    # The CSV and the experiment's own describe agree with the report.
    csv = cluster.cli("usage", "--by", "experiment", "--since", SINCE, "--csv")
    assert csv.returncode == 0, csv.stderr
    assert csv.stdout.splitlines()[0] == "experiment,name,slot_hours,slot_seconds"
    described = cluster.json("experiment", "describe", str(gang))
    assert described["slot_hours"] * 3600 == pytest.approx(accounted[gang], abs=0.01)


def test_an_agent_killed_mid_trial_leaves_no_record_open(
    three_agents: Cluster, tmp_path: Path
) -> None:
    cluster = three_agents
    eid = _create(cluster, tmp_path, "long", batches=5000, sleep_s=0.05)

    def running() -> list[Any]:
        return [r for r in _rows(cluster) if r.experiment_id == eid and r.ended_at is None]

    _eventually(lambda: bool(running()), 60, cluster, "the trial's allocation")
    [row] = running()
    # Counted while it runs: an open record counts up to now.
    time.sleep(2)
    live = cluster.json("usage", "--by", "experiment", "--since", SINCE)["groups"]
    assert any(int(g["key"]) == eid and g["slot_seconds"] > 0 for g in live)
    victim = 1 + int(row.agent_id.removeprefix("agent"))
    killed = dt.datetime.now(dt.UTC)
    cluster.procs[victim].send_signal(signal.SIGKILL)
    cluster.procs[victim].wait()

    def closed() -> bool:
        [again] = [r for r in _rows(cluster) if r.allocation_id == row.allocation_id]
        return again.ended_at is not None

    _eventually(closed, 60, cluster, "the lost agent's record closed")
    [ended] = [r for r in _rows(cluster) if r.allocation_id == row.allocation_id]
    end = ended.ended_at.replace(tzinfo=dt.UTC)
    # Closed when the master learned the agent was gone: after the kill, within the
    # reconnect wait and a few heartbeats.
    assert killed <= end <= killed + dt.timedelta(seconds=20), (killed, end)
    # The trial moves on to another agent; killing the experiment ends that run too.
    done = cluster.cli("experiment", "kill", str(eid))
    assert done.returncode == 0, done.stderr
    _eventually(lambda: _state(cluster, eid) in ("CANCELED", "ERROR"), 60, cluster, "the kill")
    _eventually(
        lambda: all(r.ended_at is not None for r in _rows(cluster)), 30, cluster, "no open record"
    )


def test_a_run_readopted_after_a_master_restart_keeps_one_record(
    three_agents: Cluster, tmp_path: Path
) -> None:
    cluster = three_agents
    eid = _create(cluster, tmp_path, "restart", batches=300, sleep_s=0.04)

    def open_rows() -> list[Any]:
        return [r for r in _rows(cluster) if r.experiment_id == eid and r.ended_at is None]

    _eventually(lambda: bool(open_rows()), 60, cluster, "the trial's allocation")
    [row] = open_rows()
    time.sleep(2)
    cluster.procs[0].send_signal(signal.SIGKILL)
    cluster.procs[0].wait()
    # Longer than an agent's reconnect delay, so that the run is re-adopted (test_faults).
    cluster.env["ASSAY_AGENT_RECONNECT_WAIT_S"] = "15"
    cluster.restart_master()

    def completed() -> bool:
        try:
            return _completed(cluster, eid)
        except AssertionError:
            return False  # the master is starting

    _eventually(completed, 120, cluster, "the end after the restart")
    rows = [r for r in _rows(cluster) if r.experiment_id == eid]
    # Re-adopted: the same allocation, one record, open across the restart, closed at its end.
    assert [(r.allocation_id, r.agent_id) for r in rows] == [(row.allocation_id, row.agent_id)]
    assert rows[0].ended_at is not None
    seen = _agent_spans(cluster)[row.allocation_id]
    report = cluster.json("usage", "--by", "experiment", "--since", SINCE)["groups"]
    [accounted] = [g["slot_seconds"] for g in report if int(g["key"]) == eid]
    print(f"experiment {eid}, master restarted: accounted {accounted:.2f} s, agent saw {seen:.2f}")
    assert accounted == pytest.approx(seen, rel=0.05)
