"""A real master with the HTTP server on its event loop, called over loopback HTTP.

`world` (one per module) holds a finished experiment with metrics, checkpoints and log
lines, made by a scripted agent that plays the trial process over real gRPC, and a
second experiment that was never activated.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from email.message import Message
from pathlib import Path
from typing import Any

import grpc
import pytest

from assay.master._server import MasterServer
from assay.master.api import ApiServicer, HttpServer, start_http
from assay.master.store import LogLine
from assay.proto import api_pb2, api_pb2_grpc
from tests.credentials import authed_channel, login, master_config
from tests.master.conftest import ScriptedAgent, experiment_yaml, model_archive
from tests.master.test_search import Harness
from tests.store.conftest import seeded


@dataclass
class Reply:
    status: int
    headers: Message
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Site:
    master: MasterServer
    server: HttpServer
    api: api_pb2_grpc.ApiStub
    channel: grpc.Channel
    token: str = ""  # admin's session: sent on every call unless `auth=False`
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"

    def call(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        auth: bool = True,
    ) -> Reply:
        sent = dict(headers or {})
        if auth and self.token:
            sent.setdefault("Authorization", f"Bearer {self.token}")
        request = urllib.request.Request(self.base + path, data=body, method=method, headers=sent)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return Reply(response.status, response.headers, response.read())
        except urllib.error.HTTPError as e:
            with e:
                return Reply(e.code, e.headers, e.read())

    def get(self, path: str, headers: dict[str, str] | None = None, auth: bool = True) -> Reply:
        return self.call("GET", path, headers=headers, auth=auth)

    def post(
        self,
        path: str,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        auth: bool = True,
    ) -> Reply:
        return self.call("POST", path, body=body, headers=headers, auth=auth)

    def create(self, activate: bool = True, **overrides: Any) -> int:
        request = api_pb2.CreateExperimentRequest(
            config_yaml=experiment_yaml(**overrides),
            model_definition=model_archive(),
            activate=activate,
        )
        eid: int = self.api.CreateExperiment(request).experiment.id
        return eid

    def close(self) -> None:
        self.channel.close()
        self.master.loop.call(self.server.stop)
        self.master.stop(grace=0.5)


def serve(master: MasterServer, ui_dir: Path | None = None) -> HttpServer:
    api = ApiServicer(master.master, master.pool, master.guard)
    server: HttpServer = master.loop.call(
        lambda: start_http(api, master.pool, "127.0.0.1", 0, master.guard, ui_dir)
    )
    return server


def open_site(state_dir: Path, ui_dir: Path | None = None, **settings: Any) -> Site:
    """A master with the test cluster's credentials (and `settings`), and its HTTP side."""
    config = master_config(
        state_dir=state_dir if "db_url" in settings else seeded(state_dir),
        heartbeat_interval_s=0.5,
        agent_reconnect_wait_s=1.0,
        **settings,
    )
    master = MasterServer(config)
    master.start()
    address = f"127.0.0.1:{master.port}"
    token = login(address)
    channel = authed_channel(address, token)
    return Site(master, serve(master, ui_dir), api_pb2_grpc.ApiStub(channel), channel, token)


def wait_for(done: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.02)


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    opened = open_site(tmp_path / "master")
    yield opened
    opened.close()


@dataclass
class World:
    site: Site
    experiment_id: int
    trial_id: int
    unstarted_id: int
    checkpoints: list[str]
    log_ids: list[int]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    site = open_site(tmp_path_factory.mktemp("http") / "master")
    agent = ScriptedAgent(site.master.port, "agent-1", slots=1)
    harness = Harness(agent, site.master.port)
    eid = site.create(name="finished", labels=["web"])
    start = harness.run_one()
    store = site.master.store
    wait_for(lambda: store.get_experiment(eid).state == "COMPLETED")
    lines = [LogLine(f"line {i}", level="ERROR" if i == 3 else "INFO") for i in range(5)]
    store.append_logs(start.trial_id, start.run_id, lines)
    log_ids = [line.id for line in store.tail_logs(start.trial_id)]
    unstarted = site.create(activate=False, name="waiting")
    yield World(site, eid, start.trial_id, unstarted, list(harness.checkpoints), log_ids)
    agent.close()
    site.close()
