"""What several security tests share: users on a real master process, and a trial of it
played by the test (a scripted agent that speaks the agent protocol, and the trial's
process that reports with its allocation's token)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import grpc

from assay.proto import agent_pb2, api_pb2, api_pb2_grpc
from tests.credentials import authed_api, login
from tests.e2e.conftest import Cluster
from tests.master.conftest import Process, ScriptedAgent


def add_users(cluster: Cluster, passwords: Mapping[str, str]) -> dict[str, api_pb2_grpc.ApiStub]:
    """Create each user (by the admin) and return a stub that presents its session."""
    admin, channel = authed_api(cluster.address)
    stubs: dict[str, api_pb2_grpc.ApiStub] = {}
    with channel:
        for name, password in passwords.items():
            request = api_pb2.CreateUserRequest(username=name, password=password)
            admin.CreateUser(request, timeout=30)
            stubs[name], _ = authed_api(cluster.address, login(cluster.address, name, password))
    return stubs


@dataclass
class PlayedTrial:
    """A trial the master started on a scripted agent; `process` reports as its rank 0."""

    agent: ScriptedAgent
    start: agent_pb2.StartAllocation
    process: Process

    def close(self) -> None:
        self.process.close()
        self.agent.close()


def play_trial(cluster: Cluster, agent_id: str = "scripted") -> PlayedTrial:
    """Join a one-slot scripted agent and wait for the master to start a trial on it
    (an active experiment must be waiting for a slot, or be submitted soon after)."""
    port = int(cluster.address.rsplit(":", 1)[1])
    agent = ScriptedAgent(port, agent_id, slots=1)
    start = agent.next("start", timeout=60).start
    return PlayedTrial(agent, start, Process(port, start))


def status_of(call: grpc.RpcError) -> tuple[grpc.StatusCode, str]:
    return call.code(), str(call.details())
