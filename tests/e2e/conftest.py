"""A real local cluster: `assay-master` and `assay-agent` processes on loopback."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from assay._rank_processes import free_port
from assay.client import Client, MasterError
from tests.store.conftest import _empty_postgres, postgres_url

__all__ = ["postgres_url"]  # the session's PostgreSQL database, shared with the store tests

ROOT = Path(__file__).resolve().parent.parent.parent
SCRIPTS = ROOT / "tests" / "fixtures" / "scripts"


def loop_config(**hparams: Any) -> dict[str, Any]:
    """A config of tests/fixtures/scripts/loop.py (a Core API script that counts steps,
    reports, checkpoints and obeys preemption as `hparams` say): a `single` search of
    `steps` batches (default 100), 1 restart."""
    return {
        "name": "loop",
        "entrypoint": "python3 loop.py",
        "hyperparameters": hparams,
        "searcher": {
            "name": "single",
            "metric": "value",
            "smaller_is_better": False,
            "max_length": {"batches": hparams.get("steps", 100)},
        },
        "max_restarts": 1,
    }


@dataclass
class Cluster:
    address: str
    state_dir: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    master_cmd: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    http_port: int = 0  # the web UI and JSON API, http://127.0.0.1:<http_port>/
    db_url: str | None = None  # None: SQLite in the state directory

    def restart_master(self) -> None:
        """Start the master again (same port, state and database) after it died."""
        log = self.logs[0]
        with log.open("ab") as out:
            out.write(b"\n--- restarted ---\n")
        self.procs[0] = subprocess.Popen(
            self.master_cmd, stdout=log.open("ab"), stderr=subprocess.STDOUT, env=self.env, cwd=ROOT
        )

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "assay.cli.main", "-m", self.address, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=ROOT,
            check=False,
        )

    def json(self, *args: str) -> Any:
        done = self.cli(*args, "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    def dump_logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-4000:]}" for p in self.logs if p.exists())


def _start(cmd: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env, cwd=ROOT)


def _wait_for_agents(cluster: Cluster, count: int) -> None:
    """Until the master answers and lists `count` agents: asked from this process every
    0.2 s (a CLI process takes seconds to start on a busy machine)."""
    client = Client(cluster.address, timeout=10)
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            with contextlib.suppress(MasterError):  # not listening yet
                if len(client.list_agents()) >= count:
                    return
            time.sleep(0.2)
    finally:
        client.close()
    raise AssertionError(f"agents did not register:\n{cluster.dump_logs()}")


def start_cluster(
    tmp: Path,
    db_url: str | None,
    agents: int,
    slots: int,
    master_env: dict[str, str] | None = None,
    agent_args: Sequence[Sequence[str]] = (),
) -> Cluster:
    """A master and `agents` agents of `slots` CPU slots; `agent_args[i]`: more flags for
    agent i (e.g. its --resource-pool)."""
    port = free_port()
    state = tmp / "master"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    http_port = free_port()
    cluster = Cluster(
        address=f"127.0.0.1:{port}", state_dir=state, http_port=http_port, db_url=db_url
    )
    master_cmd = [
        sys.executable,
        "-m",
        "assay.master.main",
        "--grpc-port",
        str(port),
        "--host",
        "127.0.0.1",
        "--state-dir",
        str(state),
        "--http-port",
        str(http_port),
    ]
    if db_url:
        master_cmd += ["--db-url", db_url]
    log = tmp / "master.log"
    cluster.logs.append(log)
    cluster.master_cmd = master_cmd
    cluster.env = dict(env, **(master_env or {}))
    cluster.procs.append(_start(master_cmd, log, cluster.env))
    for i in range(agents):
        log = tmp / f"agent{i}.log"
        cluster.logs.append(log)
        cmd = [
            sys.executable,
            "-m",
            "assay.agent.main",
            "--master",
            cluster.address,
            "--slots",
            str(slots),
            "--slot-type",
            "cpu",
            "--agent-id",
            f"agent{i}",
            "--work-dir",
            str(tmp / f"agent{i}"),
            *(agent_args[i] if i < len(agent_args) else ()),
        ]
        cluster.procs.append(_start(cmd, log, env))
    _wait_for_agents(cluster, agents)
    return cluster


def stop_cluster(cluster: Cluster) -> None:
    stop_processes(cluster.procs)


def stop_processes(procs: list[subprocess.Popen[bytes]]) -> None:
    """`procs[1:]` (the agents) first, then `procs[0]` (the master): an agent flushes what
    it has queued to the master on its way out, and one whose master is going too waits
    out its flush timeout (5 s)."""
    for group in (procs[1:], procs[:1]):
        for proc in group:
            if proc.poll() is None:
                proc.terminate()
        for proc in group:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """Two agents of 2 slots, on each store, shared by a module's tests."""
    db_url = None
    if request.param == "postgresql":
        db_url = request.getfixturevalue("postgres_url")
        _empty_postgres(db_url)
    c = start_cluster(tmp_path_factory.mktemp("cluster"), db_url, agents=2, slots=2)
    try:
        yield c
    finally:
        stop_cluster(c)
