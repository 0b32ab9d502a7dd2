"""Password guessing that is fair to colleagues behind one address and bounded across
many addresses, and HTTP connections that cannot be held open for nothing (a real
`assay-master` process; the loopback network gives every 127.x.y.z as a source)."""

from __future__ import annotations

import http.client
import itertools
import json
import socket
import statistics
import threading
import time
from collections.abc import Iterator

import grpc
import pytest
from aiohttp.test_utils import make_mocked_request

from assay.master.api._http import _logged_path
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


# Failed logins a minute, cluster-wide, past which logins from new addresses are paced
# (login_failures_per_minute; 30 by default).
SPRAY_LIMIT = 10


@pytest.fixture(scope="module")
def spray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_cluster(
        tmp_path_factory.mktemp("spray"),
        None,
        agents=0,
        slots=1,
        master_env={"ASSAY_LOGIN_FAILURES_PER_MINUTE": str(SPRAY_LIMIT)},
    )
    try:
        with grpc.insecure_channel(c.address) as channel:
            api = api_pb2_grpc.ApiStub(channel)
            admin = (("authorization", f"Bearer {login(c.address)}"),)
            request = api_pb2.CreateUserRequest(username="alice", password=PASSWORDS["alice"])
            api.CreateUser(request, metadata=admin, timeout=30)
        yield c
    finally:
        stop_cluster(c)


def _spray(cluster: Cluster, seconds: float, threads: int) -> dict[int, int]:
    """One guess at each of many user names, each from a new address, from `threads`
    threads for `seconds`; how many answers of each status came back."""
    counts: dict[int, int] = {}
    lock = threading.Lock()
    guesses = itertools.count()
    stop = time.monotonic() + seconds

    def sprayer() -> None:
        while time.monotonic() < stop:
            n = next(guesses)
            source = f"127.{n // 62500 + 1}.{n // 250 % 250 + 1}.{n % 250 + 2}"
            status = _login(cluster, f"user{n}", "Winter2024!", source)
            with lock:
                counts[status] = counts.get(status, 0) + 1

    workers = [threading.Thread(target=sprayer) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return counts


@pytest.mark.slow
def test_a_spray_is_slowed_and_its_owner_is_not(spray_cluster: Cluster) -> None:
    cluster = spray_cluster
    assert _login(cluster, "alice", PASSWORDS["alice"], "127.0.0.1") == 200  # her machine
    spray = threading.Thread(target=lambda: answers.update(_spray(cluster, 20, 8)))
    answers: dict[int, int] = {}
    spray.start()
    latencies = []
    time.sleep(3)  # past the limit by now
    while spray.is_alive():
        started = time.monotonic()
        assert _login(cluster, "alice", PASSWORDS["alice"], "127.0.0.1") == 200
        latencies.append(time.monotonic() - started)
        time.sleep(1)
    # 10 go at full speed, then one every 0.5, 1, 2, 4, 8, 8... s (~150 in 20 s before).
    assert answers.get(401, 0) <= SPRAY_LIMIT + 8, answers
    assert set(answers) <= {401, 429}
    # Alice at her own address never waits a turn; from a new one she waits hers.
    assert statistics.median(latencies) < 2.0, latencies
    started = time.monotonic()
    while (status := _login(cluster, "alice", PASSWORDS["alice"], "127.9.9.9")) == 429:
        assert time.monotonic() - started < 60, "a new address stayed refused"
        time.sleep(1)
    assert status == 200


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
