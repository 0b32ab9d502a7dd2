"""`assay deploy local up|down`: a master and agents on this machine, as background processes.

State (the SQLite store, checkpoints, logs, pids) lives under --state-dir, so `down` finds
what `up` started, and `up` again resumes the same experiments.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import click

from ._common import user_errors

DEFAULT_STATE = Path.home() / ".assay" / "local"


@click.group()
def deploy() -> None:
    """Run Assay's daemons."""


@deploy.group()
def local() -> None:
    """A master and agents on this machine."""


@local.command("up")
@click.option("--agents", type=click.IntRange(min=0), default=1, show_default=True)
@click.option(
    "--slots-per-agent",
    type=click.IntRange(min=1),
    default=None,
    help="CPU slots per agent (default: the agent's own choice)",
)
@click.option("--slot-type", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--port", type=click.IntRange(1, 65535), default=8090, show_default=True)
@click.option(
    "--http-port",
    type=click.IntRange(0, 65535),
    default=8080,
    show_default=True,
    help="the web UI and HTTP API (0: any free port, named in the master's log)",
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_STATE,
    show_default=True,
)
@click.option("--db-url", default=None, help="a PostgreSQL URL instead of SQLite")
@user_errors
def up(
    agents: int,
    slots_per_agent: int | None,
    slot_type: str,
    port: int,
    http_port: int,
    state_dir: Path,
    db_url: str | None,
) -> None:
    """Start a master and AGENTS agents in the background."""
    from assay.errors import AssayError

    pids_file = state_dir / "pids.json"
    if pids_file.exists() and any(_alive(p) for p in json.loads(pids_file.read_text()).values()):
        raise AssayError(f"a local cluster from {state_dir} is already running; run down first")
    if _port_taken(port):
        raise AssayError(f"port {port} is in use; pick another with --port")
    logs = state_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    pids: dict[str, int] = {}
    master_cmd = [
        sys.executable,
        "-m",
        "assay.master.main",
        "--grpc-port",
        str(port),
        "--host",
        "127.0.0.1",
        "--state-dir",
        str(state_dir / "master"),
        "--http-port",
        str(http_port),
    ]
    if db_url:
        master_cmd += ["--db-url", db_url]
    # The first admin's password: the caller's, or one made here and kept next to the logs.
    password = os.environ.get("ASSAY_INITIAL_ADMIN_PASSWORD") or secrets.token_urlsafe(12)
    secret_env = {"ASSAY_INITIAL_ADMIN_PASSWORD": password}
    pids["master"] = _spawn(master_cmd, logs / "master.log", secret_env)
    pids_file.write_text(json.dumps(pids))  # so that `down` can stop it whatever happens next
    address = f"127.0.0.1:{port}"
    if not _wait_for_port(port, pids["master"], timeout=60):
        _stop(pids["master"])
        pids_file.unlink(missing_ok=True)
        raise AssayError(f"the master did not start; see {logs / 'master.log'}")
    join_token = os.environ.get("ASSAY_JOIN_TOKEN") or _read_join_token(state_dir / "master")
    for i in range(agents):
        cmd = [
            sys.executable,
            "-m",
            "assay.agent.main",
            "--master",
            address,
            "--slot-type",
            slot_type,
            "--agent-id",
            f"local-{i}",
            "--work-dir",
            str(state_dir / f"agent-{i}"),
        ]
        if slots_per_agent is not None:
            cmd += ["--slots", str(slots_per_agent)]
        pids[f"agent-{i}"] = _spawn(cmd, logs / f"agent-{i}.log", {"ASSAY_JOIN_TOKEN": join_token})
    pids_file.write_text(json.dumps(pids))
    click.echo(f"master at {address} (logs in {logs}); {agents} agent(s) started")
    _log_in(address, password)
    click.echo(f"export ASSAY_MASTER={address}")


def _read_join_token(master_state: Path) -> str:
    from assay.errors import AssayError

    path = master_state / "join-token"
    for _ in range(50):
        if path.exists():
            return path.read_text().strip()
        time.sleep(0.1)
    raise AssayError(f"the master wrote no join token to {path}")


def _log_in(address: str, password: str) -> None:
    """Log this user in as admin, so the next commands work without `assay user login`."""
    from ._client import Client, MasterError

    c = Client(address)
    try:
        c.login("admin", password)
        click.echo(f"logged in as admin (password: {password})")
    except MasterError as e:
        # A state directory from before keeps its own admin password.
        click.echo(f"not logged in ({e}); run `assay -m {address} user login admin`")
    finally:
        c.close()


@local.command("down")
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_STATE,
    show_default=True,
)
@user_errors
def down(state_dir: Path) -> None:
    """Stop what `up` started (agents first, then the master)."""
    pids_file = state_dir / "pids.json"
    if not pids_file.exists():
        click.echo(f"no local cluster recorded in {state_dir}")
        return
    pids: dict[str, int] = json.loads(pids_file.read_text())
    order = sorted(pids, key=lambda name: name == "master")
    for name in order:
        _stop(pids[name])
    pids_file.unlink()
    click.echo(f"stopped {', '.join(order)}")


def _spawn(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> int:
    """Start `cmd` in the background; secrets travel in `env`, never in the command line."""
    with log.open("ab") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})),
        )
    return proc.pid


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def _stop(pid: int, grace: float = 20.0) -> None:
    if not _alive(pid):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)


def _port_taken(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _wait_for_port(port: int, pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _port_taken(port):
            return True
        if not _alive(pid):
            return False
        time.sleep(0.2)
    return False
