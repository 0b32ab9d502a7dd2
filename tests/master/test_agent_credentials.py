"""Each agent's name is bound to the credential it was given at its first join, and
`RemoveAgent` frees the name (a real master on loopback, scripted agents)."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from assay.master._server import MasterServer
from assay.proto import agent_pb2, agent_pb2_grpc, api_pb2, api_pb2_grpc, common_pb2
from tests.credentials import JOIN_METADATA, authed_api, login, master_config
from tests.master.conftest import ScriptedAgent, eventually, experiment_yaml, model_archive


def _refusal(port: int, agent_id: str, *, credential: str, join: bool = True) -> grpc.RpcError:
    """The error a registration as `agent_id` with these credentials ends in."""
    metadata = [*JOIN_METADATA] if join else []
    if credential:
        metadata.append(("x-assay-agent-credential", credential))
    register = agent_pb2.AgentMessage(
        register=agent_pb2.Register(
            agent_id=agent_id,
            slot_type=common_pb2.SLOT_TYPE_CPU,
            devices=[common_pb2.Device(index=0, type=common_pb2.SLOT_TYPE_CPU, name="cpu")],
        )
    )
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stream = agent_pb2_grpc.AgentServiceStub(channel).Connect(
            iter([register]), metadata=metadata, timeout=10
        )
        with pytest.raises(grpc.RpcError) as caught:
            next(stream)
    return caught.value


def test_a_name_accepts_only_the_credential_it_was_given(master: MasterServer) -> None:
    first = ScriptedAgent(master.port, "a1", slots=1, credential="")
    assert len(first.credential) >= 40
    assert master.store.agent_credentials()["a1"] != first.credential  # only its hash
    first.close()
    eventually(lambda: not master.master.agents["a1"].connected)

    for credential in ("", "not-its-credential", first.credential + "x"):
        error = _refusal(master.port, "a1", credential=credential)
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "assay agent remove a1" in (error.details() or "")
    # Its own credential lets it back, without the join token too, with nothing new.
    back = ScriptedAgent(master.port, "a1", slots=1, credential=first.credential, join=False)
    assert back.credential == first.credential
    back.close()
    # A credential alone does not claim a free name.
    error = _refusal(master.port, "a2", credential=first.credential, join=False)
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED


def test_a_restarted_master_knows_the_credentials(tmp_path: Path) -> None:
    config = master_config(state_dir=tmp_path / "m", agent_reconnect_wait_s=1.0)
    first = MasterServer(config)
    first.start()
    agent = ScriptedAgent(first.port, "a1", slots=1, credential="")
    agent.close()
    first.stop(grace=0.1)
    second = MasterServer(config)
    second.start()
    try:
        error = _refusal(second.port, "a1", credential="")
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED
        ScriptedAgent(second.port, "a1", slots=1, credential=agent.credential).close()
    finally:
        second.stop(grace=0.1)


def test_removing_an_agent_frees_its_name_and_requeues_its_trial(
    master: MasterServer, api: api_pb2_grpc.ApiStub
) -> None:
    a1 = ScriptedAgent(master.port, "a1", slots=1, credential="")
    api.CreateExperiment(
        api_pb2.CreateExperimentRequest(
            config_yaml=experiment_yaml(), model_definition=model_archive(), activate=True
        )
    )
    start = a1.next("start").start
    removed = api.RemoveAgent(api_pb2.RemoveAgentRequest(id="a1"))
    assert removed.disconnected
    eventually(lambda: a1.error is not None or not a1.reader.is_alive())
    assert "a1" not in master.store.agent_credentials()
    # The trial went back to the queue: the next agent under the name (a new credential,
    # given for the join token) runs it again.
    again = ScriptedAgent(master.port, "a1", slots=1, credential="")
    assert again.credential not in ("", a1.credential)
    restarted = again.next("start").start
    assert restarted.trial_id == start.trial_id
    assert restarted.run_id > start.run_id
    again.close()
    with pytest.raises(grpc.RpcError) as caught:
        api.RemoveAgent(api_pb2.RemoveAgentRequest(id="nobody"))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_removing_needs_an_admin(master: MasterServer) -> None:
    address = f"127.0.0.1:{master.port}"
    master.auth.create_user("bob", "bob-password-1")
    ScriptedAgent(master.port, "a1", slots=1, credential="").close()
    bob, channel = authed_api(address, login(address, "bob", "bob-password-1"))
    try:
        with pytest.raises(grpc.RpcError) as caught:
            bob.RemoveAgent(api_pb2.RemoveAgentRequest(id="a1"))
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        channel.close()
    assert "a1" in master.store.agent_credentials()
