"""A hostile trial on an agent that isolates allocations (`isolation: uid`, the agent
running as root): it cannot reach another user's running trial, the agent's secrets or
the master's store, and what it leaves running dies with its allocation. Real master,
real agent, two users; the attacker's findings come back through its own log."""

from __future__ import annotations

import json
import os
import shutil
import socket
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

from assay.agent._isolation import processes_of
from assay.common.archive import pack_model_dir
from assay.proto import api_pb2, api_pb2_grpc, common_pb2
from tests.conftest import S3Server
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


# Leaves behind a daemon (double-forked, in a session of its own, its output closed)
# that forks and exits every millisecond, so that its pid is never the same twice, and
# beats a byte a turn into $BEAT; then it stays $STAY seconds. A later run of the trial
# (requeued after its agent restarted) leaves none: what beats then is the first run's.
FORKER_SCRIPT = """
import json, os, sys, time
LOOP = (
    "import os, sys, time\\n"
    "beat = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND)\\n"
    "while True:\\n"
    "    try:\\n"
    "        if os.fork():\\n"
    "            os._exit(0)\\n"
    "    except OSError:\\n"
    "        pass\\n"
    "    os.write(beat, b'.')\\n"
    "    time.sleep(0.001)\\n"
)
if os.path.getsize(os.environ["BEAT"]) == 0:
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.execv(sys.executable, [sys.executable, "-c", LOOP, os.environ["BEAT"]])
        os._exit(0)
    os.wait()
    time.sleep(0.3)
print("FORKER " + json.dumps({"uid": os.getuid()}), flush=True)
time.sleep(float(os.environ["STAY"]))
"""
HOG_SCRIPT = "x = bytearray(512 << 20)\n"
# The agent's command for each cluster of this module (to start it again).
_agent_commands: dict[str, list[str]] = {}
# A cluster's shared_fs storage root that isolated trials reach, where it has one.
_storage_roots: dict[str, Path] = {}


def _isolated_cluster(
    tmp: Path, agent_id: str, agent_flags: list[str], master_env: dict[str, str] | None = None
) -> Iterator[Cluster]:
    """A master, alice and mallory, and one root agent of 2 CPU slots isolating trials."""
    c = start_cluster(tmp, None, agents=0, slots=1, master_env=master_env)
    # The agent's work dir where isolated trials reach it (pytest's folders are root's).
    work = Path(tempfile.mkdtemp(prefix="assay-isolated-agent-"))
    work.chmod(0o711)
    agent_log = tmp / "agent-isolated.log"
    c.logs.append(agent_log)
    cmd = [sys.executable, "-m", "assay.agent.main", "--master", c.address, "--slots", "2"]
    cmd += ["--slot-type", "cpu", "--agent-id", agent_id, "--work-dir", str(work / "agent")]
    cmd += ["--isolation", "uid", *agent_flags]
    cmd = _exposing(cmd, _PYTHON)
    _agent_commands[c.address] = cmd
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


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    yield from _isolated_cluster(tmp_path_factory.mktemp("isolated"), "isolated", [])


@pytest.fixture(scope="module")
def loopback_cluster(
    tmp_path_factory: pytest.TempPathFactory, s3_server: S3Server
) -> Iterator[Cluster]:
    """Its agent runs each trial in a network of its own; its master takes `s3_server`, and
    shared_fs storage in a folder isolated trials reach (`_storage_roots`)."""
    flags = ["--isolation-network", "loopback"]
    root = Path(tempfile.mkdtemp(prefix="assay-isolated-checkpoints-"))
    root.chmod(0o711)
    master_env = {
        "ASSAY_S3_ENDPOINTS": s3_server.endpoint_url,
        "ASSAY_SHARED_FS_HOST_PATHS": str(root),
    }
    try:
        tmp = tmp_path_factory.mktemp("loopback")
        for c in _isolated_cluster(tmp, "loopback", flags, master_env):
            _storage_roots[c.address] = root
            yield c
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _api(cluster: Cluster, user: str) -> tuple[Any, tuple[tuple[str, str], ...]]:
    channel = grpc.insecure_channel(cluster.address)
    token = login(cluster.address, user, f"{user}-pass-1234")
    return api_pb2_grpc.ApiStub(channel), (("authorization", f"Bearer {token}"),)


def _submit(
    cluster: Cluster,
    user: str,
    tmp: Path,
    script: str,
    env: dict[str, str] | None = None,
    resources: dict[str, Any] | None = None,
    storage: dict[str, Any] | None = None,
) -> int:
    folder = tmp / user
    folder.mkdir(parents=True)
    (folder / "run.py").write_text(script)
    config: dict[str, Any] = {
        "name": f"{user}-run",
        "entrypoint": "python3 run.py",
        "searcher": {"name": "single", "metric": "x", "max_length": {"batches": 1}},
        "max_restarts": 0,
    }
    if resources:
        config["resources"] = resources
    if storage:
        config["checkpoint_storage"] = storage
    if env:
        config["environment"] = {"environment_variables": [f"{k}={v}" for k, v in env.items()]}
    api, auth = _api(cluster, user)
    request = api_pb2.CreateExperimentRequest(
        config_yaml=yaml.safe_dump(config),
        model_definition=pack_model_dir(folder),
        activate=True,
    )
    return int(api.CreateExperiment(request, metadata=auth, timeout=60).experiment.id)


