"""Default deny: every RPC and every HTTP route refuses calls without valid credentials.

Each bad credential is tried on every method of every service (read from the proto
descriptors, so a new RPC is covered the day it is added) and on every HTTP route (read
from the route table): none gets past the guard, and nothing is stored. Users change only
their own experiments; agents without the join token never register.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import secrets
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from assay.master._server import MasterServer, check_join_token
from assay.master.api import ROUTES
from assay.proto import agent_pb2, agent_pb2_grpc, api_pb2, common_pb2
from tests.credentials import ADMIN_PASSWORD, authed_api, login
from tests.http.conftest import Site, open_site, site

__all__ = ["site"]  # the fixture: a fresh master for one test
from tests.master.conftest import ScriptedAgent, experiment_yaml, model_archive

_SERVICES = [
    api_pb2.DESCRIPTOR.services_by_name["Api"],
    agent_pb2.DESCRIPTOR.services_by_name["AgentService"],
]
_TRIAL_SERVICE = "assay.v1.TrialService"


def _expired_token(master: MasterServer) -> str:
    """A real session of admin's whose time is over."""
    token = "ast_" + secrets.token_urlsafe(32)
    user = master.store.get_user("admin")
    past = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    digest = hashlib.sha256(token.encode()).hexdigest()
    master.store.create_session(user.id, digest, past, created_at=past - dt.timedelta(days=7))
    return token


def _bad_credentials(master: MasterServer) -> dict[str, list[tuple[str, str]]]:
    valid = login(f"127.0.0.1:{master.port}")
    tampered = valid[:-4] + ("AAAA" if not valid.endswith("AAAA") else "BBBB")
    return {
        "none": [],
        "empty bearer": [("authorization", "Bearer ")],
        "not a token": [("authorization", "Bearer hello")],
        "tampered": [("authorization", f"Bearer {tampered}")],
        "expired": [("authorization", f"Bearer {_expired_token(master)}")],
        "basic scheme": [("authorization", f"Basic {valid}")],
        "logged out": [("authorization", f"Bearer {_logged_out(master)}")],
    }


def _logged_out(master: MasterServer) -> str:
    token = login(f"127.0.0.1:{master.port}")
    master.auth.logout(token)
    return token


def _methods() -> Iterator[tuple[str, Any]]:
    for service in _SERVICES:
        for method in service.methods:
            if method.full_name == "assay.v1.Api.Login":
                continue
            yield f"/{service.full_name}/{method.name}", method


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    site = open_site(tmp_path_factory.mktemp("guard") / "master")
    yield site
    site.close()


def _call(channel: grpc.Channel, path: str, method: Any, metadata: list[tuple[str, str]]) -> Any:
    request = method.input_type._concrete_class()
    serialize = type(request).SerializeToString
    if method.client_streaming:
        call = channel.stream_stream(path, request_serializer=serialize)
        replies = call(iter([request]), metadata=metadata, timeout=10)
        return next(iter(replies))
    if method.server_streaming:
        stream = channel.unary_stream(path, request_serializer=serialize)
        return list(stream(request, metadata=metadata, timeout=10))
    unary = channel.unary_unary(path, request_serializer=serialize)
    return unary(request, metadata=metadata, timeout=10)


def test_every_rpc_refuses_every_bad_credential(guarded: Site) -> None:
    master = guarded.master
    before = master.store.list_experiments().total
    refused = 0
    with grpc.insecure_channel(f"127.0.0.1:{master.port}") as channel:
        for name, metadata in _bad_credentials(master).items():
            for path, method in _methods():
                with pytest.raises(grpc.RpcError) as caught:
                    _call(channel, path, method, metadata)
                assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED, (path, name)
                refused += 1
            # The harness's service takes only a running allocation's token.
            for method in ("NextOperation", "ReportMetrics", "ShouldPreempt"):
                path = f"/{_TRIAL_SERVICE}/{method}"
                unary = channel.unary_unary(path, request_serializer=lambda _: b"")
                with pytest.raises(grpc.RpcError) as caught:
                    unary(b"", metadata=[*metadata, ("x-assay-token", "forged")], timeout=10)
                assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED, (path, name)
                refused += 1
    assert refused >= 7 * 20
    assert master.store.list_experiments().total == before


