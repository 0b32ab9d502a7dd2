"""A hostile trial on an agent that isolates allocations (`isolation: uid`, the agent
running as root): it cannot reach another user's running trial, the agent's secrets or
the master's store, and what it leaves running dies with its allocation. Real master,
real agent, two users; the attacker's findings come back through its own log."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest
import yaml

from assay.common.archive import pack_model_dir
from assay.proto import api_pb2, api_pb2_grpc
from tests.credentials import login
from tests.e2e.conftest import ROOT, Cluster, start_cluster, stop_cluster


def _blocking_folder(path: Path) -> Path | None:
    """The highest folder above `path` that other users cannot pass through, if any."""
    for parent in reversed(path.resolve().parents):
        if not parent.stat().st_mode & 0o001:
            return parent
    return None


def _exposing(command: list[str], python: Path) -> list[str]:
    """`command`, run so that other users reach this Python: when it lives under a folder
    they cannot pass through (this machine's /root), the agent gets a mount namespace of
    its own in which that folder is an empty 0711 tmpfs holding only the way to Python."""
    blocking = _blocking_folder(python)
    if blocking is None:
        return command
    inner = python.resolve().relative_to(blocking).parts[0]  # e.g. .pyenv
    real = blocking / inner
    keep = f"/tmp/assay-isolation-{os.getpid()}"
    script = (
        f"mkdir -p {keep} && mount --bind {real} {keep} && "
        f"mount -t tmpfs -o mode=0711 tmpfs {blocking} && mkdir {real} && "
        f'mount --bind {keep} {real} && exec "$@"'
    )
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *command]


def _namespaces_work() -> bool:
    probe = "mkdir -p /tmp/assay-ns-probe && mount -t tmpfs tmpfs /tmp/assay-ns-probe"
    try:
        done = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", probe],
            capture_output=True,
            timeout=30,
            check=False,
        )
    except OSError:
        return False
    return done.returncode == 0


_PYTHON = Path(sys.executable)
pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="isolation needs a root agent"),
    pytest.mark.skipif(
        _blocking_folder(_PYTHON) is not None and not _namespaces_work(),
        reason=f"this Python ({_PYTHON.resolve()}) is not reachable by other users and no "
        "mount namespace can expose it (tests/agent/test_isolation.py covers the parts that "
        "need no Python)",
    ),
]

UID_BASE = 1_900_000_000
ALICE_SCRIPT = """\
import json, os, time
found = {"alice": os.getpid(), "uid": os.getuid(), "cwd": os.getcwd()}
print("ALICE " + json.dumps(found), flush=True)
time.sleep(600)
"""
MALLORY_SCRIPT = r"""
import json, os, signal, subprocess, sys

found = {"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups()}
secrets = ("ASSAY_JOIN_TOKEN", "ASSAY_INITIAL_ADMIN_PASSWORD", "ASSAY_PASSWORD")
found["secret_env"] = sorted(k for k in secrets if k in os.environ)

def attempt(name, action):
    try:
        action()
        found[name] = "done"
    except PermissionError:
        found[name] = "refused"
    except OSError as e:
        found[name] = f"error: {e}"

targets = json.loads(os.environ["TARGETS"])
attempt("alice_spec", lambda: open(os.path.join(targets["alice_dir"], "trial.json")).read())
attempt("list_allocations", lambda: os.listdir(os.path.dirname(targets["alice_dir"])))
attempt("agent_environ", lambda: open(f"/proc/{os.getppid()}/environ", "rb").read())
attempt("master_environ", lambda: open(f"/proc/{targets['master_pid']}/environ", "rb").read())
attempt("master_store", lambda: open(targets["master_db"], "rb").read(16))
attempt("signal_alice", lambda: os.kill(targets["alice_pid"], signal.SIGKILL))
# A daemon left behind: it must not outlive this allocation.
daemon = subprocess.Popen(
    [sys.executable, "-c", "import time; time.sleep(600)"],
    start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
)
found["daemon"] = daemon.pid
print("FOUND " + json.dumps(found), flush=True)
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("isolation")
    c = start_cluster(tmp, None, agents=0, slots=1)
    # The agent's work dir where isolated trials reach it (pytest's folders are root's).
    work = Path(tempfile.mkdtemp(prefix="assay-isolated-agent-"))
    work.chmod(0o711)
    agent_log = tmp / "agent-isolated.log"
    c.logs.append(agent_log)
    cmd = [sys.executable, "-m", "assay.agent.main", "--master", c.address, "--slots", "2"]
    cmd += ["--slot-type", "cpu", "--agent-id", "isolated", "--work-dir", str(work / "agent")]
    cmd += ["--isolation", "uid"]
    cmd = _exposing(cmd, _PYTHON)
    with agent_log.open("wb") as out:
        c.procs.append(
            subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=os.environ)
        )
    try:
        with grpc.insecure_channel(c.address) as channel:
            api = api_pb2_grpc.ApiStub(channel)
            admin = (("authorization", f"Bearer {login(c.address)}"),)
            for name in ("alice", "mallory"):
                request = api_pb2.CreateUserRequest(username=name, password=f"{name}-pass-1234")
                api.CreateUser(request, metadata=admin, timeout=30)
            deadline = time.monotonic() + 60
            while (
                api.GetMasterInfo(api_pb2.GetMasterInfoRequest(), metadata=admin, timeout=30).agents
                < 1
            ):
                assert time.monotonic() < deadline, c.dump_logs()
                time.sleep(0.3)
        yield c
    finally:
        stop_cluster(c)
        shutil.rmtree(work, ignore_errors=True)


def _api(cluster: Cluster, user: str) -> tuple[Any, tuple[tuple[str, str], ...]]:
    channel = grpc.insecure_channel(cluster.address)
    token = login(cluster.address, user, f"{user}-pass-1234")
    return api_pb2_grpc.ApiStub(channel), (("authorization", f"Bearer {token}"),)


def _submit(
    cluster: Cluster, user: str, tmp: Path, script: str, env: dict[str, str] | None = None
) -> int:
    folder = tmp / user
    folder.mkdir()
    (folder / "run.py").write_text(script)
    config: dict[str, Any] = {
        "name": f"{user}-run",
        "entrypoint": "python3 run.py",
        "searcher": {"name": "single", "metric": "x", "max_length": {"batches": 1}},
        "max_restarts": 0,
    }
    if env:
        config["environment"] = {"environment_variables": [f"{k}={v}" for k, v in env.items()]}
    api, auth = _api(cluster, user)
    request = api_pb2.CreateExperimentRequest(
        config_yaml=yaml.safe_dump(config),
        model_definition=pack_model_dir(folder),
        activate=True,
    )
    return int(api.CreateExperiment(request, metadata=auth, timeout=60).experiment.id)


def _log_line(cluster: Cluster, user: str, experiment_id: int, prefix: str) -> str:
    api, auth = _api(cluster, user)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        described = api.GetExperiment(
            api_pb2.GetExperimentRequest(id=experiment_id), metadata=auth, timeout=30
        )
        for trial in described.trials:
            lines = api.StreamTrialLogs(
                api_pb2.StreamTrialLogsRequest(trial_id=trial.id), metadata=auth, timeout=30
            )
            for line in lines:
                if line.message.startswith(prefix):
                    return str(line.message[len(prefix) :])
        time.sleep(0.5)
    raise AssertionError(f"no line starting {prefix!r}:\n{cluster.dump_logs()}")


def test_a_hostile_trial_reaches_nothing_of_another_allocation_or_of_the_cluster(
    cluster: Cluster, tmp_path: Path
) -> None:
    alice_eid = _submit(cluster, "alice", tmp_path, ALICE_SCRIPT)
    alice = json.loads(_log_line(cluster, "alice", alice_eid, "ALICE "))
    assert alice["uid"] >= UID_BASE, "alice's trial runs as a uid of its own"
    master_pid = cluster.procs[0].pid
    targets = {
        "alice_dir": str(Path(alice["cwd"]).parent),
        "alice_pid": alice["alice"],
        "master_pid": master_pid,
        "master_db": str(cluster.state_dir / "assay.db"),
    }
    mallory_eid = _submit(
        cluster, "mallory", tmp_path, MALLORY_SCRIPT, {"TARGETS": json.dumps(targets)}
    )
    found = json.loads(_log_line(cluster, "mallory", mallory_eid, "FOUND "))

    assert found["uid"] >= UID_BASE
    assert found["uid"] != alice["uid"]
    assert found["secret_env"] == []
    for attack in (
        "alice_spec",
        "list_allocations",
        "agent_environ",
        "master_environ",
        "master_store",
        "signal_alice",
    ):
        assert found[attack] == "refused", (attack, found)
    assert psutil.pid_exists(alice["alice"]), "alice's trial still runs"
    # Mallory's run ended: the daemon it left behind is gone with it.
    deadline = time.monotonic() + 60
    while psutil.pid_exists(found["daemon"]):
        assert time.monotonic() < deadline, "a daemon outlived its allocation"
        time.sleep(0.3)
