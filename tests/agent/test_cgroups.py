"""Each allocation in a cgroup of its own, on this machine's real cgroup filesystem (v1
controllers with an empty cgroup2 hierarchy beside them): joined by the exec wrapper
before the command runs, limited, killed to the last process however fast they fork,
removed; what an earlier run of an agent left is killed at its next start."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from assay.agent import Agent, AgentSettings
from assay.agent._cgroups import (
    Allowance,
    Cgroup,
    CgroupError,
    Cgroups,
    Limits,
    _Layout,
    read_mounts,
    read_own,
    safe_name,
)
from assay.agent._config import load_agent_settings, memory_bytes
from assay.agent._process import wrap_command
from assay.common.settings import SettingsError
from assay.proto import agent_pb2
from tests.agent.conftest import FakeMaster, model_tarball, start_message

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/sys/fs/cgroup").is_dir(),
    reason="making cgroups needs root on Linux",
)

# Forks and exits every millisecond, so that its pid is never the same twice: a kill
# that lists processes, then signals them, always misses the newest one (and so does a
# test that looks for it in /proc: it beats instead, a byte a turn in the file argv[2]).
FORK_LOOP = """
import os, sys, time
beat = os.open(sys.argv[2], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
while True:
    try:
        if os.fork():
            os._exit(0)
    except OSError:  # the pids limit: try again
        pass
    os.write(beat, b".")
    time.sleep(0.001)
"""
FORK_BOMB = """
import os
if os.fork():
    os._exit(0)
while True:
    try:
        os.fork()
    except OSError:
        pass
"""
# In the command line of every process a test starts here, to find those that live on.
MARK = "assay-test-" + uuid.uuid4().hex[:8]


def _beating(paths: list[Path]) -> list[bool]:
    """Whether each fork loop still writes to its heartbeat file."""

    def size(path: Path) -> int:
        return path.stat().st_size if path.exists() else 0

    before = [size(p) for p in paths]
    time.sleep(0.25)
    return [size(p) > b for p, b in zip(paths, before, strict=True)]


def _marked() -> list[int]:
    """Live processes (not zombies) with this test run's mark in their command line."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if MARK.encode() in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


@pytest.fixture
def cgroups() -> Iterator[Cgroups]:
    """An agent's cgroups, of a name no other test or agent uses; removed afterwards."""
    made = Cgroups.open(f"test-{uuid.uuid4().hex[:12]}")
    yield made
    made.clean()
    made.close()
    assert not any(folder.exists() for folder in made.directories)


def _start(cgroup: Cgroup, script: str, *args: str) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-c", script, MARK, *args]
    return subprocess.Popen(wrap_command(command, os.getpid(), None, cgroup.dirs))


def _wait_for(predicate: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_the_command_runs_inside_its_cgroup_with_its_limits(cgroups: Cgroups) -> None:
    cgroup = cgroups.create("a1", Limits(memory=64 << 20, pids=100))
    done = subprocess.run(
        wrap_command(["/bin/cat", "/proc/self/cgroup"], os.getpid(), None, cgroup.dirs),
        capture_output=True,
        text=True,
        check=True,
    )
    # In every hierarchy it joined (here: memory, pids, freezer and the cgroup2 one).
    inside = [line for line in done.stdout.splitlines() if line.endswith("/a1")]
    assert len(inside) == len(cgroup.dirs), done.stdout
    limit = "memory.max" if cgroups._layout.v2 else "memory.limit_in_bytes"
    assert int((cgroup._memory / limit).read_text()) == 64 << 20
    assert (cgroup._pids / "pids.max").read_text().strip() == "100"
    assert all(f.stat().st_uid == 0 and f.stat().st_mode & 0o777 == 0o755 for f in cgroup.dirs)

    assert cgroup.kill()
    assert cgroup.remove()
    assert not any(d.exists() for d in cgroup.dirs)
    assert cgroups.leftovers() == []


def test_the_wrapper_refuses_to_run_a_command_outside_its_cgroup(tmp_path: Path) -> None:
    done = subprocess.run(
        wrap_command(["/bin/true"], os.getpid(), None, [tmp_path / "gone"]),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 126
    assert f"cannot join the cgroup {tmp_path / 'gone'}: No such file or directory" in done.stderr


def test_a_fork_bomb_stops_at_the_pids_limit(cgroups: Cgroups) -> None:
    cgroup = cgroups.create("bomb", Limits(pids=40))
    _start(cgroup, FORK_BOMB).wait()  # the first process exits at once; the rest fork on
    pids = cgroup._pids
    _wait_for(lambda: int((pids / "pids.events").read_text().split()[1]) > 100)
    assert int((pids / "pids.current").read_text()) <= 40

    assert cgroup.kill()
    assert _marked() == []
    assert cgroup.remove()


def _kill_strategies(cgroups: Cgroups) -> dict[str, Cgroups]:
    """The same cgroups, killed each way some machine allows (those this one has)."""
    layout = cgroups._layout
    assert layout.killer is not None, "this kernel has no cgroup.kill"
    # cgroup v2's own freezer (cgroup.freeze), on this machine's cgroup2 hierarchy.
    v2_freeze = _Layout(layout.killer, layout.killer, layout.killer, None, v2=True)
    found = {"cgroup.kill": cgroups, "v2 cgroup.freeze": Cgroups(v2_freeze, "v2 freeze")}
    if not layout.v2:
        without_kill = _Layout(layout.memory, layout.pids, layout.freezer, None, v2=False)
        neither = _Layout(layout.memory, layout.pids, None, None, v2=False)
        found["v1 freezer"] = Cgroups(without_kill, "v1 freezer")
        found["pids.max 0, no freezer"] = Cgroups(neither, "no freezer")
    return found


@pytest.mark.parametrize(
    "strategy", ["cgroup.kill", "v1 freezer", "pids.max 0, no freezer", "v2 cgroup.freeze"]
)
def test_processes_forking_every_millisecond_are_all_killed(
    cgroups: Cgroups, strategy: str, tmp_path: Path
) -> None:
    strategies = _kill_strategies(cgroups)
    if strategy not in strategies:
        pytest.skip(f"{strategy}: a cgroup v1 machine's")
    chosen = strategies[strategy]
    # A hybrid machine's cgroup2 hierarchy has no pids controller: the freezer holds them.
    v2_alone = strategy.startswith("v2") and not cgroups._layout.v2
    limits = Limits() if v2_alone else Limits(pids=10_000)
    cgroup = chosen.create("loop", limits)
    beats = [tmp_path / f"beat{i}" for i in range(3)]
    for beat in beats:  # three loops, each of which has left its first process already
        _start(cgroup, FORK_LOOP, str(beat)).wait()
    assert all(_beating(beats))

    started = time.monotonic()
    assert cgroup.kill(timeout=10)
    took = time.monotonic() - started

    assert cgroup.processes() == set()
    assert not any(_beating(beats)), "a process of a loop outlived the kill"
    assert cgroup.remove()
    assert took < 5


def test_the_kernel_counts_what_it_killed_at_the_memory_limit(cgroups: Cgroups) -> None:
    cgroup = cgroups.create("hog", Limits(memory=32 << 20))
    hog = _start(cgroup, "import time\nx = bytearray(256 << 20)\ntime.sleep(60)\n")
    assert hog.wait(timeout=30) == -signal.SIGKILL
    assert cgroup.oom_kills() == 1
    assert cgroup.kill()
    assert cgroup.remove()


def test_an_agents_restart_kills_what_its_earlier_run_left_and_only_that() -> None:
    name = f"test-{uuid.uuid4().hex[:12]}"
    first, other = Cgroups.open(name), Cgroups.open(name + "-other")
    mine = first.create("left", Limits())
    theirs = other.create("running", Limits())
    sleeper = "import time\ntime.sleep(120)\n"
    left, running = _start(mine, sleeper), _start(theirs, sleeper)
    try:
        _wait_for(lambda: len(_marked()) == 2)
        assert first.leftovers() == ["left"]

        again = Cgroups.open(name)  # the same agent, started again
        assert again.clean() == 1

        assert left.wait(timeout=10) == -signal.SIGKILL
        assert running.poll() is None, "another agent's allocation was killed"
        assert again.leftovers() == []
        assert not any(d.exists() for d in mine.dirs)
    finally:
        running.kill()
        running.wait()
        for made in (first, other):
            made.clean()
            made.close()


def test_an_allowance_gives_each_slot_its_share_up_to_the_agents_most() -> None:
    allowance = Allowance(memory=10 << 30, pids_per_slot=4096)
    assert allowance.limits(2, 1 << 30) == Limits(2 << 30, 8192)
    assert allowance.limits(4, 4 << 30) == Limits(10 << 30, 16384)  # capped
    assert allowance.limits(1, None) == Limits(10 << 30, 4096)  # the agent's default
    assert Allowance(memory=1 << 30).limits(3, None) == Limits(1 << 30, None)


def test_the_agents_memory_setting_is_a_size_or_a_share_of_the_machine() -> None:
    def loaded(value: str) -> str:
        env = {"ASSAY_MASTER": "m:1", "ASSAY_ALLOCATION_MEMORY": value}
        return load_agent_settings(None, {}, env).allocation_memory

    assert memory_bytes(loaded("50%"), 64 << 30) == 32 << 30
    assert memory_bytes(AgentSettings(master="m:1").allocation_memory, 100 << 30) == 90 << 30
    assert memory_bytes(loaded("8G"), 1) == 8 << 30
    for bad in ("0%", "120%", "lots", "1K", "-5G"):
        with pytest.raises(SettingsError, match="ALLOCATION_MEMORY in the environment: expected"):
            loaded(bad)


def test_the_hierarchies_are_read_from_mountinfo_and_proc_cgroup() -> None:
    mountinfo = (
        "30 25 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n"
        "35 30 0:31 / /sys/fs/cgroup/memory rw,relatime shared:13 - cgroup cgroup rw,memory\n"
        "36 30 0:32 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
        "37 30 0:33 /agents /mnt/my\\040cgroups rw - cgroup2 cgroup2 rw,nsdelegate\n"
    )
    mounts = read_mounts(mountinfo)
    assert [(str(m.path), m.root, m.version) for m in mounts] == [
        ("/sys/fs/cgroup/memory", "/", 1),
        ("/sys/fs/cgroup/cpu,cpuacct", "/", 1),
        ("/mnt/my cgroups", "/agents", 2),
    ]
    assert "memory" in mounts[0].controllers
    own = read_own("5:memory:/system.slice/assay-agent.service\n2:cpu,cpuacct:/\n0::/agents/a\n")
    assert own == {
        "memory": "/system.slice/assay-agent.service",
        "cpu": "/",
        "cpuacct": "/",
        "": "/agents/a",
    }
    assert safe_name("gpu-node-1") == "gpu-node-1"
    assert safe_name("../x y").startswith("_x_y-")  # never a path of its own
    assert len(safe_name("n" * 300)) == 100


def test_without_memory_and_pids_controllers_it_says_what_to_do() -> None:
    mountinfo = "36 30 0:32 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"
    with pytest.raises(
        CgroupError, match="no cgroup hierarchy with the memory and pids .*cgroups: off"
    ):
        Cgroups.open("x", mountinfo=mountinfo, proc_cgroup="2:cpu:/\n")


@pytest.mark.xdist_group("uids")  # the agent that starts enters its work dir as a lent uid
def test_a_cgroup_fs_it_cannot_write_stops_an_isolating_agent_with_what_to_do(
    tmp_path: Path,
) -> None:
    # memory and pids "mounted" where nothing can be made: /proc's own files.
    mountinfo = (
        "35 30 0:31 / /proc/self/status rw - cgroup cgroup rw,memory\n"
        "36 30 0:32 / /proc/self/status rw - cgroup cgroup rw,pids\n"
    )
    with pytest.raises(CgroupError, match="run the agent as root with a writable /sys/fs/cgroup"):
        Cgroups.open("x", mountinfo=mountinfo, proc_cgroup="1:memory:/\n2:pids:/\n")

    real = Cgroups.open

    def unwritable(agent_id: str) -> Cgroups:
        return real(agent_id, mountinfo=mountinfo, proc_cgroup="1:memory:/\n2:pids:/\n")

    # Where its trials' uids reach it (pytest's folders are root's alone).
    reachable = Path(tempfile.mkdtemp(prefix="assay-cgroups-", dir="/tmp"))
    reachable.chmod(0o711)
    settings = AgentSettings(
        master="127.0.0.1:1",
        agent_id="no-cgroups",
        slot_type="cpu",
        slots=1,
        work_dir=reachable / "work",
        isolation="uid",
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Cgroups, "open", staticmethod(unwritable))
        with pytest.raises(ValueError, match="isolation: uid puts each allocation in a cgroup"):
            Agent(settings, harness_command=["/bin/true"])
        # Opted out: the agent starts, and says so when it runs.
        try:
            Agent(dataclasses.replace(settings, cgroups="off"), harness_command=["/bin/true"])
        finally:
            shutil.rmtree(reachable)


# --- a real agent: limits from the config, the end verified before the master hears -----

HOG = """
import os, sys, time
print("ready", flush=True)
x = bytearray(512 << 20)
time.sleep(60)
"""
# Double-forks a daemon that runs FORK_LOOP, beating into hparams["beat"], then exits 0.
LEAVES_A_FORK_LOOP = f"""
import json, os, sys, time
beat = json.load(open(os.environ["ASSAY_TRIAL_SPEC"]))["hparams"]["beat"]
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        devnull = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.execv(sys.executable, [sys.executable, "-c", {FORK_LOOP!r}, "{MARK}", beat])
    os._exit(0)
os.wait()
time.sleep(0.5)
print("left a daemon", flush=True)
"""


@pytest.fixture
def agent_with_cgroups(
    master: FakeMaster, run_agent: Callable[..., Agent]
) -> Iterator[Callable[..., Agent]]:
    """`run_agent`, with cgroups (the agent runs its trials as root here: no isolation)."""
    name = f"test-{uuid.uuid4().hex[:12]}"

    def start(**overrides: object) -> Agent:
        return run_agent(agent_id=name, cgroups="on", **overrides)

    yield start
    made = Cgroups.open(name)
    made.clean()
    made.close()
    assert not any(folder.exists() for folder in made.directories)


def _start_with(
    allocation_id: str, worker: str, config: dict[str, object], **hparams: object
) -> agent_pb2.MasterMessage:
    model = model_tarball({"worker.py": worker})
    message = start_message(allocation_id, hparams, slots=[0], model=model)
    message.start.config_json = json.dumps(config)
    return message


def test_a_trial_past_its_memory_is_killed_and_told_to_raise_resources_memory(
    master: FakeMaster, agent_with_cgroups: Callable[..., Agent]
) -> None:
    agent_with_cgroups(allocation_memory="1G")
    master.wait_for("register")
    master.send(_start_with("hog", HOG, {"resources": {"memory": "64Mi"}}))
    exited = master.exited("hog", timeout=60)
    assert list(exited.exit_codes) == [-9]
    assert exited.message.startswith(
        "rank 0 was killed by SIGKILL: the allocation reached its memory limit of 64 MiB "
        "(resources.memory for 1 slot(s)); raise resources.memory"
    ), exited.message


def test_the_agents_own_limit_caps_resources_memory_and_says_so(
    master: FakeMaster, agent_with_cgroups: Callable[..., Agent]
) -> None:
    agent_with_cgroups(allocation_memory="96Mi")
    master.wait_for("register")
    master.send(_start_with("capped", HOG, {"resources": {"memory": "8G"}}))
    exited = master.exited("capped", timeout=60)
    assert "the allocation reached its memory limit of 96 MiB, the most this agent gives" in (
        exited.message
    )
    said = master.wait_line("capped", "this agent gives one allocation at most 96 MiB")
    assert said.stream == "assay"


def test_an_allocation_ends_only_once_what_it_left_running_is_dead(
    master: FakeMaster, agent_with_cgroups: Callable[..., Agent], tmp_path: Path
) -> None:
    agent_with_cgroups()
    master.wait_for("register")
    beat = tmp_path / "beat"
    at_exit: list[int] = []
    record = master._record

    def check_when_exited(message: agent_pb2.AgentMessage) -> None:
        change = message.allocation_state
        if change.state == agent_pb2.ALLOCATION_STATE_EXITED:
            at_exit.append(beat.stat().st_size)  # the loop's beats when the master hears
        record(message)

    master._record = check_when_exited  # type: ignore[method-assign]
    master.send(_start_with("leaver", LEAVES_A_FORK_LOOP, {}, beat=str(beat)))
    master.wait_line("leaver", "left a daemon")
    exited = master.exited("leaver", timeout=30)
    assert exited.message == "all 1 processes exited with code 0"
    assert len(at_exit) == 1
    assert _beating([beat]) == [False]
    assert beat.stat().st_size == at_exit[0], "the loop lived on after the allocation ended"
