"""An allocation's network namespace: only its own loopback, and the relay to the master.

Real namespaces (the agent runs as root); a child process joins one by its descriptor,
as the ranks' exec wrapper does."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from assay.agent import Agent, AgentSettings
from assay.agent._allocation import Allocation, AllocationError
from assay.agent._netns import LoopbackNetwork, _address_kind, _host_of, outlet_of_url
from assay.common.tls import ClientTls
from assay.errors import PERMANENT_ERROR_EXIT_CODE
from assay.proto import agent_pb2
from tests.agent.conftest import start_message

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not sys.platform.startswith("linux"),
    reason="network namespaces need root on Linux",
)

# Run inside the namespace: what it can reach, as JSON.
PROBE = """
import ctypes, json, socket, sys
fd, secret, relay = (int(a) for a in sys.argv[1:4])
assert ctypes.CDLL(None, use_errno=True).setns(fd, 0x40000000) == 0
found = {}
try:
    socket.create_connection(("127.0.0.1", secret), timeout=5).close()
    found["secret"] = "reached"
except OSError as e:
    found["secret"] = type(e).__name__
with socket.create_connection(("127.0.0.1", relay), timeout=5) as s:
    s.sendall(b"ping")
    s.shutdown(socket.SHUT_WR)
    found["relay"] = s.recv(100).decode()
own = socket.socket()
own.bind(("127.0.0.1", 0))
own.listen()
socket.create_connection(own.getsockname(), timeout=5).close()
found["own_loopback"] = "ok"
found["interfaces"] = [l.split(":")[0].strip() for l in open("/proc/net/dev") if ":" in l]
print(json.dumps(found))
"""


@pytest.fixture
def echo_server() -> Iterator[int]:
    """A service on the agent's loopback: answers 'echo:' and what it was sent."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                data = b""
                while chunk := conn.recv(100):
                    data += chunk
                conn.sendall(b"echo:" + data)

    threading.Thread(target=serve, daemon=True).start()
    yield int(server.getsockname()[1])
    server.close()


def _probe(network: LoopbackNetwork, secret: int) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(network.fd), str(secret), str(network.port)],
        pass_fds=(network.fd,),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_inside_only_its_own_loopback_answers_and_the_relay_reaches_the_master(
    echo_server: int,
) -> None:
    # The relay's target stands for the master; the same service, reached directly on
    # 127.0.0.1, stands for anything else on the agent's loopback.
    network = LoopbackNetwork(("127.0.0.1", echo_server), name="test")
    try:
        found = _probe(network, echo_server)
    finally:
        network.close()
    assert found["secret"] == "ConnectionRefusedError"
    assert found["relay"] == "echo:ping"
    assert found["own_loopback"] == "ok"
    assert found["interfaces"] == ["lo"]
    assert network.trial_api == f"127.0.0.1:{network.port}"


def test_two_allocations_do_not_see_each_others_ports(echo_server: int) -> None:
    first = LoopbackNetwork(("127.0.0.1", echo_server), name="first")
    second = LoopbackNetwork(("127.0.0.1", echo_server), name="second")
    try:
        # The first's relay port, tried from inside the second: nothing listens there.
        found = _probe(second, first.port)
    finally:
        first.close()
        second.close()
    assert found["secret"] == "ConnectionRefusedError"
    assert found["relay"] == "echo:ping"


def test_the_agent_thread_that_made_it_stays_in_the_agents_namespace(echo_server: int) -> None:
    before = os.readlink("/proc/thread-self/ns/net")
    network = LoopbackNetwork(("127.0.0.1", echo_server), name="test")
    try:
        assert os.readlink("/proc/thread-self/ns/net") == before
        assert os.readlink(f"/proc/self/fd/{network.fd}") != before
    finally:
        network.close()


def test_close_ends_the_relay_and_every_connection_through_it(echo_server: int) -> None:
    network = LoopbackNetwork(("127.0.0.1", echo_server), name="test")
    probe = """
import ctypes, socket, sys, time
fd, relay = int(sys.argv[1]), int(sys.argv[2])
assert ctypes.CDLL(None, use_errno=True).setns(fd, 0x40000000) == 0
s = socket.create_connection(("127.0.0.1", relay), timeout=30)
print("connected", flush=True)
try:
    data = s.recv(100)
except ConnectionResetError:  # closed before the relay took it up
    data = b""
print("ended" if data == b"" else "data", flush=True)
"""
    child = subprocess.Popen(
        [sys.executable, "-c", probe, str(network.fd), str(network.port)],
        pass_fds=(network.fd,),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "connected"
    network.close()
    assert child.stdout.readline().strip() == "ended"
    assert child.wait(timeout=30) == 0
    network.close()  # a second close does nothing


PROXY_PROBE = """
import ctypes, json, sys, urllib.error, urllib.request
fd, proxy, allowed, other = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
assert ctypes.CDLL(None, use_errno=True).setns(int(fd), 0x40000000) == 0
opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy}))
found = {}
for name, url in (("allowed", allowed), ("other", other)):
    try:
        found[name] = opener.open(url, timeout=10).read().decode()
    except urllib.error.HTTPError as e:
        found[name] = f"{e.code} {e.read().decode().strip()}"
print(json.dumps(found))
"""


@pytest.fixture
def web_server() -> Iterator[int]:
    """An HTTP server on the agent's loopback that says which path it was asked for."""
    import http.server

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = f"got {self.path} for {self.headers['Host']}".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


def test_the_proxy_reaches_the_outlets_and_nothing_else(echo_server: int, web_server: int) -> None:
    outlet = outlet_of_url(f"http://127.0.0.1:{web_server}")
    network = LoopbackNetwork(("127.0.0.1", echo_server), [outlet], name="test")
    try:
        assert network.proxy is not None
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                PROXY_PROBE,
                str(network.fd),
                network.proxy,
                f"http://127.0.0.1:{web_server}/bucket/key?x=1",
                f"http://127.0.0.1:{echo_server}/",  # on the agent's loopback, not an outlet
            ],
            pass_fds=(network.fd,),
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
    finally:
        network.close()
    found = json.loads(done.stdout)
    assert found["allowed"] == f"got /bucket/key?x=1 for 127.0.0.1:{web_server}"
    assert found["other"].startswith("403 assay: 127.0.0.1:")
    assert "outside this trial's network" in found["other"]


