"""No malformed request gets a 5xx: each is a 4xx with a JSON error naming the problem."""

from __future__ import annotations

import http.client

import pytest

from tests.http.conftest import World

E = "/api/v1/experiments"
BAD = [
    # path ids
    ("/api/v1/experiments/abc", "id"),
    ("/api/v1/experiments/-1", "id"),
    ("/api/v1/experiments/1.5", "id"),
    ("/api/v1/experiments/99999999999999999999", "id"),
    ("/api/v1/experiments/9223372036854775808", "id"),
    ("/api/v1/experiments/%20", "id"),
    ("/api/v1/experiments/1e3", "id"),
    ("/api/v1/experiments/0x10", "id"),
    ("/api/v1/experiments/%EF%BC%91", "id"),  # a full-width digit
    ("/api/v1/trials/abc", "id"),
    ("/api/v1/trials/-5/metrics", "id"),
    ("/api/v1/trials/x/logs", "trial_id"),
    ("/api/v1/experiments/x/metrics?name=loss", "id"),
    # list parameters
    (f"{E}?limit=abc", "limit"),
    (f"{E}?limit=-1", "limit"),
    (f"{E}?limit=", "limit"),
    (f"{E}?limit=2147483648", "limit"),
    (f"{E}?limit=1001", "limit"),
    (f"{E}?limit=0", None),  # 0 means the default: not an error
    (f"{E}?limit=1&limit=2", "limit"),
    (f"{E}?offset=-3", "offset"),
    (f"{E}?offset=1.0", "offset"),
    (f"{E}?offset=%00", "offset"),
    (f"{E}?states=bogus", "states"),
    (f"{E}?states=", "states"),
    (f"{E}?states=active&states=nope", "states"),
    (f"{E}?states=0", "states"),
    (f"{E}?states=EXPERIMENT_STATE_UNSPECIFIED", "states"),
    (f"{E}?ascending=maybe", "ascending"),
    (f"{E}?ascending=", "ascending"),
    (f"{E}?archived=2", "archived"),
    (f"{E}?archived=yes", "archived"),
    (f"{E}?sort_by=password", "sort by"),
    (f"{E}?sort_by=id;drop%20table%20experiments", "sort by"),
    (f"{E}?name=%00", "name"),
    (f"{E}?name=a&name=b", "name"),
    (f"{E}?state=active", "state"),
    (f"{E}?sort=id", "sort"),
    (f"{E}?=x", "''"),
    (f"{E}?%FF=1", "parameter"),
    (f"{E}?limit=%FF", "limit"),
    (f"{E}?limit=%E2%80%8B5", "limit"),
    (f"{E}?limit=+5", "limit"),
    (f"{E}?limit=5%20", "limit"),
    # metrics
    ("/api/v1/experiments/1/metrics?max_points=1", "max_points"),
    ("/api/v1/experiments/1/metrics?max_points=100001", "max_points"),
    ("/api/v1/experiments/1/metrics?max_points=x", "max_points"),
    ("/api/v1/experiments/1/metrics?group=%00", "group"),
    ("/api/v1/trials/1/metrics?max_points=-1", "max_points"),
    ("/api/v1/trials/1/metrics?max_points=1", "max_points"),
    ("/api/v1/trials/1/metrics?name=loss", "name"),
    # logs
    ("/api/v1/trials/1/logs?after_id=-1", "after_id"),
    ("/api/v1/trials/1/logs?after_id=18446744073709551616", "after_id"),
    ("/api/v1/trials/1/logs?tail=abc", "tail"),
    ("/api/v1/trials/1/logs?tail=2147483648", "tail"),
    ("/api/v1/trials/1/logs?follow=sure", "follow"),
    ("/api/v1/trials/1/logs?follow=true&follow=false", "follow"),
    ("/api/v1/trials/1/logs?level=ERROR", "level"),
    # checkpoints
    ("/api/v1/checkpoints?experiment_id=abc", "experiment_id"),
    ("/api/v1/checkpoints?trial_id=-1", "trial_id"),
    ("/api/v1/checkpoints?uuid=x", "uuid"),
    # routes without parameters
    ("/api/v1/agents?verbose=1", "verbose"),
    ("/api/v1/master?x=1", "x"),
]


@pytest.mark.parametrize(("path", "names"), BAD)
def test_bad_input_is_a_4xx_naming_the_parameter(
    world: World, path: str, names: str | None
) -> None:
    path = path.replace("/1/", f"/{world.trial_id}/", 1) if "/trials/1/" in path else path
    reply = world.site.get(path)
    if names is None:
        assert reply.status == 200, reply.body
        return
    assert 400 <= reply.status < 500, (path, reply.status, reply.body)
    assert reply.status in (400, 404), (path, reply.status)
    error = reply.json()["error"]
    assert names in error, (path, error)


@pytest.mark.parametrize(
    "raw",
    [
        "GET /api/v1/experiments/%zz HTTP/1.1",
        "GET /api/v1/experiments?limit=%zz HTTP/1.1",
        "GET /api/v1/experiments?%%%%=1 HTTP/1.1",
        "GET /api/v1/../../etc/passwd HTTP/1.1",
        "GET //api//v1//experiments HTTP/1.1",
        "GET /api/v1/experiments/1/metrics?name=%ff%fe HTTP/1.1",
    ],
)
def test_raw_malformed_urls_are_never_5xx(world: World, raw: str) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", world.site.server.port, timeout=10)
    try:
        connection.sock = None
        connection.connect()
        assert connection.sock is not None
        connection.sock.sendall(raw.encode() + b"\r\nHost: localhost\r\n\r\n")
        status_line = connection.sock.makefile("rb").readline().decode()
    finally:
        connection.close()
    status = int(status_line.split()[1])
    assert status < 500, (raw, status_line)