def test_an_unknown_method_is_refused(guarded: Site) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{guarded.master.port}") as channel:
        call = channel.unary_unary("/assay.v1.Nothing/Here", request_serializer=lambda _: b"")
        with pytest.raises(grpc.RpcError) as caught:
            call(b"", timeout=10)
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


def _http(site: Site, method: str, path: str, headers: dict[str, str]) -> tuple[int, Any]:
    body = b"{}" if method == "POST" else None
    sent = {"Content-Type": "application/json", **headers}
    request = urllib.request.Request(site.base + path, data=body, method=method, headers=sent)
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, json.loads(reply.read() or b"null")
    except urllib.error.HTTPError as e:
        with e:
            return e.code, json.loads(e.read() or b"null")


def _fill(path: str) -> str:
    values = {
        "{id}": "1",
        "{trial_id}": "1",
        "{action}": "pause",
        "{uuid}": "x",
        "{username}": "u",
        "{name}": "priority",
        "{version}": "1",
        "{workspace}": "w",
        "{pool}": "default",
    }
    for key, value in values.items():
        path = path.replace(key, value)
    return path


def test_every_http_route_refuses_every_bad_credential(guarded: Site) -> None:
    master = guarded.master
    before = master.store.list_experiments().total
    refused = 0
    routes = [(r.method, r.url) for r in ROUTES if r.rpc != "Login"]
    routes.append(("GET", "/api/v1/openapi.json"))
    for name, metadata in _bad_credentials(master).items():
        headers = dict(metadata)
        for method, url in routes:
            status, body = _http(guarded, method, _fill(url), headers)
            assert status == 401, (method, url, name, body)
            assert "log in" in body["error"] or "session" in body["error"], body
            refused += 1
    assert refused == 7 * len(routes)  # 24 routes
    assert master.store.list_experiments().total == before
    # What stays open: health, login, and the UI's files.
    assert _http(guarded, "GET", "/api/v1/health", {})[0] == 200


def test_a_viewer_changes_no_experiment_of_the_workspace(guarded: Site) -> None:
    master = guarded.master
    address = f"127.0.0.1:{master.port}"
    master.auth.create_user("bob", "bob-password-1")
    admins = guarded.create(activate=False)
    bob, channel = authed_api(address, login(address, "bob", "bob-password-1"))
    try:
        own = bob.CreateExperiment(
            api_pb2.CreateExperimentRequest(
                config_yaml=experiment_yaml(), model_definition=model_archive(), activate=True
            )
        ).experiment
        assert own.owner == "bob"
        paused = bob.ExperimentAction(
            api_pb2.ExperimentActionRequest(id=own.id, action=api_pb2.EXPERIMENT_ACTION_PAUSE)
        )
        assert paused.state == common_pb2.EXPERIMENT_STATE_PAUSED
        # Every user is an editor of the Default workspace; as a viewer bob only reads.
        guarded.api.SetWorkspaceMember(
            api_pb2.SetWorkspaceMemberRequest(workspace="Default", username="bob", role="viewer")
        )
        forbidden: list[Callable[[], object]] = [
            lambda: bob.ExperimentAction(
                api_pb2.ExperimentActionRequest(id=admins, action=api_pb2.EXPERIMENT_ACTION_KILL)
            ),
            lambda: bob.SetExperimentResource(
                api_pb2.SetExperimentResourceRequest(id=admins, name="priority", value="1")
            ),
            lambda: bob.SetAgentEnabled(api_pb2.SetAgentEnabledRequest(id="a", enabled=False)),
            lambda: bob.RemoveAgent(api_pb2.RemoveAgentRequest(id="a")),
            lambda: bob.CreateUser(api_pb2.CreateUserRequest(username="eve", password="x" * 12)),
            lambda: bob.SetUserActive(api_pb2.SetUserActiveRequest(username="admin")),
            lambda: bob.ChangePassword(
                api_pb2.ChangePasswordRequest(username="admin", new_password="y" * 12)
            ),
        ]
        for call in forbidden:
            with pytest.raises(grpc.RpcError) as caught:
                call()
            assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert master.store.get_experiment(admins).state == "PAUSED"
        # A viewer reads every experiment of the workspace.
        got = bob.GetExperiment(api_pb2.GetExperimentRequest(id=admins))
        assert got.experiment.owner == "admin"
    finally:
        channel.close()
    # The admin may act on bob's experiment.
    killed = guarded.api.ExperimentAction(
        api_pb2.ExperimentActionRequest(id=own.id, action=api_pb2.EXPERIMENT_ACTION_KILL)
    )
    assert killed.state in (common_pb2.EXPERIMENT_STATE_CANCELED,)


