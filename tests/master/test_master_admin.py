"""`assay master config`, `assay master logs` and `assay version` on a real master: the
settings and the log are its administrators', and neither shows a secret."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import yaml

from assay import __version__
from assay.common.settings import settings_of
from assay.master._config import MasterConfig
from assay.master._server import MasterServer
from assay.master.api._servicers._cluster import shown_config
from assay.master.auth import MASK
from assay.master.telemetry import SECRET_ARGS, MasterLogBuffer
from assay.proto import api_pb2, api_pb2_grpc
from tests.cli.conftest import TRACEBACK, run_cli
from tests.credentials import ADMIN_PASSWORD, JOIN_TOKEN, authed_api, login, master_config
from tests.store.conftest import seeded

BOB_PASSWORD = "bob-pass-1234"
METRICS_TOKEN = "f3a9c1e07b5d4c2e8a6b9d0f1e2c3a4b"


@pytest.fixture
def logged_master(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> Iterator[MasterServer]:
    """A master whose INFO lines reach the root logger (its log as `assay-master` has it),
    with bob, a user who is no administrator."""
    caplog.set_level(logging.INFO)
    config = master_config(
        state_dir=seeded(tmp_path / "master"), metrics="token", metrics_token=METRICS_TOKEN
    )
    server = MasterServer(config)
    server.start()
    api, channel = authed_api(f"127.0.0.1:{server.port}")
    api.CreateUser(api_pb2.CreateUserRequest(username="bob", password=BOB_PASSWORD))
    channel.close()
    yield server
    server.stop(grace=0.5)


def _as(master: MasterServer, who: str) -> tuple[api_pb2_grpc.ApiStub, grpc.Channel]:
    address = f"127.0.0.1:{master.port}"
    password = ADMIN_PASSWORD if who == "admin" else BOB_PASSWORD
    return authed_api(address, login(address, who, password))


def test_the_settings_are_shown_to_admins_with_every_secret_hidden(
    logged_master: MasterServer,
) -> None:
    admin, admin_channel = _as(logged_master, "admin")
    bob, bob_channel = _as(logged_master, "bob")
    try:
        shown = admin.GetMasterConfig(api_pb2.GetMasterConfigRequest()).yaml
        with pytest.raises(grpc.RpcError) as refused:
            bob.GetMasterConfig(api_pb2.GetMasterConfigRequest())
    finally:
        admin_channel.close()
        bob_channel.close()

    data = yaml.safe_load(shown)
    config = logged_master.config
    assert list(data) == [s.name for s in settings_of(MasterConfig)]
    secrets = [s.name for s in settings_of(MasterConfig) if s.secret and getattr(config, s.name)]
    assert {"join_token", "initial_admin_password", "metrics_token"} <= set(secrets)
    assert all(data[name] == "<hidden>" for name in secrets)
    for value in (JOIN_TOKEN, ADMIN_PASSWORD, METRICS_TOKEN):
        assert value not in shown
    assert data["grpc_port"] == logged_master.port
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert (
        refused.value.details()
        == "only an administrator may read the master's settings; bob is not"
    )


def test_a_database_url_is_shown_without_its_password(tmp_path: Path) -> None:
    config = dataclasses.replace(
        master_config(state_dir=tmp_path),
        db_url="postgresql+psycopg://assay:s3cret-pw@db.example:5432/assay",
    )

    shown = shown_config(config)

    assert "s3cret-pw" not in shown
    assert yaml.safe_load(shown)["db_url"] == "postgresql+psycopg://assay:***@db.example:5432/assay"


def test_the_log_is_read_and_followed_by_admins_only(logged_master: MasterServer) -> None:
    admin, admin_channel = _as(logged_master, "admin")
    bob, bob_channel = _as(logged_master, "bob")
    got: list[api_pb2.MasterLogLine] = []
    try:
        kept = list(admin.StreamMasterLogs(api_pb2.StreamMasterLogsRequest()))
        last_two = list(admin.StreamMasterLogs(api_pb2.StreamMasterLogsRequest(tail=2)))
        follow = admin.StreamMasterLogs(api_pb2.StreamMasterLogsRequest(tail=1, follow=True))

        def read() -> None:
            for line in follow:
                got.append(line)
                if "a line while followed" in line.message:
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        logging.getLogger("assay.master").warning("a line while followed")
        reader.join(10)
        follow.cancel()
        with pytest.raises(grpc.RpcError) as refused:
            list(bob.StreamMasterLogs(api_pb2.StreamMasterLogsRequest()))
    finally:
        admin_channel.close()
        bob_channel.close()

    assert any("assay-master listening on 127.0.0.1" in line.message for line in kept)
    assert [line.id for line in last_two] == [line.id for line in kept[-2:]]
    assert [line.id for line in kept] == sorted(line.id for line in kept)
    assert got[-1].message == "a line while followed"
    assert (got[-1].level, got[-1].logger) == ("WARNING", "assay.master")
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "only an administrator may read the master's log; bob is not" in str(
        refused.value.details()
    )


def test_the_made_admin_password_never_reaches_the_log_shown(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    config = dataclasses.replace(
        master_config(state_dir=seeded(tmp_path / "master")), initial_admin_password=None
    )
    server = MasterServer(config)
    try:
        made = next(
            r.args[0]  # type: ignore[index]
            for r in caplog.records
            if r.getMessage().startswith("created user admin with the password")
        )
        lines = server.master_logs.after()
    finally:
        server.stop(grace=0)

    said = [line.message for line in lines if "created user admin" in line.message]
    assert said == [
        f"created user admin with the password {MASK} -- log in with `assay user login admin` "
        "and change it with `assay user change-password`"
    ]
    assert not any(str(made) in line.message for line in lines)


def test_the_buffer_keeps_the_newest_lines_and_masks_secret_values() -> None:
    buffer = MasterLogBuffer(size=3)
    log = logging.getLogger("assay.test-buffer")
    log.setLevel(logging.INFO)
    try:
        for i in range(4):
            log.info("line %d", i)
        log.info("retrying with password=%s", "hunter2")
        log.info("made %s", "tok-123", extra={SECRET_ARGS: True})
    finally:
        buffer.close()
    log.info("after close")

    assert [line.message for line in buffer.after()] == [
        "line 3",
        f"retrying with password={MASK}",
        f"made {MASK}",
    ]
    assert [line.id for line in buffer.after()] == [4, 5, 6]
    assert [line.message for line in buffer.after(5)] == [f"made {MASK}"]


def test_the_cli_shows_the_versions_config_and_log_or_says_who_may(
    logged_master: MasterServer,
) -> None:
    address = f"127.0.0.1:{logged_master.port}"
    bob = {"ASSAY_USER": "bob", "ASSAY_PASSWORD": BOB_PASSWORD}

    version = run_cli("version", master=address)
    as_json = run_cli("version", "--json", master=address)
    config = run_cli("master", "config", master=address)
    logs = run_cli("master", "logs", "--tail", 3, master=address)
    refused = run_cli("master", "config", master=address, env=bob)
    refused_logs = run_cli("master", "logs", master=address, env=bob)

    assert version.returncode == 0, version.stderr
    assert version.stdout == f"client: {__version__}\nmaster: {__version__} at {address}\n"
    assert json.loads(as_json.stdout) == {
        "client": __version__,
        "master_address": address,
        "master": __version__,
        "master_error": None,
    }
    assert config.returncode == 0, config.stderr
    assert "join_token: <hidden>\n" in config.stdout
    assert JOIN_TOKEN not in config.stdout
    assert logs.returncode == 0, logs.stderr
    shown = logs.stdout.splitlines()
    assert 1 <= len(shown) <= 3, logs.stdout
    assert all(re.match(r"\d{4}-\d\d-\d\dT[\d:.]+Z [A-Z]+ assay\.\S+: ", line) for line in shown)
    assert "INFO assay.master: assay-master listening on 127.0.0.1" in shown[-1]
    for done, what in ((refused, "settings"), (refused_logs, "log")):
        assert done.returncode == 1
        assert TRACEBACK not in done.stderr
        assert done.stderr.strip() == (
            f"error: only an administrator may read the master's {what}; bob is not"
        )


def test_version_without_a_master_still_says_the_clients() -> None:
    done = run_cli("version", master="127.0.0.1:1")

    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"client: {__version__}"
    assert lines[1].startswith("master: unknown at 127.0.0.1:1: cannot reach the master")
