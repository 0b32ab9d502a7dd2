"""The credentials every test cluster uses, and stubs that present them.

Masters and agents started as processes read them from the environment (set for the
whole test session in tests/conftest.py); masters started in the test process get them
through `MasterConfig` (`master_config`). The CLI logs in by itself from ASSAY_USER and
ASSAY_PASSWORD, keeping its tokens in a file of the session's own.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from assay.master._config import MasterConfig
from assay.proto import api_pb2, api_pb2_grpc

ADMIN_PASSWORD = "test-admin-password"
JOIN_TOKEN = "test-join-token-6c1f8a2e"
JOIN_METADATA = (("x-assay-join-token", JOIN_TOKEN),)


def master_config(state_dir: Path, **overrides: Any) -> MasterConfig:
    """A master on loopback with free ports and the test cluster's credentials."""
    settings: dict[str, Any] = {
        "join_token": JOIN_TOKEN,
        "initial_admin_password": ADMIN_PASSWORD,
        "http_port": 0,
        "grpc_port": 0,
        "host": "127.0.0.1",
        **overrides,
    }
    return MasterConfig(state_dir=state_dir, **settings)


def login(address: str, username: str = "admin", password: str = ADMIN_PASSWORD) -> str:
    """A session token from the master at `address`."""
    with grpc.insecure_channel(address) as channel:
        stub = api_pb2_grpc.ApiStub(channel)
        request = api_pb2.LoginRequest(username=username, password=password)
        token: str = stub.Login(request, timeout=30).token
    return token


class _Bearer(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[misc]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[misc]
):
    def __init__(self, token: str) -> None:
        self.token = token

    def _with_token(self, details: Any) -> Any:
        metadata = [*(details.metadata or ()), ("authorization", f"Bearer {self.token}")]
        return details._replace(metadata=metadata)

    def intercept_unary_unary(
        self, continuation: Callable[..., Any], details: Any, request: Any
    ) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(
        self, continuation: Callable[..., Any], details: Any, request: Any
    ) -> Any:
        return continuation(self._with_token(details), request)


def authed_channel(address: str, token: str | None = None) -> grpc.Channel:
    """A channel whose every call carries a session token (admin's unless given)."""
    channel = grpc.insecure_channel(address)
    return grpc.intercept_channel(channel, _Bearer(token or login(address)))


def authed_api(address: str, token: str | None = None) -> tuple[api_pb2_grpc.ApiStub, grpc.Channel]:
    channel = authed_channel(address, token)
    return api_pb2_grpc.ApiStub(channel), channel