def _log_line(cluster: Cluster, user: str, experiment_id: int, prefix: str, nth: int = 1) -> str:
    """The rest of the `nth` line of the experiment's logs that starts with `prefix`."""
    api, auth = _api(cluster, user)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        described = api.GetExperiment(
            api_pb2.GetExperimentRequest(id=experiment_id), metadata=auth, timeout=30
        )
        found = []
        for trial in described.trials:
            lines = api.StreamTrialLogs(
                api_pb2.StreamTrialLogsRequest(trial_id=trial.id), metadata=auth, timeout=30
            )
            found += [x.message[len(prefix) :] for x in lines if x.message.startswith(prefix)]
        if len(found) >= nth:
            return str(found[nth - 1])
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


@pytest.fixture
def beat() -> Iterator[Path]:
    """A file any uid may append to: a fork loop's heartbeat (looking for such a loop in
    /proc misses it: by the time its entry is read, it is another process)."""
    folder = Path(tempfile.mkdtemp(prefix="assay-beat-"))
    folder.chmod(0o755)
    path = folder / "beat"
    path.touch()
    path.chmod(0o666)
    yield path
    shutil.rmtree(folder)


def _beating(path: Path) -> bool:
    before = path.stat().st_size
    time.sleep(0.5)
    return path.stat().st_size > before


def _trial(cluster: Cluster, user: str, experiment_id: int) -> Any:
    api, auth = _api(cluster, user)
    request = api_pb2.GetExperimentRequest(id=experiment_id)
    return api.GetExperiment(request, metadata=auth, timeout=30).trials[0]


def _ended(cluster: Cluster, user: str, experiment_id: int) -> Any:
    """The experiment's trial once it has ended (polled every 50 ms)."""
    done = (common_pb2.TRIAL_STATE_COMPLETED, common_pb2.TRIAL_STATE_ERROR)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        trial = _trial(cluster, user, experiment_id)
        if trial.state in done:
            return trial
        time.sleep(0.05)
    raise AssertionError(f"the trial did not end:\n{cluster.dump_logs()}")


@pytest.mark.slow
def test_nothing_a_trial_leaves_running_outlives_its_allocation(
    cluster: Cluster, tmp_path: Path, beat: Path
) -> None:
    """A daemon forking every millisecond once lived 73 s past its allocation, and the
    next allocation got its uid."""
    env = {"BEAT": str(beat), "STAY": "0"}
    eid = _submit(cluster, "mallory", tmp_path, FORKER_SCRIPT, env)
    uid = json.loads(_log_line(cluster, "mallory", eid, "FORKER "))["uid"]
    _ended(cluster, "mallory", eid)
    at_end = beat.stat().st_size  # when the master counts the allocation as ended

    assert not _beating(beat), "the fork loop outlived its allocation"
    assert beat.stat().st_size == at_end, "the fork loop lived on after its allocation ended"
    assert processes_of(uid) == set()


@pytest.mark.slow
def test_a_restarted_agent_kills_what_its_allocations_left_and_lends_it_no_uid(
    cluster: Cluster, tmp_path: Path, beat: Path
) -> None:
    env = {"BEAT": str(beat), "STAY": "600"}
    eid = _submit(cluster, "mallory", tmp_path, FORKER_SCRIPT, env)
    uid = json.loads(_log_line(cluster, "mallory", eid, "FORKER "))["uid"]
    agent_log = next(p for p in cluster.logs if p.name == "agent-isolated.log")
    agent = cluster.procs[1]
    agent.kill()  # its ranks die with it (SIGTERM from the kernel); the loop lives on
    agent.wait()
    assert _beating(beat)

    with agent_log.open("ab") as out:
        out.write(b"\n--- restarted ---\n")
        cluster.procs[1] = subprocess.Popen(
            _agent_commands[cluster.address], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT
        )
    deadline = time.monotonic() + 60
    while "agent isolated: " not in agent_log.read_text().rpartition("--- restarted ---")[2]:
        assert time.monotonic() < deadline, cluster.dump_logs()
        time.sleep(0.1)

    assert not _beating(beat), "the fork loop outlived its agent's restart"
    assert processes_of(uid) == set()
    # The trial runs again (it lost its agent; that is no restart of its own), under
    # another uid: the restarted agent goes on with the machine's turn of uids.
    again = _log_line(cluster, "mallory", eid, "FORKER ", nth=2)
    api, auth = _api(cluster, "mallory")
    kill = api_pb2.ExperimentActionRequest(id=eid, action=api_pb2.EXPERIMENT_ACTION_KILL)
    api.ExperimentAction(kill, metadata=auth, timeout=30)
    assert json.loads(again)["uid"] != uid


