"""Usage is a tenant's own: a regular user's report, over gRPC and HTTP, counts their own
allocations only, and an experiment's slot-hours are told to its owner and admins only.
The master enforces it; the CLI only passes the request on."""

from __future__ import annotations

import datetime as dt
import json
import urllib.parse
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from assay.master.store import UsagePart, WriteBatch
from assay.proto import api_pb2, api_pb2_grpc
from tests.credentials import authed_api, login
from tests.http.conftest import Site, open_site
from tests.master.conftest import experiment_yaml, model_archive

START = dt.datetime.now(dt.UTC) - dt.timedelta(hours=3)


def _experiment(site: Site, username: str) -> int:
    address = f"127.0.0.1:{site.master.port}"
    api, channel = authed_api(address, login(address, username, f"{username}-password-1"))
    try:
        request = api_pb2.CreateExperimentRequest(
            config_yaml=experiment_yaml(name=f"{username}-exp"),
            model_definition=model_archive(),
            activate=False,
        )
        eid: int = api.CreateExperiment(request).experiment.id
        return eid
    finally:
        channel.close()


def _used(site: Site, experiment_id: int, allocation_id: str, slots: int, hours: int) -> None:
    """An allocation of `slots` slots that ran for `hours` hours, through the write path."""
    batch = WriteBatch()
    batch.usage_started(
        allocation_id,
        experiment_id=experiment_id,
        trial_id=0,
        run_id=1,
        parts=[UsagePart("agent-1", slots, "cpu", "default")],
        now=START,
    )
    batch.usage_ended(allocation_id, START + dt.timedelta(hours=hours))
    site.master.store.apply(batch)


@pytest.fixture(scope="module")
def tenants(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Site, int, int]]:
    site = open_site(tmp_path_factory.mktemp("usage") / "master")
    for name in ("bob", "carol"):
        site.master.auth.create_user(name, f"{name}-password-1")
    bob, carol = _experiment(site, "bob"), _experiment(site, "carol")
    _used(site, bob, "b.1", slots=1, hours=1)
    _used(site, carol, "c.1", slots=2, hours=2)
    yield site, bob, carol
    site.close()


def _as(site: Site, username: str) -> tuple[api_pb2_grpc.ApiStub, grpc.Channel]:
    address = f"127.0.0.1:{site.master.port}"
    return authed_api(address, login(address, username, f"{username}-password-1"))


def _http(site: Site, username: str, **query: str) -> tuple[int, dict[str, Any]]:
    token = login(f"127.0.0.1:{site.master.port}", username, f"{username}-password-1")
    reply = site.get(
        "/api/v1/usage?" + urllib.parse.urlencode(query),
        headers={"Authorization": f"Bearer {token}"},
        auth=False,
    )
    return reply.status, json.loads(reply.body)


def test_a_user_sees_only_their_own_usage(tenants: tuple[Site, int, int]) -> None:
    site, bob_exp, carol_exp = tenants
    api, channel = _as(site, "bob")
    try:
        for by in ("user", "experiment", "pool", "agent", "day"):
            report = api.GetUsage(api_pb2.GetUsageRequest(by=by))
            assert not report.all_users
            assert list(report.pools) == []  # the cluster's totals are the admins'
            assert sum(g.slot_seconds for g in report.groups) == pytest.approx(3600.0), by
        by_user = api.GetUsage(api_pb2.GetUsageRequest(by="user"))
        assert [g.key for g in by_user.groups] == ["bob"]
        own = api.GetExperiment(api_pb2.GetExperimentRequest(id=bob_exp))
        other = api.GetExperiment(api_pb2.GetExperimentRequest(id=carol_exp))
        assert own.slot_seconds == pytest.approx(3600.0)
        assert other.slot_seconds == 0.0
    finally:
        channel.close()
    status, body = _http(site, "carol", by="experiment")
    assert status == 200
    assert [(g["key"], g["slot_seconds"]) for g in body["groups"]] == [(str(carol_exp), 14400.0)]
    assert body["all_users"] is False


def test_an_admin_sees_everyone_and_the_pools(tenants: tuple[Site, int, int]) -> None:
    site, _, _ = tenants
    report = site.api.GetUsage(api_pb2.GetUsageRequest(by="user"))
    assert report.all_users
    assert [(g.key, g.slot_seconds) for g in report.groups] == [
        ("carol", 14400.0),
        ("bob", 3600.0),
    ]
    assert [p.pool for p in report.pools] == ["default"]


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"since": "2026-02-30"}, "since '2026-02-30' is not a date"),
        ({"until": "yesterday"}, "until 'yesterday' is not a date"),
        ({"since": "2026-12-01", "until": "2026-11-01"}, "must be after since"),
        ({"since": "1900-01-01", "until": "2026-01-01"}, "longer than"),
        ({"by": "team"}, "cannot group usage by 'team'"),
    ],
)
def test_bad_requests_are_refused_with_what_to_fix(
    tenants: tuple[Site, int, int], query: dict[str, str], message: str
) -> None:
    site, _, _ = tenants
    status, body = _http(site, "bob", **query)
    assert status == 400, body
    assert message in json.dumps(body), body
    with pytest.raises(grpc.RpcError) as caught:
        site.api.GetUsage(
            api_pb2.GetUsageRequest(
                by=query.get("by", ""), since=query.get("since", ""), until=query.get("until", "")
            )
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in (caught.value.details() or "")
