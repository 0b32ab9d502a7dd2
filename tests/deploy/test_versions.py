"""Upgrades: the master refuses an agent of another major.minor version with a message that
says what to install, warns about a patch difference, and the agent stops instead of
retrying forever."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

import assay
from assay._rank_processes import free_port
from assay.agent._connection import Backoff, MasterConnection
from assay.agent._credential import CredentialFile
from assay.master._server import MasterServer
from assay.proto import agent_pb2, agent_pb2_grpc, common_pb2
from tests.credentials import ADMIN_PASSWORD, JOIN_METADATA, JOIN_TOKEN, master_config
from tests.deploy.conftest import wait_for_agents
from tests.e2e.conftest import stop_processes

MAJOR, MINOR = (int(p) for p in assay.__version__.split(".")[:2])
NEXT_MINOR = f"{MAJOR}.{MINOR + 1}.0"
REFUSAL = (
    f"agent version {NEXT_MINOR} is not compatible with master version {assay.__version__}: "
    f"install assay=={assay.__version__} on this agent"
)


@pytest.fixture
def master(tmp_path: Path) -> Iterator[MasterServer]:
    server = MasterServer(
        master_config(
            state_dir=tmp_path / "m",
        )
    )
    server.start()
    yield server
    server.stop(grace=0.5)


def _register(port: int, version: str) -> agent_pb2.MasterMessage:
    """Register one CPU slot under `version`; the master's first reply."""
    done = threading.Event()
    device = common_pb2.Device(index=0, type=common_pb2.SLOT_TYPE_CPU, name="cpu")

    def requests() -> Iterator[agent_pb2.AgentMessage]:
        yield agent_pb2.AgentMessage(
            register=agent_pb2.Register(
                agent_id="a1",
                version=version,
                slot_type=common_pb2.SLOT_TYPE_CPU,
                devices=[device],
                address="127.0.0.1",
            )
        )
        done.wait(10)

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        responses = agent_pb2_grpc.AgentServiceStub(channel).Connect(
            requests(), metadata=JOIN_METADATA
        )
        try:
            reply: agent_pb2.MasterMessage = next(responses)
            return reply
        finally:
            done.set()
            responses.cancel()


def test_another_minor_version_is_refused(master: MasterServer) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        _register(master.port, NEXT_MINOR)

    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert caught.value.details() == REFUSAL


def test_a_patch_difference_registers_with_a_warning(
    master: MasterServer, caplog: pytest.LogCaptureFixture
) -> None:
    patch = f"{MAJOR}.{MINOR}.999"
    with caplog.at_level(logging.WARNING, logger="assay.master"):
        reply = _register(master.port, patch)

    assert reply.HasField("registered")
    assert f"agent a1 runs assay {patch}, the master {assay.__version__}" in caplog.text


def _connection(port: int, version: str, refusals: list[str]) -> MasterConnection:
    device = common_pb2.Device(index=0, type=common_pb2.SLOT_TYPE_CPU, name="cpu")
    return MasterConnection(
        f"127.0.0.1:{port}",
        join_token=JOIN_TOKEN,
        register=lambda: agent_pb2.Register(
            agent_id="a1",
            version=version,
            slot_type=common_pb2.SLOT_TYPE_CPU,
            devices=[device],
            address="127.0.0.1",
        ),
        heartbeat=agent_pb2.Heartbeat,
        on_message=lambda message: None,
        timeout=5,
        backoff=Backoff(initial=0.05, maximum=0.1),
        on_refused=refusals.append,
    )


def test_the_agent_stops_retrying_once_its_version_is_refused(master: MasterServer) -> None:
    refusals: list[str] = []
    connection = _connection(master.port, NEXT_MINOR, refusals)

    thread = threading.Thread(target=connection.run)
    thread.start()
    thread.join(timeout=10)

    assert not thread.is_alive()
    assert refusals == [REFUSAL]
    assert connection.refused == REFUSAL


