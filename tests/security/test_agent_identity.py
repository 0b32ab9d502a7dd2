"""An agent's name is bound to the credential it was given at its first join: a holder of
the join token cannot take the name of a connected or disconnected agent, inherit its
runs or receive its next trial (real `assay-master` and `assay-agent` processes)."""

from __future__ import annotations

import queue
import stat
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from assay.proto import agent_pb2, agent_pb2_grpc, api_pb2, api_pb2_grpc, common_pb2
from tests.credentials import JOIN_METADATA, login
from tests.e2e.conftest import ROOT, Cluster, start_cluster, stop_cluster
from tests.master.conftest import eventually, experiment_yaml, model_archive

CREDENTIAL = "x-assay-agent-credential"


class Intruder:
    """A hand-written agent client holding the join token, registering as `name`."""

    def __init__(self, address: str, name: str, metadata: list[tuple[str, str]]) -> None:
        self.channel = grpc.insecure_channel(address)
        self.done = threading.Event()
        self.received: queue.Queue[agent_pb2.MasterMessage] = queue.Queue()
        self.error: grpc.RpcError | None = None
        register = agent_pb2.AgentMessage(
            register=agent_pb2.Register(
                agent_id=name,
                slot_type=common_pb2.SLOT_TYPE_CPU,
                devices=[common_pb2.Device(index=0, type=common_pb2.SLOT_TYPE_CPU, name="cpu")],
                address="127.0.0.1",
            )
        )
        stream = agent_pb2_grpc.AgentServiceStub(self.channel).Connect(
            self._requests(register), metadata=metadata
        )
        self.stream = stream
        threading.Thread(target=self._read, daemon=True).start()

    def _requests(self, register: agent_pb2.AgentMessage) -> Iterator[agent_pb2.AgentMessage]:
        yield register
        self.done.wait()

    def _read(self) -> None:
        try:
            for message in self.stream:
                self.received.put(message)
        except grpc.RpcError as e:
            self.error = e

    def messages(self, wait: float) -> list[str]:
        """The kinds of the messages the master sent within `wait` seconds."""
        kinds: list[str] = []
        try:
            while True:
                kinds.append(self.received.get(timeout=wait).WhichOneof("message") or "")
        except queue.Empty:
            return kinds

    def close(self) -> None:
        self.done.set()
        self.channel.close()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    # agent0's runs wait a minute for it: long enough for an intruder to try its name.
    env = {"ASSAY_AGENT_RECONNECT_WAIT_S": "60", "ASSAY_HEARTBEAT_INTERVAL_S": "1"}
    c = start_cluster(tmp_path, None, agents=1, slots=1, master_env=env)
    try:
        yield c
    finally:
        stop_cluster(c)


def _refused(intruder: Intruder) -> grpc.RpcError:
    kinds = intruder.messages(wait=3.0)
    assert kinds == []  # neither Registered nor a StartAllocation
    assert intruder.error is not None
    return intruder.error


def test_the_join_token_does_not_take_another_agents_name(cluster: Cluster, tmp_path: Path) -> None:
    credential_file = tmp_path / "agent0" / "credential"
    assert stat.S_IMODE(credential_file.stat().st_mode) == 0o600
    credential = credential_file.read_text().strip()
    assert len(credential) >= 40

    # While agent0 is connected.
    intruder = Intruder(cluster.address, "agent0", [*JOIN_METADATA])
    error = _refused(intruder)
    intruder.close()
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "held by another agent's credential" in (error.details() or "")
    assert "assay agent remove agent0" in (error.details() or "")

    # After agent0 stops, with a trial waiting for its slot.
    agent0 = cluster.procs[1]
    agent0.terminate()
    agent0.wait(timeout=30)
    eventually(lambda: not cluster.json("agent", "list")[0]["connected"], timeout=30)
    with grpc.insecure_channel(cluster.address) as channel:
        api = api_pb2_grpc.ApiStub(channel)
        admin = (("authorization", f"Bearer {login(cluster.address)}"),)
        api.CreateExperiment(
            api_pb2.CreateExperimentRequest(
                config_yaml=experiment_yaml(), model_definition=model_archive(), activate=True
            ),
            metadata=admin,
            timeout=30,
        )
    for metadata in (
        [*JOIN_METADATA],
        [*JOIN_METADATA, (CREDENTIAL, "a-guessed-credential")],
        [(CREDENTIAL, credential[:-1] + ("A" if credential[-1] != "A" else "B"))],
    ):
        intruder = Intruder(cluster.address, "agent0", metadata)
        error = _refused(intruder)
        intruder.close()
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED, error.details()
    # Without the join token or a credential, nothing gets in.
    intruder = Intruder(cluster.address, "agent0", [])
    assert _refused(intruder).code() == grpc.StatusCode.UNAUTHENTICATED
    intruder.close()

    # An admin frees the name: the next agent with the join token takes it, and the slot.
    done = cluster.cli("agent", "remove", "agent0")
    assert done.returncode == 0, done.stderr
    assert "agent agent0 removed" in done.stdout
    newcomer = Intruder(cluster.address, "agent0", [*JOIN_METADATA])
    try:
        registered = newcomer.received.get(timeout=30)
        assert registered.WhichOneof("message") == "registered"
        assert registered.registered.credential not in ("", credential)
        assert newcomer.received.get(timeout=30).WhichOneof("message") == "start"
    finally:
        newcomer.close()


def test_an_agent_restarted_with_its_credential_file_keeps_its_name(cluster: Cluster) -> None:
    agent0 = cluster.procs[1]
    agent0.terminate()
    agent0.wait(timeout=30)
    eventually(lambda: not cluster.json("agent", "list")[0]["connected"], timeout=30)
    with cluster.logs[1].open("ab") as log:
        cluster.procs[1] = subprocess.Popen(
            agent0.args, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT
        )
    eventually(lambda: cluster.json("agent", "list")[0]["connected"], timeout=60)
