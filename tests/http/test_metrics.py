"""/metrics on the master's HTTP port: off by default (404), a bearer token compared in
constant time with `metrics: token`, anyone with `metrics: open`; the settings' bad
values stop the master with a message that names them."""

from __future__ import annotations

import stat
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from assay.common.settings import SettingsError
from assay.errors import AssayError
from assay.master._config import load_master_config
from assay.master._server import MasterServer
from assay.proto import api_pb2
from tests.credentials import master_config
from tests.http.conftest import Site, open_site


def _get(site: Site, headers: dict[str, str] | None = None) -> tuple[int, str]:
    assert site.master.http is not None
    url = f"http://127.0.0.1:{site.master.http.port}/metrics"
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.read().decode()


@pytest.fixture(scope="module")
def token_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    site = open_site(tmp_path_factory.mktemp("metrics") / "master", metrics="token")
    yield site
    site.close()


def test_metrics_are_off_by_default(tmp_path: Path) -> None:
    site = open_site(tmp_path / "master")
    try:
        status, body = _get(site, {"Authorization": f"Bearer {site.token}"})
        assert status == 404
        assert "`metrics` setting is off" in body
        assert not (tmp_path / "master" / "metrics-token").exists()
    finally:
        site.close()


def test_the_generated_token_is_written_for_prometheus_alone(token_site: Site) -> None:
    file = token_site.master.config.state_dir / "metrics-token"
    token = file.read_text().strip()

    status, body = _get(token_site, {"Authorization": f"Bearer {token}"})

    assert stat.S_IMODE(file.stat().st_mode) == 0o600
    assert len(token) == 64
    assert status == 200
    names = {family.name for family in text_string_to_metric_families(body)}
    assert {"assay_slots", "assay_scheduling_round_seconds", "assay_rpc_duration_seconds"} <= names


@pytest.mark.parametrize(
    "header",
    ["", "Bearer", "Bearer wrong", "Basic {token}", "Bearer {token}x", "Bearer {session}"],
)
def test_a_scrape_without_the_token_gets_401_and_nothing_else(
    token_site: Site, header: str
) -> None:
    token = (token_site.master.config.state_dir / "metrics-token").read_text().strip()
    sent = header.format(token=token, session=token_site.token)

    status, body = _get(token_site, {"Authorization": sent} if sent else {})

    assert status == 401
    assert "metrics token" in body
    assert "assay_" not in body


def test_methods_no_service_declares_get_no_series(token_site: Site) -> None:
    master = token_site.master
    with grpc.insecure_channel(f"127.0.0.1:{master.port}") as channel:
        call = channel.unary_unary("/assay.v1.Nothing/Here", request_serializer=lambda _: b"")
        with pytest.raises(grpc.RpcError):
            call(b"", timeout=10)
    token_site.api.ListAgents(api_pb2.ListAgentsRequest())
    token = (master.config.state_dir / "metrics-token").read_text().strip()

    body = _get(token_site, {"Authorization": f"Bearer {token}"})[1]

    assert "Nothing" not in body
    counts = {
        s.labels["method"]: s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
        if s.name == "assay_rpc_duration_seconds_count"
    }
    assert counts["Api.ListAgents"] >= 1
    assert counts["Api.Login"] >= 1  # the fixture's login


def test_open_metrics_need_no_token(tmp_path: Path) -> None:
    site = open_site(tmp_path / "master", metrics="open")
    try:
        status, body = _get(site)
        assert status == 200
        assert "assay_agents_connected" in body
        assert not (tmp_path / "master" / "metrics-token").exists()
    finally:
        site.close()


def test_a_guessable_metrics_token_stops_the_master(tmp_path: Path) -> None:
    config = master_config(tmp_path / "master", metrics="token", metrics_token="a" * 20)

    with pytest.raises(AssayError, match="metrics_token is too easy to guess"):
        MasterServer(config)


def test_a_wrong_metrics_value_names_what_it_accepts(tmp_path: Path) -> None:
    file = tmp_path / "master.yaml"
    file.write_text("metrics: yes-please\n")

    with pytest.raises(SettingsError, match="metrics in .*: expected one of off, token, open"):
        load_master_config(file, {}, {})


def test_a_bare_off_in_yaml_is_off(tmp_path: Path) -> None:
    file = tmp_path / "master.yaml"
    file.write_text("metrics: off\n")  # YAML 1.1 reads false

    assert load_master_config(file, {}, {}).metrics == "off"
