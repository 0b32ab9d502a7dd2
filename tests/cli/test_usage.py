"""`assay usage`: the request it sends, its table, JSON and CSV, and bad dates."""

from __future__ import annotations

import json

import grpc

from assay.proto import api_pb2

from .conftest import FakeApi, assert_ok, assert_one_line_error, run_cli


def _report(by: str = "user", admin: bool = True) -> api_pb2.GetUsageResponse:
    response = api_pb2.GetUsageResponse(by=by, all_users=admin)
    response.since.FromJsonString("2026-11-01T00:00:00Z")
    response.until.FromJsonString("2026-12-01T00:00:00Z")
    response.groups.extend(
        [
            api_pb2.UsageGroup(key="alice", name="alice", slot_seconds=7200, slot_hours=2),
            api_pb2.UsageGroup(key="bob", name="bob", slot_seconds=1800, slot_hours=0.5),
        ]
    )
    if admin:
        response.pools.append(
            api_pb2.PoolUsage(
                pool="default",
                used_slot_seconds=9000,
                capacity_slot_seconds=36000,
                used_ratio=0.25,
                idle_ratio=0.75,
            )
        )
    return response


def test_usage_sends_the_window_and_prints_slot_hours(master: FakeApi) -> None:
    master.responses["GetUsage"] = _report()

    done = run_cli("usage", "--since", "2026-11-01", "--until", "2026-12-01", master=master)

    assert_ok(done)
    [request] = master.calls("GetUsage")
    assert (request.by, request.since, request.until) == ("user", "2026-11-01", "2026-12-01")
    lines = done.stdout.splitlines()
    assert lines[0] == "slot-hours from 2026-11-01T00:00:00Z to 2026-12-01T00:00:00Z"
    assert lines[1].split() == ["USER", "SLOT-HOURS", "SHARE"]
    assert lines[2].split()[:2] == ["alice", "2.00"]
    assert lines[2].split()[2] == "80%"
    assert "pool default: 2.50 of 10.00 slot-hours used (25% used, 75% idle" in done.stdout


def test_usage_json_and_csv(master: FakeApi) -> None:
    master.responses["GetUsage"] = _report("experiment", admin=False)

    as_json = run_cli("usage", "--by", "experiment", "--json", master=master)
    as_csv = run_cli("usage", "--by", "experiment", "--csv", master=master)

    assert_ok(as_json)
    report = json.loads(as_json.stdout.strip().splitlines()[-1])
    assert report["all_users"] is False
    assert report["pools"] == []
    assert [(g["key"], g["slot_hours"]) for g in report["groups"]] == [("alice", 2), ("bob", 0.5)]
    assert_ok(as_csv)
    assert as_csv.stdout.splitlines() == [
        "experiment,name,slot_hours,slot_seconds",
        "alice,alice,2.0,7200.0",
        "bob,bob,0.5,1800.0",
    ]
    # No --since/--until: the master picks the window.
    assert [(r.since, r.until) for r in master.calls("GetUsage")] == [("", "")] * 2


def test_a_bad_date_is_one_clear_message_and_no_call(master: FakeApi) -> None:
    for option, value in [("--since", "2026-13-01"), ("--until", "last week")]:
        done = run_cli("usage", option, value, master=master)
        assert_one_line_error(done, f"{value!r} is not a date", option, "YYYY-MM-DD")
    assert master.calls("GetUsage") == []


def test_what_the_master_refuses_is_one_line(master: FakeApi) -> None:
    master.errors["GetUsage"] = (
        grpc.StatusCode.INVALID_ARGUMENT,
        "until (2026-11-01T00:00:00+00:00) must be after since (2026-12-01T00:00:00+00:00)",
    )
    done = run_cli("usage", "--since", "2026-12-01", "--until", "2026-11-01", master=master)
    assert_one_line_error(done, "must be after since")
