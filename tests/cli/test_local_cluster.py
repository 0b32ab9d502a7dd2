"""`assay deploy local up|demo`: the newcomer's cluster, with real daemons on loopback.

Each test runs the CLI as a subprocess in a fresh HOME with no ASSAY_* variables, as a
new shell would, so what it finds is only what `up` left behind.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import socket
import stat
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
import torch
import yaml

import assay
from assay._rank_processes import free_port
from assay.cli._deploy import _log_in, _read_private, _ui_line, _write_private, up
from assay.client import (
    DEFAULT_MASTER,
    Client,
    StoredSession,
    forget_session,
    load_session,
    master_key,
    save_session,
)
from assay.proto import api_pb2, api_pb2_grpc
from tests.fixtures.regression.model_def import RegressionTrial
from tests.store.conftest import postgres_url

from .conftest import CONFIG, REGRESSION_DIR, FakeApi, run_cli

__all__ = ["postgres_url"]

pytestmark = pytest.mark.slow


class Shell:
    """A new shell: its own HOME, no ASSAY_* variables, the CLI as a subprocess."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("ASSAY_")}
        self.env["HOME"] = str(home)

    def run(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "assay.cli.main", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
            check=False,
        )


@pytest.fixture
def shell(tmp_path: Path) -> Iterator[Shell]:
    home = tmp_path / "home"
    home.mkdir()
    sh = Shell(home)
    yield sh
    sh.run("deploy", "local", "down", "--state-dir", str(home / "state"))


def _up(sh: Shell, port: int, http_port: int) -> subprocess.CompletedProcess[str]:
    state = str(sh.home / "state")
    args = ["--port", str(port), "--http-port", str(http_port), "--state-dir", state]
    return sh.run("deploy", "local", "up", "--agents", "1", "--slots-per-agent", "1", *args)


def test_the_cli_default_master_is_the_one_up_starts() -> None:
    port = next(p for p in up.params if p.name == "port")

    assert f"127.0.0.1:{port.default}" == DEFAULT_MASTER
    assert master_key("localhost") == master_key(DEFAULT_MASTER)


def test_up_logs_in_every_new_shell_and_serves_the_ui(shell: Shell) -> None:
    port, http_port = free_port(), free_port()

    started = _up(shell, port, http_port)

    assert started.returncode == 0, started.stderr
    assert f"web UI: http://127.0.0.1:{http_port}/\n" in started.stdout
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/", timeout=10) as page:
        assert "<script" in page.read().decode()
    kept = shell.home / "state" / "admin-password"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    password = kept.read_text().strip()
    assert f"logged in as admin (password kept in {kept})\n" in started.stdout
    assert password not in started.stdout + started.stderr  # shown nowhere, kept there
    # Another shell, the address written another way: the same master, the same session.
    for address in (f"localhost:{port}", f"127.0.0.1:{port}", f"LOCALHOST:{port}"):
        who = shell.run("-m", address, "user", "whoami")
        assert who.returncode == 0, who.stderr
        assert who.stdout.startswith("admin")


def test_a_second_up_logs_in_with_the_kept_password(shell: Shell) -> None:
    port, http_port = free_port(), free_port()
    assert _up(shell, port, http_port).returncode == 0
    assert (
        shell.run("deploy", "local", "down", "--state-dir", str(shell.home / "state")).returncode
        == 0
    )
    (shell.home / ".assay" / "auth.json").unlink()  # as on another account's first day

    again = _up(shell, port, http_port)

    assert again.returncode == 0, again.stderr
    assert "logged in as admin" in again.stdout
    assert "wrong" not in again.stdout + again.stderr
    assert shell.run("-m", f"localhost:{port}", "user", "whoami").returncode == 0


def test_a_store_without_a_kept_password_says_how_to_log_in(shell: Shell) -> None:
    port, http_port = free_port(), free_port()
    assert _up(shell, port, http_port).returncode == 0
    assert (
        shell.run("deploy", "local", "down", "--state-dir", str(shell.home / "state")).returncode
        == 0
    )
    (shell.home / "state" / "admin-password").unlink()
    (shell.home / ".assay" / "auth.json").unlink()

    again = _up(shell, port, http_port)

    assert again.returncode == 0, again.stderr
    assert "not logged in" in again.stdout
    assert "assay user login admin" in again.stdout
    assert "wrong" not in again.stdout + again.stderr
    assert not (shell.home / "state" / "admin-password").exists()  # no password it cannot know


