"""On a real cluster: the master's /metrics (`metrics: token`) parses as Prometheus text,
its gauges say what `assay agent list` says, and its counters move when a trial runs."""

from __future__ import annotations

import secrets
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import REGRESSION_DIR, regression_config
from tests.e2e.conftest import Cluster, start_cluster, stop_cluster

pytestmark = pytest.mark.slow

TOKEN = secrets.token_hex(24)
Samples = dict[str, dict[tuple[tuple[str, str], ...], float]]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    env = {"ASSAY_METRICS": "token", "ASSAY_METRICS_TOKEN": TOKEN}
    c = start_cluster(tmp_path_factory.mktemp("metrics"), None, agents=2, slots=2, master_env=env)
    try:
        yield c
    finally:
        stop_cluster(c)


def scrape(cluster: Cluster, token: str | None = TOKEN) -> tuple[int, str, str]:
    """Status, content type and body of GET /metrics."""
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    url = f"http://127.0.0.1:{cluster.http_port}/metrics"
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, reply.headers["Content-Type"], reply.read().decode()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.headers["Content-Type"], e.read().decode()


def samples(text: str) -> Samples:
    """Every sample of the scrape: name -> sorted labels -> value."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def one(found: Samples, name: str, **labels: str) -> float:
    return found[name][tuple(sorted(labels.items()))]


def test_the_gauges_say_what_agent_list_says(cluster: Cluster) -> None:
    agents: list[dict[str, Any]] = cluster.json("agent", "list")
    status, content_type, text = scrape(cluster)

    assert status == 200, text
    assert content_type.startswith("text/plain; version=0.0.4")
    found = samples(text)
    connected = [a for a in agents if a["connected"]]
    assert one(found, "assay_agents_connected", pool="default") == len(connected) == 2
    total = sum(a["slots"] for a in connected)
    used = sum(a["used_slots"] for a in connected)
    assert one(found, "assay_slots", pool="default", slot_type="cpu") == total == 4
    assert one(found, "assay_slots_used", pool="default", slot_type="cpu") == used
    assert one(found, "assay_slots_free", pool="default", slot_type="cpu") == total - used
    assert one(found, "assay_queued_trials", pool="default") == 0
    for agent in connected:
        assert one(found, "assay_agent_memory_bytes", agent=agent["id"]) == agent["memory_bytes"]
        assert 0 <= one(found, "assay_agent_cpu_utilization", agent=agent["id"]) <= 1
        assert 0 < one(found, "assay_agent_memory_used_fraction", agent=agent["id"]) < 1
        for device in agent["devices"]:
            labels = {"agent": agent["id"], "device": str(device["index"]), "slot_type": "cpu"}
            assert one(found, "assay_device_memory_bytes", **labels) == device["memory_bytes"]
    # Nothing in the scrape names a user or an experiment.
    assert "admin" not in text


def test_a_disabled_agent_shows_as_disabled_slots(cluster: Cluster) -> None:
    assert cluster.cli("agent", "disable", "agent1").returncode == 0
    try:
        found = samples(scrape(cluster)[2])
        assert one(found, "assay_slots_disabled", pool="default", slot_type="cpu") == 2
    finally:
        assert cluster.cli("agent", "enable", "agent1").returncode == 0


def test_a_trial_moves_the_counters(cluster: Cluster, tmp_path: Path) -> None:
    before = samples(scrape(cluster)[2])
    model = tmp_path / "model"
    model.mkdir()
    (model / "model_def.py").write_text((REGRESSION_DIR / "model_def.py").read_text())
    config = tmp_path / "metrics-run.yaml"
    config.write_text(yaml.safe_dump({**regression_config(batches=8), "name": "metrics-run"}))

    done = cluster.cli("experiment", "create", str(config), str(model), "--follow", timeout=240)

    assert done.returncode == 0, done.stdout + done.stderr + cluster.dump_logs()
    after = samples(scrape(cluster)[2])
    assert one(after, "assay_allocations_started_total") == 1 + one(
        before, "assay_allocations_started_total"
    )
    assert one(after, "assay_allocations_ended_total", outcome="completed") == 1 + one(
        before, "assay_allocations_ended_total", outcome="completed"
    )
    assert one(after, "assay_metric_rows_ingested_total") > one(
        before, "assay_metric_rows_ingested_total"
    )
    assert one(after, "assay_scheduling_round_seconds_count") > 0
    assert one(after, "assay_store_commit_seconds_count") > one(
        before, "assay_store_commit_seconds_count"
    )
    reported = one(after, "assay_rpc_duration_seconds_count", method="TrialService.ReportMetrics")
    assert reported > 0
    # The experiment's name and its owner appear nowhere.
    text = scrape(cluster)[2]
    assert "metrics-run" not in text
    assert "admin" not in text


@pytest.mark.parametrize(
    "token",
    [None, "", "wrong", TOKEN[:-1], TOKEN + "x"],
    ids=["none", "empty", "wrong", "a-prefix", "longer"],  # the same in every xdist worker
)
def test_a_scrape_without_the_token_is_refused_and_shows_nothing(
    cluster: Cluster, token: str | None
) -> None:
    status, _, body = scrape(cluster, token)

    assert status == 401
    assert "metrics token" in body
    assert "assay_" not in body