@pytest.mark.slow
def test_a_trial_past_its_memory_is_killed_and_told_why(cluster: Cluster, tmp_path: Path) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        _submit(cluster, "alice", tmp_path / "bad", HOG_SCRIPT, resources={"memory": "lots"})
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "resources.memory: expected a size such as 8G" in str(refused.value.details())

    eid = _submit(cluster, "alice", tmp_path, HOG_SCRIPT, resources={"memory": "64Mi"})
    trial = _ended(cluster, "alice", eid)
    assert trial.state == common_pb2.TRIAL_STATE_ERROR
    assert (
        "killed by SIGKILL: the allocation reached its memory limit of 64 MiB "
        "(resources.memory for 1 slot(s)); raise resources.memory"
    ) in trial.last_error, trial.last_error


# Probes what it reaches on 127.0.0.1 (TARGETS: name -> port), then reports through the
# master and checkpoints (to S3 when the experiment's storage is there), its two ranks
# meeting on their own loopback.
NETWORK_SCRIPT = r"""
import json, os, socket
import assay.core

found = {"interfaces": sorted(x.split(":")[0].strip() for x in open("/proc/net/dev") if ":" in x)}
for name, port in json.loads(os.environ["TARGETS"]).items():
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
        found[name] = "reached"
    except OSError as e:
        found[name] = type(e).__name__
with assay.core.init() as context:
    found["ranks"] = context.distributed.allgather(context.distributed.rank)
    print("NET " + json.dumps(found), flush=True)
    if context.distributed.rank == 0:
        with context.checkpoint.store_path({"steps_completed": 1}) as (path, uuid):
            (path / "weights.txt").write_text("1")
        context.train.report_validation_metrics(steps_completed=1, metrics={"x": 1.0})
"""


@pytest.fixture
def local_service() -> Iterator[int]:
    """Something listening on the machine's loopback that trusts whoever connects."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield int(server.getsockname()[1])


def _wait_for_state(cluster: Cluster, user: str, experiment_id: int) -> Any:
    api, auth = _api(cluster, user)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        described = api.GetExperiment(
            api_pb2.GetExperimentRequest(id=experiment_id), metadata=auth, timeout=30
        )
        if described.experiment.state in (
            common_pb2.EXPERIMENT_STATE_COMPLETED,
            common_pb2.EXPERIMENT_STATE_ERROR,
        ):
            return described
        time.sleep(0.5)
    raise AssertionError(f"experiment {experiment_id} did not end:\n{cluster.dump_logs()}")


@pytest.mark.slow
@pytest.mark.parametrize("storage", ["shared_fs", "s3"])
def test_a_trial_in_a_network_of_its_own_reaches_its_master_and_storage_and_nothing_else(
    loopback_cluster: Cluster,
    tmp_path: Path,
    local_service: int,
    s3_server: S3Server,
    storage: str,
) -> None:
    master_port = int(loopback_cluster.address.rpartition(":")[2])
    targets = {"service": local_service, "postgres": 5432, "master": master_port}
    for port in targets.values():  # each answers on the machine's loopback
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    if storage == "s3":
        config = s3_server.storage_config(s3_server.new_bucket())
    else:
        config = {"type": "shared_fs", "host_path": str(_storage_roots[loopback_cluster.address])}
    eid = _submit(
        loopback_cluster,
        "mallory",
        tmp_path,
        NETWORK_SCRIPT,
        {"TARGETS": json.dumps(targets)},
        resources={"slots_per_trial": 2},
        storage=config,
    )
    for nth in (1, 2):
        found = json.loads(_log_line(loopback_cluster, "mallory", eid, "NET ", nth))
        assert found["interfaces"] == ["lo"], found
        for name in targets:
            assert found[name] == "ConnectionRefusedError", (name, found)
        assert found["ranks"] == [0, 1], "the ranks met on their own loopback"
    described = _wait_for_state(loopback_cluster, "mallory", eid)
    state = common_pb2.ExperimentState.Name(described.experiment.state)
    assert state == "EXPERIMENT_STATE_COMPLETED", loopback_cluster.dump_logs()
    api, auth = _api(loopback_cluster, "mallory")
    checkpoints = api.ListCheckpoints(
        api_pb2.ListCheckpointsRequest(experiment_id=eid), metadata=auth, timeout=30
    ).checkpoints
    assert len(checkpoints) == 1
    if storage == "s3":
        assert any(k.endswith("weights.txt") for k in s3_server.keys(config["bucket"]))
