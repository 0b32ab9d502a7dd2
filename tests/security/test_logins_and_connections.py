"""Password guessing that is fair to colleagues behind one address and bounded across
many addresses, and HTTP connections that cannot be held open for nothing (a real
`assay-master` process; the loopback network gives every 127.x.y.z as a source)."""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator

import grpc
import pytest
from aiohttp.test_utils import make_mocked_request

from assay.master._http import _logged_path
from assay.proto import api_pb2, api_pb2_grpc
from tests.credentials import login
from tests.e2e.conftest import Cluster, start_cluster, stop_cluster

PASSWORDS = {"alice": "alice-pass-1234", "bob": "bob-pass-12345", "carol": "carol-pass-1234"}


# The master's http_idle_timeout_s here (30 s by default): short, so the test waits little.
IDLE_TIMEOUT_S = 3.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_cluster(
        tmp_path_factory.mktemp("logins"),
        None,
        agents=0,
        slots=1,
        master_env={"ASSAY_HTTP_IDLE_TIMEOUT_S": str(IDLE_TIMEOUT_S)},
    )
    try:
        with grpc.insecure_channel(c.address) as channel:
            api = api_pb2_grpc.ApiStub(channel)
            admin = (("authorization", f"Bearer {login(c.address)}"),)
            for name, password in PASSWORDS.items():
                request = api_pb2.CreateUserRequest(username=name, password=password)
                api.CreateUser(request, metadata=admin, timeout=30)
        yield c
    finally:
        stop_cluster(c)


def _login(cluster: Cluster, username: str, password: str, source: str = "127.0.0.1") -> int:
    """The HTTP status of a login sent from `source`."""
    connection = http.client.HTTPConnection(
        "127.0.0.1", cluster.http_port, timeout=30, source_address=(source, 0)
    )
    try:
        body = json.dumps({"username": username, "password": password})
        connection.request("POST", "/api/v1/login", body, {"Content-Type": "application/json"})
        return connection.getresponse().status
    finally:
        connection.close()


def test_five_typos_behind_one_address_lock_out_no_colleague(cluster: Cluster) -> None:
    for _ in range(5):
        assert _login(cluster, "bob", "wrong password", "127.0.0.20") == 401
    assert _login(cluster, "bob", PASSWORDS["bob"], "127.0.0.20") == 429  # bob waits
    # alice sits behind the same address (an office NAT): she is not locked out.
    assert _login(cluster, "alice", PASSWORDS["alice"], "127.0.0.20") == 200


def test_guesses_spread_over_many_addresses_are_bounded(cluster: Cluster) -> None:
    assert _login(cluster, "carol", PASSWORDS["carol"], "127.0.0.1") == 200  # her machine
    answers = [
        _login(cluster, "carol", "wrong password", f"127.0.{n // 250 + 1}.{n % 250 + 2}")
        for n in range(60)
    ]
    assert answers.count(401) == 20  # each address guessed once: 20, then all refused
    assert set(answers) == {401, 429}
    assert _login(cluster, "carol", PASSWORDS["carol"], "127.0.0.1") == 200  # still in


def test_idle_and_slow_header_connections_are_closed(cluster: Cluster) -> None:
    idle = [socket.create_connection(("127.0.0.1", cluster.http_port)) for _ in range(20)]
    slow = [socket.create_connection(("127.0.0.1", cluster.http_port)) for _ in range(20)]
    for s in slow:
        s.sendall(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\n")  # never finished
    # Less than the 30 s default: a master that ignored http_idle_timeout_s would fail.
    deadline = time.monotonic() + IDLE_TIMEOUT_S + 15
    open_ones = idle + slow
    try:
        for s in open_ones:
            s.settimeout(max(0.1, deadline - time.monotonic()))
            assert s.recv(1024) == b"", "the master kept an idle connection open"
    finally:
        for s in open_ones:
            s.close()
    # A real request on a fresh connection is still answered.
    connection = http.client.HTTPConnection("127.0.0.1", cluster.http_port, timeout=30)
    connection.request("GET", "/api/v1/health")
    assert connection.getresponse().status == 200
    connection.close()


def test_credentials_in_a_query_string_are_not_logged() -> None:
    request = make_mocked_request("GET", "/api/v1/experiments?limit=5&token=s3cr3t&Api_Key=k")
    logged = _logged_path(request)
    assert "s3cr3t" not in logged
    assert "=k" not in logged
    assert logged.startswith("/api/v1/experiments?limit=5&token=")