def test_an_outlet_admits_its_host_its_subdomains_and_its_port_only() -> None:
    aws = outlet_of_url(None)
    assert aws.admits("my-bucket.s3.us-east-1.amazonaws.com", 443)
    assert aws.admits("s3-us-west-2.amazonaws.com", 443)
    assert not aws.admits("ec2.us-east-1.amazonaws.com", 443)  # AWS, but not S3
    assert not aws.admits("amazonaws.com.evil.example", 443)
    assert not aws.admits("s3.amazonaws.com", 80)
    assert aws.networks() == {"global"}
    minio = outlet_of_url("https://MinIO.lab.:9000")
    assert minio.admits("minio.lab", 9000)
    assert minio.admits("bucket.minio.lab", 9000)
    assert not minio.admits("minio.lab", 9001)
    assert not minio.admits("xminio.lab", 9000)
    assert outlet_of_url("http://10.0.0.5").port == 80
    local = outlet_of_url("http://127.0.0.1:9000")
    assert local.networks() == {"global", "loopback"}


@pytest.mark.parametrize(
    "host",
    [
        "169.254.169.254\x00.minio.lab",  # a resolver stops at the NUL
        "127.0.0.1 .minio.lab",
        "127.0.0.1%2e.minio.lab",
        "-x.minio.lab",
        "a..minio.lab",
        "",
    ],
)
def test_a_host_a_resolver_would_read_otherwise_is_refused(host: str) -> None:
    with pytest.raises(ValueError, match="not a host name"):
        _host_of(host)


def test_hosts_are_spelled_one_way() -> None:
    assert _host_of("Bucket.MinIO.lab.") == "bucket.minio.lab"
    assert _host_of("[::1]") == "::1"
    assert _host_of("127.0.0.1") == "127.0.0.1"
    assert [_address_kind(a) for a in ("127.0.0.1", "169.254.169.254", "10.1.2.3", "8.8.8.8")] == [
        "loopback",
        "link-local",
        "private",
        "global",
    ]


def test_past_its_connections_the_relay_closes_a_new_one_at_once(echo_server: int) -> None:
    network = LoopbackNetwork(("127.0.0.1", echo_server), name="test")
    probe = """
import ctypes, socket, sys
fd, relay, count = (int(a) for a in sys.argv[1:4])
assert ctypes.CDLL(None, use_errno=True).setns(fd, 0x40000000) == 0
held = [socket.create_connection(("127.0.0.1", relay), timeout=30) for _ in range(count)]
for s in held:  # each taken up: the relay answers what it was sent
    s.sendall(b"x")
extra = socket.create_connection(("127.0.0.1", relay), timeout=30)
try:
    print("closed" if extra.recv(1) == b"" else "open")
except (ConnectionResetError, TimeoutError) as e:
    print("closed" if isinstance(e, ConnectionResetError) else "open")
"""
    try:
        done = subprocess.run(
            [sys.executable, "-c", probe, str(network.fd), str(network.port), "64"],
            pass_fds=(network.fd,),
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
    finally:
        network.close()
    assert done.stdout.strip() == "closed"


def test_an_agent_that_does_not_isolate_trials_refuses_a_network_of_their_own(
    tmp_path: Path,
) -> None:
    settings = AgentSettings(
        master="127.0.0.1:1",
        slot_type="cpu",
        slots=1,
        work_dir=tmp_path,
        isolation="none",
        isolation_network="loopback",
    )
    with pytest.raises(ValueError, match="isolation_network: loopback runs each isolated trial"):
        Agent(settings, harness_command=[sys.executable, "-c", "pass"])


def test_a_trial_spanning_agents_is_refused_for_good_with_what_to_do(tmp_path: Path) -> None:
    start = start_message("spans", {}, slots=[0, 1], ranks=[0, 1], world_size=4).start
    sent: list[agent_pb2.AgentMessage] = []
    allocation = Allocation(
        start,
        sent.append,
        lambda _: None,
        work_dir=tmp_path,
        harness_command=[sys.executable, "-c", "pass"],
        slot_kind="cpu",
        address="127.0.0.1",
        tls=ClientTls(),
        grace=1.0,
        network="loopback",
    )
    with pytest.raises(AllocationError) as refused:
        allocation.launch()
    assert refused.value.codes == (PERMANENT_ERROR_EXIT_CODE,)
    assert "ranks span several agents" in str(refused.value)
    assert "resources.slots_per_trial" in str(refused.value)
    assert not (tmp_path / "allocations" / "spans").exists()
