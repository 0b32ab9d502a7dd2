"""deploy/prometheus and deploy/grafana: the scrape config reaches the master's /metrics
the way the master serves it, and every query of the dashboard names metrics a real
master exports."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from assay.common.settings import settings_of
from assay.master._config import MasterConfig
from assay.master.api import METRICS_PATH
from tests.deploy.conftest import DEPLOY
from tests.http.conftest import Site, open_site

PROMETHEUS = DEPLOY / "prometheus" / "prometheus.yml"
DASHBOARD = DEPLOY / "grafana" / "assay-cluster.json"
# The series each kind of family writes (prometheus_client's text format).
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gauge": ("",),
}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    opened = open_site(tmp_path_factory.mktemp("scrape") / "master", metrics="token")
    yield opened
    opened.close()


def _scrape(site: Site) -> str:
    assert site.master.http is not None
    token = (site.master.config.state_dir / "metrics-token").read_text().strip()
    request = urllib.request.Request(
        f"http://127.0.0.1:{site.master.http.port}{METRICS_PATH}",
        headers={"Authorization": f"Bearer {token}"},
    )
    with urllib.request.urlopen(request, timeout=10) as reply:
        return str(reply.read().decode())


def _exported(text: str) -> set[str]:
    """Every series name the scrape's families write."""
    names = set()
    for family in text_string_to_metric_families(text):
        names |= {family.name + suffix for suffix in SUFFIXES[family.type]}
    return names


def _job() -> dict[str, Any]:
    config = yaml.safe_load(PROMETHEUS.read_text())
    [job] = [j for j in config["scrape_configs"] if j["job_name"] == "assay-master"]
    return dict(job)


def test_the_scrape_config_uses_the_masters_route_port_and_token(site: Site) -> None:
    job = _job()
    comments = PROMETHEUS.read_text()

    assert job["metrics_path"] == METRICS_PATH
    [target] = job["static_configs"][0]["targets"]
    assert target.rsplit(":", 1)[1] == str(MasterConfig.http_port)
    assert job["authorization"]["type"] == "Bearer"
    assert Path(job["authorization"]["credentials_file"]).is_absolute()
    # The settings the comments tell the operator to set are the master's.
    names = {s.name for s in settings_of(MasterConfig)}
    assert {"metrics", "metrics_token"} <= names
    assert "metrics: token" in comments
    assert "<state_dir>/metrics-token" in comments
    assert (site.master.config.state_dir / "metrics-token").is_file()


def _expressions() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [
        (panel["title"], target["expr"])
        for panel in dashboard["panels"]
        for target in panel["targets"]
    ]


def test_every_dashboard_query_names_metrics_the_master_exports(site: Site) -> None:
    exported = _exported(_scrape(site))
    expressions = _expressions()

    assert len(expressions) >= 12
    for title, expr in expressions:
        named = set(re.findall(r"\bassay_[a-z_]+\b", expr))
        assert named, (title, expr)
        assert named <= exported, (title, sorted(named - exported))


def test_the_dashboard_covers_what_the_issue_asks_for() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = " ".join(expr for _, expr in _expressions())
    for metric in (
        "assay_slots_used",
        "assay_slots_free",
        "assay_queued_trials",
        "assay_allocations_started_total",
        "assay_scheduling_round_seconds_bucket",
        "assay_rpc_duration_seconds_bucket",
        "assay_store_commit_seconds_bucket",
    ):
        assert metric in queries, metric
    assert "histogram_quantile(0.5" in queries
    assert "histogram_quantile(0.99" in queries
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    # Each panel asks the dashboard's Prometheus variable, chosen at import.
    assert dashboard["templating"]["list"][0]["type"] == "datasource"
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}"
