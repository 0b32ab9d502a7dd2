"""Routes whose request comes from a JSON body, routes that set a field themselves, the
queue and the experiment's metric names."""

from __future__ import annotations

import base64
import json
import socket

import pytest

from assay.master.api import ROUTES
from tests.http.conftest import Site, World, wait_for
from tests.master.conftest import ScriptedAgent, experiment_yaml, model_archive

JSON = {"Content-Type": "application/json"}


def _body(**fields: object) -> bytes:
    return json.dumps(fields).encode()


def test_an_experiment_is_created_from_a_json_body(site: Site) -> None:
    body = _body(
        config_yaml=experiment_yaml(name="from-http", labels=["ui"]),
        model_definition=base64.b64encode(model_archive()).decode(),
        activate=False,
    )
    reply = site.post("/api/v1/experiments", body, JSON)
    assert reply.status == 200, reply.body
    created = reply.json()["experiment"]
    stored = site.master.store.get_experiment(int(created["id"]))
    assert (stored.name, stored.state, stored.labels) == ("from-http", "PAUSED", ("ui",))
    # lowerCamel names are the message's JSON names too.
    camel = _body(
        configYaml=experiment_yaml(),
        modelDefinition=base64.b64encode(model_archive()).decode(),
    )
    assert site.post("/api/v1/experiments", camel, JSON).status == 200


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"{not json", "must be a JSON object"),
        (b"[1, 2]", "must be a JSON object, got list"),
        (b'"text"', "must be a JSON object, got str"),
        (b"\xff\xfe", "must be a JSON object"),
        (_body(config_yaml="name: x", shape="round"), "unknown field of the body"),
        (_body(config_yaml=7), "config_yaml"),
        (_body(config_yaml="a", model_definition="***not base64***"), "model_definition"),
        (_body(config_yaml="a", activate="yes"), "activate"),
        (_body(config_yaml="name: x\x00"), "NUL"),
        (_body(config_yaml="searcher: [unclosed"), "not valid YAML"),
        (_body(config_yaml=experiment_yaml(), model_definition=""), "model"),
    ],
)
def test_a_bad_body_is_400_and_stores_nothing(site: Site, body: bytes, says: str) -> None:
    before = site.master.store.list_experiments().total
    reply = site.post("/api/v1/experiments", body, JSON)
    assert reply.status == 400, reply.body
    assert says in reply.json()["error"]
    assert site.master.store.list_experiments().total == before


def test_a_body_route_takes_no_query_parameters(site: Site) -> None:
    reply = site.post("/api/v1/checkpoints/delete?uuids=abc", _body(uuids=[]), JSON)
    assert reply.status == 400
    assert "unknown parameter" in reply.json()["error"]


def test_a_post_from_another_site_creates_nothing(site: Site) -> None:
    body = _body(
        config_yaml=experiment_yaml(),
        model_definition=base64.b64encode(model_archive()).decode(),
    )
    reply = site.post("/api/v1/experiments", body, {**JSON, "Origin": "http://evil.example"})
    assert reply.status == 403
    assert site.master.store.list_experiments().total == 0


def _raw_post(site: Site, path: str, headers: str, body: bytes = b"") -> bytes:
    """Send a request by hand (a declared length the body never reaches) and read what
    comes back before the body is sent."""
    with socket.create_connection(("127.0.0.1", site.server.port), timeout=10) as sock:
        auth = f"Authorization: Bearer {site.token}\r\n"
        head = f"POST {path} HTTP/1.1\r\nHost: x\r\n{auth}{headers}\r\n"
        sock.sendall(head.encode() + body)
        return sock.recv(65536)


def test_a_body_over_the_routes_limit_is_refused_before_it_is_read(site: Site) -> None:
    limit = next(r.max_body for r in ROUTES if r.rpc == "DeleteCheckpoints")
    # Only the headers are sent: the answer comes without waiting for the 8 MiB.
    answer = _raw_post(site, "/api/v1/checkpoints/delete", f"Content-Length: {8 * limit}\r\n")
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert f"over {limit} bytes".encode() in answer
    # Chunked (no declared length): refused once the limit is passed.
    chunk = b"x" * (limit + 10)
    body = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n0\r\n\r\n"
    answer = _raw_post(site, "/api/v1/checkpoints/delete", "Transfer-Encoding: chunked\r\n", body)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    # The create route takes a model definition's worth.
    create = next(r.max_body for r in ROUTES if r.rpc == "CreateExperiment")
    assert create > 96 * 2**20


def test_checkpoints_are_deleted_by_a_json_body(world: World) -> None:
    site = world.site
    unknown = "00000000-0000-0000-0000-000000000000"
    reply = site.post("/api/v1/checkpoints/delete", _body(uuids=[unknown]), JSON)
    assert reply.status == 404, reply.body
    assert unknown in reply.json()["error"]
    # The experiment has ended, so its oldest checkpoint can go.
    first = world.checkpoints[0]
    reply = site.post("/api/v1/checkpoints/delete", _body(uuids=[first]), JSON)
    assert reply.status == 200, reply.body
    assert reply.json()["deleted"] == [first]
    got = site.get(f"/api/v1/checkpoints/{first}").json()
    assert got["state"] == "CHECKPOINT_STATE_DELETED"


def test_agents_are_disabled_and_enabled(site: Site) -> None:
    agent = ScriptedAgent(site.master.port, "agent-9", slots=2)
    try:
        off = site.post("/api/v1/agents/agent-9/disable")
        assert off.status == 200, off.body
        assert off.json()["enabled"] is False
        [listed] = site.get("/api/v1/agents").json()["agents"]
        assert listed["enabled"] is False
        # The route sets `enabled`: the query string may not.
        sneaky = site.post("/api/v1/agents/agent-9/disable?enabled=true")
        assert sneaky.status == 400
        assert site.post("/api/v1/agents/agent-9/enable").json()["enabled"] is True
        missing = site.post("/api/v1/agents/nobody/enable")
        assert missing.status == 404
        assert "nobody" in missing.json()["error"]
    finally:
        agent.close()


def test_the_queue_lists_waiting_trials_in_the_order_they_will_run(site: Site) -> None:
    low = site.create(name="low", resources={"priority": 60})
    high = site.create(name="high", resources={"priority": 10, "slots_per_trial": 2})
    later = site.create(name="later", resources={"priority": 60})
    queue = site.get("/api/v1/queue").json()["trials"]
    assert [q["experiment_id"] for q in queue] == [high, low, later]
    assert [q["experiment_name"] for q in queue] == ["high", "low", "later"]
    assert [q["priority"] for q in queue] == [10, 60, 60]
    assert [q["slots"] for q in queue] == [2, 1, 1]
    assert site.get("/api/v1/master").json()["queued_trials"] == 3
    site.post(f"/api/v1/experiments/{low}/pause")
    wait_for(lambda: len(site.get("/api/v1/queue").json()["trials"]) == 2)


def test_an_experiment_names_its_metrics(world: World) -> None:
    got = world.site.get(f"/api/v1/experiments/{world.experiment_id}").json()
    names = {(m["group"], m["name"]) for m in got["metric_names"]}
    assert ("validation", "loss") in names
    unstarted = world.site.get(f"/api/v1/experiments/{world.unstarted_id}").json()
    assert unstarted["metric_names"] == []