def test_deactivation_and_password_changes_end_sessions(guarded: Site) -> None:
    master = guarded.master
    address = f"127.0.0.1:{master.port}"
    master.auth.create_user("carol", "carol-password-1")
    token = login(address, "carol", "carol-password-1")
    carol, channel = authed_api(address, token)
    try:
        assert carol.WhoAmI(api_pb2.WhoAmIRequest()).username == "carol"
        guarded.api.SetUserActive(api_pb2.SetUserActiveRequest(username="carol", active=False))
        with pytest.raises(grpc.RpcError) as caught:
            carol.WhoAmI(api_pb2.WhoAmIRequest())
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as caught:
            login(address, "carol", "carol-password-1")
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        channel.close()


def test_failed_logins_are_limited(site: Site) -> None:
    address = f"127.0.0.1:{site.master.port}"
    site.master.auth.create_user("dave", "dave-password-1")
    codes = []
    for _ in range(7):
        with pytest.raises(grpc.RpcError) as caught:
            login(address, "dave", "wrong-password")
        codes.append(caught.value.code())
    assert codes[:5] == [grpc.StatusCode.UNAUTHENTICATED] * 5
    assert codes[-1] == grpc.StatusCode.RESOURCE_EXHAUSTED
    # Locked out for now even with the right password; the message says when to retry.
    with pytest.raises(grpc.RpcError) as caught:
        login(address, "dave", "dave-password-1")
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_an_agent_without_the_join_token_is_refused(guarded: Site) -> None:
    port = guarded.master.port
    register = agent_pb2.AgentMessage(
        register=agent_pb2.Register(
            agent_id="intruder", slot_type=common_pb2.SLOT_TYPE_CPU, address="127.0.0.1"
        )
    )
    for metadata in ([], [("x-assay-join-token", "wrong")]):
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stream = agent_pb2_grpc.AgentServiceStub(channel).Connect(
                iter([register]), metadata=metadata
            )
            with pytest.raises(grpc.RpcError) as caught:
                next(stream)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "intruder" not in guarded.master.master.agents
    assert all(a.id != "intruder" for a in guarded.master.store.list_agents())
    # With the token it joins.
    agent = ScriptedAgent(port, "member", slots=1)
    agent.close()


def test_the_first_admin_password_is_never_reset(tmp_path: Any) -> None:
    site = open_site(tmp_path / "m")
    try:
        site.api.ChangePassword(
            api_pb2.ChangePasswordRequest(old_password=ADMIN_PASSWORD, new_password="n" * 12)
        )
    finally:
        site.close()
    # The same store, started again with the same configured first password.
    again = MasterServer(site.master.config)
    again.start()
    try:
        address = f"127.0.0.1:{again.port}"
        with pytest.raises(grpc.RpcError):
            login(address, "admin", ADMIN_PASSWORD)
        assert login(address, "admin", "n" * 12).startswith("ast_")
    finally:
        again.stop(grace=0)


# --- found by review: each was a way around the rules above ------------------------------


def test_a_followed_log_ends_when_its_user_is_deactivated(guarded: Site) -> None:
    master = guarded.master
    address = f"127.0.0.1:{master.port}"
    master.auth.create_user("gina", "gina-password-1")
    experiment = guarded.create(activate=True)
    trial_id = guarded.api.GetExperiment(api_pb2.GetExperimentRequest(id=experiment)).trials[0].id
    gina, channel = authed_api(address, login(address, "gina", "gina-password-1"))
    try:
        stream = gina.StreamTrialLogs(
            api_pb2.StreamTrialLogsRequest(trial_id=trial_id, follow=True)
        )
        guarded.api.SetUserActive(api_pb2.SetUserActiveRequest(username="gina", active=False))
        with pytest.raises(grpc.RpcError) as caught:
            for _ in stream:
                pass
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        channel.close()


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"username": ' + b"1" * 5000 + b', "password": "x"}',
        b'{"username": "a\\u0000b", "password": "x"}',
    ],
)
def test_malformed_logins_are_400_not_500(guarded: Site, body: bytes) -> None:
    reply = guarded.post("/api/v1/login", body, {"Content-Type": "application/json"}, auth=False)
    assert reply.status in (400, 401), reply.body[:300]


