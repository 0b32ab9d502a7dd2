"""A regular user submits the biggest searches the master allows, on a real master process.

The searcher creates trials as earlier ones end (`max_concurrent_trials`, 16 when
unset), never the whole search at once, and refuses `max_trials` past its cap and grids
past theirs. So while a user submits a random search of `MAX_TRIALS` trials, a grid of
`MAX_GRID_POINTS` points and a random search at the highest `max_concurrent_trials`, the
master keeps answering: a thread polls `/health`, another user lists experiments, the
master's memory is sampled, and an agent stays connected. The searches can still be
killed, and they end.

The machine is shared and noisy: the bounds are generous (every answer within 2 s, memory
within 250 MB of where it started); the worst figures measured are printed (`-s`).
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest
import yaml

from assay.config import MAX_GRID_POINTS
from assay.config._searcher_config import (
    DEFAULT_MAX_CONCURRENT_TRIALS,
    MAX_CONCURRENT_TRIALS,
    MAX_TRIALS,
)
from assay.proto import api_pb2, api_pb2_grpc, common_pb2
from tests.credentials import authed_api, login
from tests.e2e.conftest import Cluster, start_cluster, stop_cluster
from tests.master.conftest import model_archive

ANSWER_S = 2.0  # the slowest answer allowed, however busy the master is
GROWTH_MB = 250  # how much the master's memory may grow over the whole attack
CALL_TIMEOUT_S = 60.0
SETTLE_S = 3.0  # how long the searches are left to run before they are killed
PASSWORD = "huge-search-password-1"


@dataclass
class Watch:
    """Polls the master from the side while the attack runs; keeps the worst figures."""

    cluster: Cluster
    call: Callable[[], Any]
    health_s: list[float] = field(default_factory=list)
    call_s: list[float] = field(default_factory=list)
    rss: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.process = psutil.Process(self.cluster.procs[0].pid)
        self.threads = [
            threading.Thread(target=self._loop, args=(self._health, self.health_s), daemon=True),
            threading.Thread(target=self._loop, args=(self.call, self.call_s), daemon=True),
            threading.Thread(target=self._memory, daemon=True),
        ]

    def __enter__(self) -> Watch:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=CALL_TIMEOUT_S + 5)

    def _health(self) -> None:
        url = f"http://127.0.0.1:{self.cluster.http_port}/api/v1/health"
        with urllib.request.urlopen(url, timeout=CALL_TIMEOUT_S) as response:
            assert response.status == 200

    def _loop(self, call: Callable[[], Any], latencies: list[float]) -> None:
        while not self.stop.is_set():
            start = time.monotonic()
            try:
                call()
            except Exception as e:  # a timeout counts as its full wait
                self.errors.append(f"{type(e).__name__}: {e}")
            latencies.append(time.monotonic() - start)
            self.stop.wait(0.05)

    def _memory(self) -> None:
        while not self.stop.is_set():
            self.rss.append(self.process.memory_info().rss)
            self.stop.wait(0.1)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = start_cluster(tmp_path, None, agents=1, slots=1)
    try:
        yield c
    finally:
        stop_cluster(c)


def _user(cluster: Cluster, admin: api_pb2_grpc.ApiStub, name: str) -> Any:
    admin.CreateUser(api_pb2.CreateUserRequest(username=name, password=PASSWORD))
    stub, channel = authed_api(cluster.address, login(cluster.address, name, PASSWORD))
    return stub, channel


def _config(searcher: dict[str, Any], hyperparameters: dict[str, Any]) -> str:
    return yaml.safe_dump(
        {
            "name": "huge",
            "entrypoint": "model_def:T",
            "hyperparameters": {"global_batch_size": 8, **hyperparameters},
            "searcher": {"metric": "loss", "max_length": {"batches": 100}, **searcher},
        }
    )


def _create(api: api_pb2_grpc.ApiStub, config_yaml: str) -> int:
    request = api_pb2.CreateExperimentRequest(
        config_yaml=config_yaml, model_definition=model_archive(), activate=True
    )
    eid: int = api.CreateExperiment(request, timeout=CALL_TIMEOUT_S).experiment.id
    return eid


def _refused(api: api_pb2_grpc.ApiStub, config_yaml: str, message: str) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        _create(api, config_yaml)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value
    assert message in str(caught.value.details()), caught.value.details()


def _trials(api: api_pb2_grpc.ApiStub, ids: list[int]) -> list[int]:
    """How many trials each experiment has (the listing, not the trials themselves)."""
    request = api_pb2.ListExperimentsRequest(owner="bob", limit=100)
    listed = api.ListExperiments(request, timeout=CALL_TIMEOUT_S).experiments
    counts = {e.id: e.num_trials for e in listed}
    return [counts[eid] for eid in ids]


def _wait_ended(api: api_pb2_grpc.ApiStub, ids: list[int]) -> None:
    ended = {common_pb2.EXPERIMENT_STATE_CANCELED, common_pb2.EXPERIMENT_STATE_ERROR}
    request = api_pb2.ListExperimentsRequest(owner="bob", limit=100)
    deadline = time.monotonic() + CALL_TIMEOUT_S
    while time.monotonic() < deadline:
        listed = api.ListExperiments(request, timeout=CALL_TIMEOUT_S).experiments
        if all(e.state in ended for e in listed if e.id in ids):
            return
        time.sleep(0.2)
    raise AssertionError(f"experiments {ids} did not end after they were killed")


RANDOM = {"name": "random", "max_trials": MAX_TRIALS}
GRID_SPACE = {"i": {"type": "int", "minval": 1, "maxval": MAX_GRID_POINTS}}
SPACE = {"lr": {"type": "double", "minval": 0.0, "maxval": 1.0}}


@pytest.mark.slow
def test_the_biggest_searches_do_not_stall_the_master(cluster: Cluster) -> None:
    admin, admin_channel = authed_api(cluster.address)
    bob, bob_channel = _user(cluster, admin, "bob")
    alice, alice_channel = _user(cluster, admin, "alice")
    listing = api_pb2.ListExperimentsRequest(limit=5)
    created: list[int] = []
    try:
        with Watch(cluster, lambda: alice.ListExperiments(listing, timeout=CALL_TIMEOUT_S)) as w:
            time.sleep(1.0)  # the figures of an idle master first
            started = time.monotonic()
            created.append(_create(bob, _config(RANDOM, SPACE)))
            created.append(_create(bob, _config({"name": "grid"}, GRID_SPACE)))
            burst = {**RANDOM, "max_concurrent_trials": MAX_CONCURRENT_TRIALS}
            created.append(_create(bob, _config(burst, SPACE)))
            submitted_s = time.monotonic() - started
            trials = _trials(bob, created)
            time.sleep(SETTLE_S)

            too_many = {**RANDOM, "max_trials": 1_000_000_000}
            _refused(bob, _config(too_many, SPACE), f"at most {MAX_TRIALS:,}")
            wide = {"i": {"type": "int", "minval": 0, "maxval": MAX_GRID_POINTS}}
            _refused(bob, _config({"name": "grid"}, wide), f"more than {MAX_GRID_POINTS:,}")
            flood = {**RANDOM, "max_concurrent_trials": MAX_CONCURRENT_TRIALS + 1}
            _refused(bob, _config(flood, SPACE), f"at most {MAX_CONCURRENT_TRIALS:,}")

            for eid in created:
                kill = api_pb2.ExperimentActionRequest(
                    id=eid, action=api_pb2.EXPERIMENT_ACTION_KILL
                )
                bob.ExperimentAction(kill, timeout=CALL_TIMEOUT_S)
            _wait_ended(bob, created)
            ended = _trials(bob, created)
            time.sleep(1.0)
            later = _trials(bob, created)
        agents = admin.ListAgents(api_pb2.ListAgentsRequest(), timeout=CALL_TIMEOUT_S).agents
    finally:
        for channel in (admin_channel, bob_channel, alice_channel):
            channel.close()

    growth_mb = (max(w.rss) - w.rss[0]) / 2**20
    print(
        f"\nsubmitted 3 searches in {submitted_s:.2f} s; trials created {trials}, "
        f"{ended} when they ended; "
        f"/health worst {max(w.health_s):.3f} s over {len(w.health_s)} polls; "
        f"another user's ListExperiments worst {max(w.call_s):.3f} s over {len(w.call_s)}; "
        f"master RSS {w.rss[0] / 2**20:.0f} -> {max(w.rss) / 2**20:.0f} MB"
    )
    assert not w.errors, w.errors[:3]
    assert [a.connected for a in agents] == [True]  # its stream was served all along
    # Created lazily: what may run at once, a few more as the agent's trials ended, and
    # none once the searches were killed.
    assert trials == [DEFAULT_MAX_CONCURRENT_TRIALS] * 2 + [MAX_CONCURRENT_TRIALS], trials
    assert all(e - t < DEFAULT_MAX_CONCURRENT_TRIALS for e, t in zip(ended, trials, strict=True))
    assert later == ended, (ended, later)
    assert max(w.health_s) < ANSWER_S, sorted(w.health_s)[-5:]
    assert max(w.call_s) < ANSWER_S, sorted(w.call_s)[-5:]
    assert growth_mb < GROWTH_MB, growth_mb