def test_a_name_already_connected_is_retried_not_refused(
    master: MasterServer, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """FAILED_PRECONDITION also says "already connected": that one passes with time."""
    refusals: list[str] = []
    connection = _connection(master.port, assay.__version__, refusals)
    done = threading.Event()
    device = common_pb2.Device(index=0, type=common_pb2.SLOT_TYPE_CPU, name="cpu")

    def first() -> Iterator[agent_pb2.AgentMessage]:
        register = agent_pb2.Register(
            agent_id="a1", slot_type=common_pb2.SLOT_TYPE_CPU, devices=[device]
        )
        yield agent_pb2.AgentMessage(register=register)
        done.wait(10)

    with grpc.insecure_channel(f"127.0.0.1:{master.port}") as channel:
        stream = agent_pb2_grpc.AgentServiceStub(channel).Connect(first(), metadata=JOIN_METADATA)
        registered = next(stream)
        assert registered.HasField("registered")
        # The same agent, back on a new stream with the credential it was given.
        connection.credential = CredentialFile(tmp_path / "credential")
        connection.credential.save(registered.registered.credential)
        thread = threading.Thread(target=connection.run)
        caplog.set_level(logging.WARNING, logger="assay.agent")
        thread.start()
        try:
            time.sleep(1.0)  # several attempts, each told "already connected"
            assert thread.is_alive()
            assert refusals == []
        finally:
            done.set()
            stream.cancel()
        # Once the first stream is gone, the name is free and the agent registers.
        assert connection.connected.wait(10)
        connection.close()
        thread.join(timeout=10)
    assert connection.refused is None
    assert "FAILED_PRECONDITION: an agent named 'a1' is already connected" in caplog.text


@pytest.mark.slow
def test_a_refused_agent_process_says_what_to_install_and_exits(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASSAY_")}
    env["PYTHONUNBUFFERED"] = "1"
    env["ASSAY_JOIN_TOKEN"] = JOIN_TOKEN
    env["ASSAY_INITIAL_ADMIN_PASSWORD"] = ADMIN_PASSWORD
    env["ASSAY_ISOLATION"] = "none"  # no trial runs here (see tests/deploy/conftest.py)
    master_log = tmp_path / "master.log"
    master_cmd = [sys.executable, "-m", "assay.master.main", "--grpc-port", str(port)]
    master_cmd += ["--host", "127.0.0.1", "--state-dir", str(tmp_path / "m"), "--http-port", "0"]
    agent_cmd = [sys.executable, "-m", "assay.agent.main", "--master", f"127.0.0.1:{port}"]
    agent_cmd += ["--slot-type", "cpu", "--slots", "1", "--work-dir", str(tmp_path / "work")]
    with master_log.open("wb") as out:
        master = subprocess.Popen(master_cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        # A current agent joins (which also says the master is up) ...
        current_log = tmp_path / "current.log"
        with current_log.open("wb") as out:
            current = subprocess.Popen(
                [*agent_cmd, "--agent-id", "current"], stdout=out, stderr=subprocess.STDOUT, env=env
            )
        try:
            wait_for_agents(f"127.0.0.1:{port}", 1, [master_log, current_log])
            # ... one of the next minor version is told what to install, and stops.
            refused = subprocess.run(
                [*agent_cmd, "--agent-id", "newer", "--reported-version", NEXT_MINOR],
                capture_output=True,
                text=True,
                env=env,
                timeout=60,
                check=False,
            )
            agents = wait_for_agents(f"127.0.0.1:{port}", 1, [master_log])
        finally:
            stop_processes([current])
    finally:
        stop_processes([master])

    assert refused.returncode == 3, refused.stderr
    assert refused.stderr.strip().splitlines()[-1] == f"assay-agent: error: {REFUSAL}"
    assert "retrying" not in refused.stderr
    assert [a["id"] for a in agents] == ["current"]
