"""A real gRPC server with a scripted `assay.v1.Api`, and the CLI run as a real subprocess.

The fake servicer records every request and answers from `responses` (a message, a list
of messages for the log stream, or a function of the request); `errors` makes a method
abort with a status code and details, as the real master does for user mistakes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from google.protobuf import struct_pb2

from assay.proto import api_pb2, api_pb2_grpc, common_pb2

TRACEBACK = "Traceback (most recent call last)"
REGRESSION_DIR = Path(__file__).resolve().parent.parent / "fixtures" / "regression"

CONFIG: dict[str, Any] = {
    "name": "regression",
    "entrypoint": "model_def:RegressionTrial",
    "hyperparameters": {"global_batch_size": 16, "lr": 0.05},
    "searcher": {"name": "single", "metric": "val_loss", "max_length": {"batches": 8}},
}


@dataclass
class FakeApi(api_pb2_grpc.ApiServicer):
    responses: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, tuple[grpc.StatusCode, str]] = field(default_factory=dict)
    requests: list[tuple[str, Any]] = field(default_factory=list)
    # The authorization metadata each call carried, by method.
    tokens: list[tuple[str, str]] = field(default_factory=list)
    address: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def calls(self, method: str) -> list[Any]:
        with self.lock:
            return [r for m, r in self.requests if m == method]

    def answer(self, method: str, request: Any, context: grpc.ServicerContext) -> Any:
        with self.lock:
            self.requests.append((method, request))
            metadata = dict(context.invocation_metadata())
            self.tokens.append((method, str(metadata.get("authorization", ""))))
        if method in self.errors:
            code, details = self.errors[method]
            context.abort(code, details)
        if method not in self.responses:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{method}: no canned answer")
        response = self.responses[method]
        return response(request) if callable(response) else response


def _make_handler(name: str, streaming: bool) -> Callable[..., Any]:
    if streaming:

        def stream(self: FakeApi, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            yield from self.answer(name, request, context)

        return stream

    def unary(self: FakeApi, request: Any, context: grpc.ServicerContext) -> Any:
        return self.answer(name, request, context)

    return unary


for _method in api_pb2.DESCRIPTOR.services_by_name["Api"].methods:
    setattr(FakeApi, _method.name, _make_handler(_method.name, _method.server_streaming))


@pytest.fixture
def master() -> Iterator[FakeApi]:
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=8),
        options=[("grpc.max_receive_message_length", 128 * 2**20)],
    )
    fake = FakeApi()  # type: ignore[abstract]  # handlers set from the descriptor above
    # The CLI logs in by itself from ASSAY_USER / ASSAY_PASSWORD (tests/conftest.py).
    fake.responses["Login"] = login_response()
    api_pb2_grpc.add_ApiServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    fake.address = f"127.0.0.1:{port}"
    try:
        yield fake
    finally:
        server.stop(None)


FAKE_TOKEN = "ast_fake-session-token"


def login_response(username: str = "admin") -> api_pb2.LoginResponse:
    response = api_pb2.LoginResponse(
        token=FAKE_TOKEN, user=api_pb2.User(username=username, admin=True, active=True)
    )
    response.expires_at.FromJsonString("2099-01-01T00:00:00Z")
    return response


def run_cli(
    *args: object,
    master: FakeApi | str | None = None,
    timeout: float = 60,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """`assay [-m ADDRESS] ARGS...` in a fresh interpreter; ASSAY_MASTER is unset.
    `env`: variables to set on top (polls are every 0.05 s, progress lines unthrottled)."""
    extra = env or {}
    env = {k: v for k, v in os.environ.items() if k != "ASSAY_MASTER"}
    env["ASSAY_POLL_SECONDS"] = "0.05"
    env["ASSAY_PROGRESS_SECONDS"] = "0"
    env.update(extra)
    address = master.address if isinstance(master, FakeApi) else master
    prefix = ["-m", address] if address else []
    return subprocess.run(
        [sys.executable, "-m", "assay.cli.main", *prefix, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=cwd,
        check=False,
    )


def assert_ok(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    assert TRACEBACK not in done.stderr


def assert_one_line_error(done: subprocess.CompletedProcess[str], *parts: str) -> str:
    assert done.returncode == 1, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    assert TRACEBACK not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: "), done.stderr
    for part in parts:
        assert part in lines[0], lines[0]
    return lines[0]


def struct(value: dict[str, Any]) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(value)
    return s


def make_experiment(
    experiment_id: int = 7,
    state: int = common_pb2.EXPERIMENT_STATE_ACTIVE,
    **kwargs: Any,
) -> common_pb2.Experiment:
    return common_pb2.Experiment(
        id=experiment_id,
        name=kwargs.pop("name", "regression"),
        state=state,  # type: ignore[arg-type]
        config=struct(kwargs.pop("config", CONFIG)),
        searcher="single",
        **kwargs,
    )


def make_trial(
    trial_id: int = 11,
    state: int = common_pb2.TRIAL_STATE_RUNNING,
    **kwargs: Any,
) -> common_pb2.Trial:
    return common_pb2.Trial(
        id=trial_id,
        experiment_id=kwargs.pop("experiment_id", 7),
        state=state,  # type: ignore[arg-type]
        hparams=struct(kwargs.pop("hparams", {"global_batch_size": 16, "lr": 0.05})),
        **kwargs,
    )


def experiment_response(
    state: int = common_pb2.EXPERIMENT_STATE_ACTIVE, trials: list[common_pb2.Trial] | None = None
) -> api_pb2.GetExperimentResponse:
    return api_pb2.GetExperimentResponse(
        experiment=make_experiment(state=state), trials=trials or []
    )


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(CONFIG))
    return path


@pytest.fixture
def model_dir() -> Path:
    return REGRESSION_DIR