def test_up_refuses_a_taken_http_port_and_starts_nothing(shell: Shell) -> None:
    port = free_port()
    with http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler) as busy:
        refused = _up(shell, port, busy.server_address[1])

    assert refused.returncode == 1
    assert refused.stderr.startswith(f"error: port {busy.server_address[1]} is in use")
    assert not (shell.home / "state" / "pids.json").exists()


def test_demo_runs_an_experiment_to_the_end_names_its_page_and_its_model_loads(
    shell: Shell, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    port, http_port = free_port(), free_port()
    state = ["--state-dir", str(shell.home / "state")]
    ports = ["--port", str(port), "--http-port", str(http_port)]

    first = shell.run("deploy", "local", "demo", str(config), str(REGRESSION_DIR), *ports, *state)
    second = shell.run("deploy", "local", "demo", str(config), str(REGRESSION_DIR), *state)

    assert first.returncode == 0, first.stdout + first.stderr
    assert f"web UI: http://127.0.0.1:{http_port}/\n" in first.stdout
    assert re.search(
        rf"See it in the web UI: http://127.0.0.1:{http_port}/experiments/1 ", first.stdout
    )
    # --follow's progress, shown as it runs, then its summary naming the best checkpoint.
    summary = re.search(
        r"^experiment 1 COMPLETED: best val_loss \S+ \(trial \d+\), checkpoint ([0-9a-f-]{36})$",
        first.stdout,
        re.MULTILINE,
    )
    assert summary is not None, first.stdout
    assert "Created experiment 1\n" in first.stdout
    assert first.stdout.index("Created experiment 1") < summary.start()
    assert second.returncode == 0, second.stdout + second.stderr
    assert "using the local cluster already running" in second.stdout
    assert "/experiments/2 " in second.stdout
    listed = shell.run("-m", f"localhost:{port}", "experiment", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [e["state"] for e in json.loads(listed.stdout.splitlines()[-1])] == ["COMPLETED"] * 2
    checkpoints = shell.run("-m", f"localhost:{port}", "checkpoint", "list", "1", "--json")
    assert checkpoints.returncode == 0, checkpoints.stderr
    uuids = [c["uuid"] for c in json.loads(checkpoints.stdout.splitlines()[-1])]
    assert summary.group(1) in uuids

    # The trained model, loaded by uuid from the master and from a download.
    uuid = uuids[-1]
    master = ["-m", f"localhost:{port}"]
    # This process is the notebook: it finds the login `up` stored for that shell.
    monkeypatch.setenv("ASSAY_AUTH_FILE", str(shell.home / ".assay" / "auth.json"))
    monkeypatch.delenv("ASSAY_MASTER", raising=False)

    downloaded = shell.run(*master, "checkpoint", "download", uuid, str(tmp_path / "model"))
    by_uuid = assay.load_checkpoint(uuid, master=f"localhost:{port}")
    by_dir = assay.load_checkpoint(tmp_path / "model")
    missing = str(uuid[:-1]) + ("0" if uuid[-1] != "0" else "1")

    assert downloaded.returncode == 0, downloaded.stderr
    assert by_uuid.uuid == by_dir.uuid == uuid
    assert by_uuid.path != by_dir.path  # shared_fs: read where it is mounted
    assert by_uuid.models[0].keys() == by_dir.models[0].keys()
    for name, tensor in by_uuid.models[0].items():
        assert torch.equal(tensor, by_dir.models[0][name])
    trial = by_dir.load_trial(RegressionTrial)
    assert not trial.model.training
    with pytest.raises(assay.AssayError, match=missing):
        assay.load_checkpoint(missing, master=f"localhost:{port}")


def test_demo_outside_a_checkout_starts_nothing(shell: Shell, tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "assay.cli.main",
            "deploy",
            "local",
            "demo",
            "--state-dir",
            str(shell.home / "state"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=shell.env,
        cwd=tmp_path,
        check=False,
    )

    assert done.returncode == 1
    assert "run this from the root of an Assay checkout" in done.stderr
    assert not (shell.home / "state" / "pids.json").exists()


class _Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"<html><h1>Assay master</h1><p>The web UI is not built</p></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_the_ui_line_tells_a_missing_build_and_a_silent_port(tmp_path: Path) -> None:
    with http.server.HTTPServer(("127.0.0.1", 0), _Page) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            url = f"http://127.0.0.1:{server.server_address[1]}/"
            unbuilt = _ui_line(url, tmp_path / "master.log")
        finally:
            server.shutdown()
    silent = _ui_line(f"http://127.0.0.1:{free_port()}/", tmp_path / "master.log")
    absent = _ui_line(None, tmp_path / "master.log")

    assert (
        unbuilt
        == f"web UI: {url} serves no UI: this install has no built web UI (master/webui_dist)"
    )
    assert silent.startswith("web UI: http://127.0.0.1:")
    assert "does not answer" in silent
    assert absent == f"web UI: not served (see {tmp_path / 'master.log'})"


@pytest.mark.parametrize(
    ("typed", "key"),
    [
        ("localhost:8090", "127.0.0.1:8090"),
        ("LocalHost", "127.0.0.1:8090"),
        ("127.0.0.1", "127.0.0.1:8090"),
        ("[::1]:8090", "127.0.0.1:8090"),
        ("::1", "127.0.0.1:8090"),
        ("10.0.0.5", "10.0.0.5:8090"),
        ("Master.Example:9000", "master.example:9000"),
        ("[fe80::1]:9000", "[fe80::1]:9000"),
        ("127.0.0.2:8090", "127.0.0.2:8090"),
    ],
)
def test_master_key(typed: str, key: str) -> None:
    assert master_key(typed) == key


def test_sessions_stored_under_another_spelling_are_found_and_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import datetime as dt

    auth = tmp_path / "auth.json"
    monkeypatch.setenv("ASSAY_AUTH_FILE", str(auth))
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=1)
    # A file written before keys were normalised.
    auth.write_text(
        json.dumps(
            {
                "sessions": {
                    "localhost:8090": {
                        "username": "a",
                        "token": "t1",
                        "expires_at": later.isoformat(),
                    },
                    "other:8090": {"username": "b", "token": "t2", "expires_at": later.isoformat()},
                }
            }
        )
    )

    found = load_session("127.0.0.1:8090")
    save_session("[::1]:8090", StoredSession("c", "t3", later))
    stored = json.loads(auth.read_text())["sessions"]
    forgotten = forget_session("localhost")
    after = json.loads(auth.read_text())["sessions"]

    assert found is not None
    assert found.token == "t1"
    assert sorted(stored) == ["127.0.0.1:8090", "other:8090"]
    assert stored["127.0.0.1:8090"]["token"] == "t3"
    assert forgotten
    assert sorted(after) == ["other:8090"]
    assert load_session("localhost:8090") is None


@pytest.mark.parametrize(
    ("typed", "dialled"),
    [
        ("master.example", "master.example:8090"),
        ("Master.Example:9000", "Master.Example:9000"),
        ("127.0.0.1", "127.0.0.1:8090"),
        ("[::1]", "[::1]:8090"),
        ("[::1]:9000", "[::1]:9000"),
        ("fe80::1", "[fe80::1]:8090"),
    ],
)
def test_the_client_dials_the_port_the_session_is_kept_for(typed: str, dialled: str) -> None:
    assert Client(typed).address == dialled
    assert master_key(dialled) == master_key(typed)


def test_a_master_named_without_a_port_gets_its_stored_session_on_8090(tmp_path: Path) -> None:
    import datetime as dt

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    fake = FakeApi()  # type: ignore[abstract]  # handlers set from the descriptor
    fake.responses["WhoAmI"] = api_pb2.User(username="kept", active=True)
    api_pb2_grpc.add_ApiServicer_to_server(fake, server)
    try:
        # Another loopback address, so that a master on this machine's 8090 is not in the way.
        if server.add_insecure_port("127.0.0.2:8090") == 0:
            pytest.skip("127.0.0.2:8090 cannot be bound here")
    except RuntimeError:
        pytest.skip("127.0.0.2:8090 cannot be bound here")
    server.start()
    auth = tmp_path / "auth.json"
    later = (dt.datetime.now(dt.UTC) + dt.timedelta(days=1)).isoformat()
    session = {"username": "kept", "token": "ast_kept", "expires_at": later}
    auth.write_text(json.dumps({"sessions": {"127.0.0.2:8090": session}}))
    env = {"ASSAY_AUTH_FILE": str(auth), "ASSAY_USER": "", "ASSAY_PASSWORD": ""}
    try:
        who = run_cli("user", "whoami", master="127.0.0.2", env=env, timeout=30)
    finally:
        server.stop(None)

    assert who.returncode == 0, who.stderr
    assert who.stdout.startswith("kept")
    assert fake.tokens == [("WhoAmI", "Bearer ast_kept")]


def _down(sh: Shell) -> None:
    done = sh.run("deploy", "local", "down", "--state-dir", str(sh.home / "state"))
    assert done.returncode == 0, done.stderr


def test_a_given_initial_password_is_kept_for_the_next_up(shell: Shell) -> None:
    port, http_port = free_port(), free_port()
    shell.env["ASSAY_INITIAL_ADMIN_PASSWORD"] = "given-pa55word"
    first = _up(shell, port, http_port)
    assert first.returncode == 0, first.stderr
    _down(shell)
    del shell.env["ASSAY_INITIAL_ADMIN_PASSWORD"]
    (shell.home / ".assay" / "auth.json").unlink()

    again = _up(shell, port, http_port)

    kept = shell.home / "state" / "admin-password"
    assert "logged in as admin" in first.stdout
    assert kept.read_text() == "given-pa55word\n"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert again.returncode == 0, again.stderr
    assert f"logged in as admin (password kept in {kept})" in again.stdout
    assert "given-pa55word" not in first.stdout + again.stdout


def test_up_on_a_new_postgresql_database_logs_in(shell: Shell, postgres_url: str) -> None:
    port, http_port = free_port(), free_port()

    started = shell.run(
        "deploy", "local", "up", "--agents", "0", "--port", str(port), "--http-port",
        str(http_port), "--state-dir", str(shell.home / "state"), "--db-url", postgres_url,
    )  # fmt: skip

    assert started.returncode == 0, started.stderr
    assert "logged in as admin" in started.stdout
    kept = shell.home / "state" / "admin-password"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    who = shell.run("-m", f"localhost:{port}", "user", "whoami")
    assert who.returncode == 0, who.stderr
    assert who.stdout.startswith("admin")


@pytest.mark.parametrize("kind", ["link", "mode-0644", "directory", "fifo"])
def test_an_unsafe_password_file_is_refused_and_nothing_starts(
    shell: Shell, tmp_path: Path, kind: str
) -> None:
    state = shell.home / "state"
    state.mkdir()
    kept = state / "admin-password"
    target = tmp_path / "elsewhere"
    target.write_text("planted\n")
    target.chmod(0o600)
    if kind == "link":
        kept.symlink_to(target)
    elif kind == "mode-0644":
        kept.write_text("planted\n")
        kept.chmod(0o644)
    elif kind == "directory":
        kept.mkdir()
    else:
        os.mkfifo(kept, 0o600)

    refused = _up(shell, free_port(), free_port())

    assert refused.returncode == 1
    assert refused.stderr.startswith(f"error: {kept} "), refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert not (state / "pids.json").exists()
    assert target.read_text() == "planted\n"


def test_the_password_file_is_written_new_and_never_through_a_link(tmp_path: Path) -> None:
    kept = tmp_path / "admin-password"
    target = tmp_path / "target"
    target.write_text("theirs\n")
    kept.symlink_to(target)

    _write_private(kept, "mine\n")

    assert not kept.is_symlink()
    assert kept.read_text() == "mine\n"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert target.read_text() == "theirs\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["admin-password", "target"]
    assert _read_private(kept) == "mine"
    assert _read_private(tmp_path / "none") is None


def test_log_in_names_the_real_error_and_drops_a_password_made_for_nothing(
    master: FakeApi,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("ASSAY_AUTH_FILE", str(tmp_path / "auth.json"))
    kept = tmp_path / "admin-password"
    silent = f"127.0.0.1:{free_port()}"

    _write_private(kept, "made\n")
    _log_in(silent, "made", "made", kept)
    unreachable = capsys.readouterr().out
    master.errors["Login"] = (grpc.StatusCode.UNAUTHENTICATED, "wrong username or password")
    _log_in(master.address, "made", "kept", kept)
    changed = capsys.readouterr().out
    kept_after_changed = kept.exists()
    _log_in(master.address, "made", "made", kept)
    made = capsys.readouterr().out

    assert unreachable.startswith(f"not logged in: cannot reach the master at {silent}")
    assert "changed" not in unreachable
    assert kept_after_changed  # a reachable master, another password: the file is the user's
    assert f"admin's password was changed since it was kept in {kept}" in changed
    assert "not logged in: this store's admin was made before" in made
    assert "assay user login admin" in made
    assert not kept.exists()


# A pynvml ahead of the real one on the agents' path: two H100s (this machine has none),
# as tests/agent/conftest.py's FakeNVML reports them, or a machine without the driver.
FAKE_PYNVML = """
from types import SimpleNamespace

def nvmlInit(): pass
def nvmlShutdown(): pass
def nvmlDeviceGetCount(): return 2
def nvmlDeviceGetHandleByIndex(index): return index
def nvmlDeviceGetName(handle): return "NVIDIA H100 80GB HBM3"
def nvmlDeviceGetUUID(handle): return f"GPU-0000000{handle}-aaaa"
def nvmlDeviceGetMemoryInfo(handle):
    return SimpleNamespace(total=80 * 2**30, used=2**30, free=79 * 2**30)
def nvmlDeviceGetUtilizationRates(handle): return SimpleNamespace(gpu=25, memory=10)
"""
BROKEN_PYNVML = "def nvmlInit():\n    raise RuntimeError('NVML Shared Library Not Found')\n"


def _with_pynvml(shell: Shell, tmp_path: Path, source: str) -> None:
    folder = tmp_path / "nvml"
    folder.mkdir()
    (folder / "pynvml.py").write_text(source)
    shell.env["PYTHONPATH"] = os.pathsep.join([str(folder), *sys.path])


def _up_args(shell: Shell, port: int, *extra: str) -> list[str]:
    state = str(shell.home / "state")
    return ["deploy", "local", "up", "--port", str(port), "--http-port", "0", "--state-dir",
            state, *extra]  # fmt: skip


def test_up_says_what_it_is_doing_on_stderr_as_it_goes(shell: Shell) -> None:
    from assay.master.store._migrate import head_revision

    port = free_port()

    first = shell.run(*_up_args(shell, port, "--slots-per-agent", "1"))
    _down(shell)
    again = shell.run(*_up_args(shell, port, "--slots-per-agent", "1"))

    assert first.returncode == 0, first.stderr
    state = shell.home / "state"
    steps = [
        f"starting the master on 127.0.0.1:{port} (store: {state / 'master' / 'assay.db'}; "
        f"log: {state / 'logs' / 'master.log'})",
        "migrating the store to this release's schema ...",
        "master up after ",
        "waiting for agent local-0 to find slots and join the master",
        "agent local-0 joined after ",
    ]
    lines = first.stderr.splitlines()
    assert len(lines) == len(steps), first.stderr
    for line, step in zip(lines, steps, strict=True):
        assert line.startswith(step), (line, step)
    assert lines[2].endswith(f" schema migrations run, now at revision {head_revision()})")
    assert "master at 127.0.0.1" in first.stdout  # the results stay on stdout
    assert "starting the master" not in first.stdout
    # A store already at this release's schema: nothing to migrate, and not said.
    assert again.returncode == 0, again.stderr
    assert "migrating" not in again.stderr
    assert re.search(r"^master up after \d+\.\d s$", again.stderr, re.MULTILINE), again.stderr


def test_up_offers_the_gpus_nvml_finds_and_says_so(shell: Shell, tmp_path: Path) -> None:
    _with_pynvml(shell, tmp_path, FAKE_PYNVML)
    port = free_port()

    started = shell.run(*_up_args(shell, port))
    listed = shell.run("-m", f"127.0.0.1:{port}", "agent", "list", "--json")

    assert started.returncode == 0, started.stderr
    assert (
        "agent local-0: 2 GPU slots (NVIDIA H100 80GB HBM3), by --slot-type auto (NVML found "
        "GPUs; --slot-type cpu offers the CPUs instead)\n"
    ) in started.stdout
    assert listed.returncode == 0, listed.stderr
    [agent] = json.loads(listed.stdout.splitlines()[-1])
    assert (agent["id"], agent["slot_type"], agent["slots"]) == ("local-0", "CUDA", 2)


def test_up_without_a_gpu_offers_the_cpus_and_says_why(shell: Shell, tmp_path: Path) -> None:
    _with_pynvml(shell, tmp_path, BROKEN_PYNVML)

    started = shell.run(*_up_args(shell, free_port(), "--slots-per-agent", "3"))

    assert started.returncode == 0, started.stderr
    assert re.search(
        r"^agent local-0: 3 CPU slots \(.+\), by --slot-type auto \(no GPU found: NVML "
        r"failed: NVML Shared Library Not Found\)$",
        started.stdout,
        re.MULTILINE,
    ), started.stdout


def test_up_asked_for_gpus_on_a_machine_without_stops_all_it_started(
    shell: Shell, tmp_path: Path
) -> None:
    _with_pynvml(shell, tmp_path, BROKEN_PYNVML)
    port = free_port()

    refused = shell.run(*_up_args(shell, port, "--slot-type", "cuda"))

    assert refused.returncode == 1
    last = refused.stderr.splitlines()[-1]
    assert last.startswith(
        "error: agent local-0 exited: --slot-type cuda, but no GPU was found (NVML failed: "
        "NVML Shared Library Not Found)"
    ), refused.stderr
    assert last.endswith("; stopped the master and agents this started")
    assert not (shell.home / "state" / "pids.json").exists()
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0  # the master is gone