def test_yaml_aliases_are_refused(guarded: Site) -> None:
    bomb = "name: x\nlol: &a [1, 1, 1]\nlol2: [*a, *a, *a]\n" + experiment_yaml()
    with pytest.raises(grpc.RpcError) as caught:
        guarded.api.CreateExperiment(
            api_pb2.CreateExperimentRequest(config_yaml=bomb, model_definition=model_archive())
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "alias *a" in (caught.value.details() or "")


def test_the_web_ui_forbids_framing_and_foreign_scripts(guarded: Site) -> None:
    page = guarded.get("/", auth=False)
    assert "default-src 'self'" in page.headers["Content-Security-Policy"]
    assert page.headers["X-Frame-Options"] == "DENY"


@pytest.mark.parametrize(
    ("token", "said"),
    [
        ("short", "5 characters, 5 different"),
        ("a" * 16, "16 characters, 1 different"),  # once accepted
        ("abab" * 8, "32 characters, 2 different"),
        ("0123456789abcdef", "16 characters, 16 different"),  # 64 bits, but 16 is a floor
    ],
)
def test_a_guessable_join_token_is_refused_and_the_state_dir_is_private(
    tmp_path: Any, token: str, said: str
) -> None:
    from assay.errors import AssayError
    from assay.master._config import MasterConfig

    config = MasterConfig(
        join_token=token,
        initial_admin_password=ADMIN_PASSWORD,
        http_port=0,
        grpc_port=0,
        host="127.0.0.1",
        state_dir=tmp_path / "state",
    )
    if token == "0123456789abcdef":
        check_join_token(token)  # 16 x log2(16) = 64 bits: enough
        return
    with pytest.raises(AssayError, match=f"join_token is too easy to guess \\({said}\\)"):
        MasterServer(config)
    # Others may pass through to their checkpoints, never list it (tests/master/test_state_dir.py).
    assert (tmp_path / "state").stat().st_mode & 0o777 == 0o711


def test_random_join_tokens_pass() -> None:
    import secrets

    for _ in range(100):
        check_join_token(secrets.token_hex(12))  # openssl rand -hex 12: 24 characters
        check_join_token(secrets.token_urlsafe(16))


def test_a_call_looks_its_session_token_up_once(
    guarded: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard finds the caller; the handler uses what it found (gRPC, sync and async
    handlers, and HTTP), and each call sees its own caller."""
    master = guarded.master
    address = f"127.0.0.1:{master.port}"
    master.auth.create_user("dave", "dave-password-1")
    dave, channel = authed_api(address, login(address, "dave", "dave-password-1"))
    lookups: list[str] = []
    auth = master.auth
    for name in ("cached", "authenticate"):
        original = getattr(auth, name)

        def counted(token: str, _original: Any = original, _name: str = name) -> Any:
            found = _original(token)
            if found is not None:  # a miss in the cache is followed by `authenticate`
                lookups.append(_name)
            return found

        monkeypatch.setattr(auth, name, counted)
    try:
        for _ in range(3):
            lookups.clear()
            assert dave.WhoAmI(api_pb2.WhoAmIRequest()).username == "dave"
            assert len(lookups) == 1, lookups
            lookups.clear()
            assert guarded.api.WhoAmI(api_pb2.WhoAmIRequest()).username == "admin"
            assert len(lookups) == 1, lookups
        lookups.clear()
        request = api_pb2.CreateExperimentRequest(
            config_yaml=experiment_yaml(), model_definition=model_archive(), activate=False
        )
        assert dave.CreateExperiment(request).experiment.owner == "dave"
        assert len(lookups) == 1, lookups
    finally:
        channel.close()
    lookups.clear()
    reply = guarded.get("/api/v1/me")
    assert reply.status == 200
    assert reply.json()["username"] == "admin"
    assert len(lookups) == 1, lookups
