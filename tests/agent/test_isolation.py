"""`isolation: uid` on this machine's kernel: the switch to an allocation's own uid, what
that uid can no longer reach, the cleanup of what it leaves running, the directory and
environment it gets. Real processes (the agent's side runs as root here)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from assay.agent._allocation import Allocation, AllocationError
from assay.agent._isolation import Identity, Isolation, kill_processes_of, processes_of
from assay.agent._process import RankProcesses, RankSpec, wrap_command
from assay.common.tls import ClientTls
from assay.proto import agent_pb2

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching uids needs root")
BASE = 1_900_000_000


def _run_as(identity: Identity, script: str) -> subprocess.CompletedProcess[str]:
    command = wrap_command(["/bin/sh", "-c", script], os.getpid(), identity)
    return subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)


def test_the_processes_run_as_the_allocations_uid_and_experiment_group() -> None:
    done = _run_as(Identity(BASE + 7, BASE + 42), "id -u; id -g; id -G; umask")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(BASE + 7), str(BASE + 42), str(BASE + 42), "0007"]


def test_the_uid_cannot_read_the_agents_secrets_or_another_allocation(tmp_path: Path) -> None:
    other = tmp_path / "other-allocation"
    other.mkdir(mode=0o700)
    (other / "trial.json").write_text('{"token": "secret"}')
    os.chown(other, BASE + 2, BASE + 2)
    os.chown(other / "trial.json", BASE + 2, BASE + 2)
    (other / "trial.json").chmod(0o600)
    tmp_path.chmod(0o711)
    victim = subprocess.Popen(
        wrap_command(["/bin/sleep", "60"], os.getpid(), Identity(BASE + 2, BASE + 2))
    )
    try:
        script = (
            f"cat /proc/{os.getpid()}/environ; echo agent=$?; "
            f"cat {other}/trial.json; echo spec=$?; "
            f"kill -9 {victim.pid}; echo kill=$?; "
            f"cat /proc/{victim.pid}/environ; echo victim=$?"
        )
        done = _run_as(Identity(BASE + 1, BASE + 1), script)
        results = dict(line.split("=") for line in done.stdout.split() if "=" in line)
        assert results == {"agent": "1", "spec": "1", "kill": "1", "victim": "1"}, done
        assert "secret" not in done.stdout
        assert victim.poll() is None  # still running
    finally:
        victim.kill()
        victim.wait()


def test_what_an_allocation_leaves_running_is_killed_when_it_ends() -> None:
    identity = Identity(BASE + 3, BASE + 3)
    # A daemon in a session of its own, as a hostile trial would leave behind.
    launcher = _run_as(identity, "setsid /bin/sleep 300 >/dev/null 2>&1 & echo $!")
    daemon = int(launcher.stdout.split()[-1])
    assert psutil.pid_exists(daemon)
    isolation = Isolation("uid", BASE, 100)
    isolation.give_back(identity)
    deadline = time.monotonic() + 10
    while psutil.pid_exists(daemon) and psutil.Process(daemon).status() != "zombie":
        assert time.monotonic() < deadline, "the daemon outlived its allocation"
        time.sleep(0.05)
    assert processes_of(identity.uid) == set()


def test_uids_are_lent_round_robin_and_never_twice_at_once(tmp_path: Path) -> None:
    isolation = Isolation("uid", BASE, 3, lock_dir=tmp_path)
    first = isolation.lend("a", experiment_id=5)
    second = isolation.lend("b", experiment_id=5)
    assert first is not None
    assert second is not None
    assert (first.uid, second.uid) == (BASE, BASE + 1)
    assert first.gid == second.gid == BASE + 5 % 3  # one experiment, one group
    isolation.give_back(first)
    third = isolation.lend("c", experiment_id=6)
    assert third is not None
    assert third.uid == BASE + 2  # not the one just given back
    fourth = isolation.lend("d", experiment_id=6)
    assert fourth is not None
    assert fourth.uid == BASE  # the only free one
    with pytest.raises(RuntimeError, match="all 3 isolation uids are in use"):
        isolation.lend("e", experiment_id=6)


def test_agents_on_one_machine_never_lend_the_same_uid(tmp_path: Path) -> None:
    """Two agents with the same range (they must share it: an experiment's gid is the
    same on every agent) on one machine: neither lends the other's uid, so neither kills
    the other's trials as leftovers before lending one or after giving one back."""
    a = Isolation("uid", BASE, 3, lock_dir=tmp_path)
    b = Isolation("uid", BASE, 3, lock_dir=tmp_path)
    held = a.lend("a1", experiment_id=1)
    assert held is not None
    assert held.uid == BASE
    victim = subprocess.Popen(wrap_command(["/bin/sleep", "60"], os.getpid(), held))
    try:
        deadline = time.monotonic() + 10
        while psutil.Process(victim.pid).uids().real != BASE:  # it has switched to a's uid
            assert time.monotonic() < deadline
            time.sleep(0.01)
        # b's own turn starts at BASE too; it skips the uid a holds.
        lent = [b.lend(f"b{i}", experiment_id=1) for i in range(2)]
        assert [i.uid for i in lent if i is not None] == [BASE + 1, BASE + 2]
        with pytest.raises(RuntimeError, match="other agents on this machine"):
            b.lend("b3", experiment_id=1)
        assert victim.poll() is None  # b killed nothing of a's
        b.give_back(lent[0])
        assert victim.poll() is None
        a.give_back(held)  # a's own: its leftovers go, and the uid is free for b
        victim.wait(timeout=10)
        again = b.lend("b4", experiment_id=1)
        assert again is not None
        assert again.uid in (BASE, BASE + 1)
        # A lock file exists only while its uid is lent: the directory never grows.
        assert sorted(int(f.name) for f in tmp_path.iterdir()) == sorted({again.uid, BASE + 2})
    finally:
        victim.kill()
        victim.wait()


def test_the_directory_is_handed_over_and_the_environment_is_clean(tmp_path: Path) -> None:
    isolation = Isolation("uid", BASE, 10)
    folder = tmp_path / "alloc"
    (folder / "model").mkdir(parents=True)
    (folder / "model" / "train.py").write_text("x = 1\n")
    identity = Identity(BASE + 4, BASE + 9)
    isolation.hand_over(folder, identity)
    for path in (folder, folder / "model", folder / "model" / "train.py", folder / "tmp"):
        assert (path.stat().st_uid, path.stat().st_gid) == (BASE + 4, BASE + 9), path
    assert folder.stat().st_mode & 0o777 == 0o700

    env = isolation.environment_for(
        {
            "PATH": "/usr/bin",
            "LC_ALL": "C.UTF-8",
            "ASSAY_MASTER_RETRY_S": "5",
            "AWS_SECRET_ACCESS_KEY": "agent-secret",
            "SSH_AUTH_SOCK": "/tmp/agent.sock",
            "HOME": "/root",
        },
        folder,
    )
    assert env["PATH"] == "/usr/bin"
    assert env["LC_ALL"] == "C.UTF-8"
    assert env["ASSAY_MASTER_RETRY_S"] == "5"
    assert "AWS_SECRET_ACCESS_KEY" not in env
    assert "SSH_AUTH_SOCK" not in env
    assert env["HOME"] == str(folder)
    assert env["TMPDIR"] == str(folder / "tmp")


def test_rank_processes_start_as_the_identity(tmp_path: Path) -> None:
    lines: list[str] = []
    tmp_path.chmod(0o755)
    processes = RankProcesses(
        ["/bin/sh", "-c", "id -u"],
        tmp_path,
        [RankSpec(0, {"PATH": "/usr/bin:/bin"})],
        lambda rank, stream, line: lines.append(line),
        Identity(BASE + 5, BASE + 5),
    )
    processes.spawn()
    assert processes.wait().codes == [0]
    assert lines == [str(BASE + 5)]


def test_without_root_uid_isolation_refuses_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(PermissionError, match="needs the agent to run as root"):
        Isolation("uid", BASE, 10)
    assert Isolation("none", BASE, 10).lend("a", 1) is None


def test_the_agent_says_when_it_is_single_tenant(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "assay.agent.main", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "--isolation [auto|uid|none]" in done.stdout


@pytest.fixture
def storage_root() -> Iterator[Path]:
    """A checkpoint root as the master makes it (0711), where other uids can reach it
    (pytest's own temporary directories are 0700)."""
    root = Path(tempfile.mkdtemp(prefix="assay-checkpoints-", dir="/tmp"))
    root.chmod(0o711)
    yield root
    shutil.rmtree(root)


def test_an_experiments_directory_is_its_groups_alone(storage_root: Path) -> None:
    isolation = Isolation("uid", BASE, 100)
    mine = storage_root / "5"
    isolation.give_experiment_directory(mine, 5)
    isolation.give_experiment_directory(mine, 5)  # the next allocation takes it as it is
    found = mine.stat()
    assert (found.st_uid, found.st_gid, found.st_mode & 0o7777) == (0, BASE + 5, 0o2770)

    # A trial of experiment 5 writes a checkpoint; another trial of it reads it.
    writer = _run_as(
        Identity(BASE + 1, BASE + 5),
        f"mkdir {mine}/ckpt && echo weights > {mine}/ckpt/model.pt && ls {mine}",
    )
    assert writer.returncode == 0, writer.stderr
    assert writer.stdout.split() == ["ckpt"]
    assert (mine / "ckpt" / "model.pt").stat().st_gid == BASE + 5  # setgid keeps the group
    reader = _run_as(Identity(BASE + 2, BASE + 5), f"cat {mine}/ckpt/model.pt")
    assert (reader.returncode, reader.stdout) == (0, "weights\n"), reader.stderr

    # A trial of experiment 6 can neither list, read nor write there, nor list the root.
    script = (
        f"ls {mine}; echo list=$?; cat {mine}/ckpt/model.pt; echo read=$?; "
        f"touch {mine}/planted; echo write=$?; mkdir {mine}/ckpt/x; echo plant=$?; "
        f"ls {storage_root}; echo root=$?; touch {storage_root}/6; echo squat=$?"
    )
    other = _run_as(Identity(BASE + 3, BASE + 6), script)
    results = dict(line.split("=") for line in other.stdout.split() if "=" in line)
    assert set(results) == {"list", "read", "write", "plant", "root", "squat"}, other
    assert all(code != "0" for code in results.values()), other
    assert sorted(p.name for p in mine.iterdir()) == ["ckpt"]
    assert sorted(p.name for p in storage_root.iterdir()) == ["5"]


@pytest.mark.parametrize(
    ("kind", "match"),
    [
        ("open", "is not experiment 5's directory"),
        ("other-group", "is not experiment 5's directory"),
        ("symlink", "Not a directory"),  # O_NOFOLLOW with O_DIRECTORY: ENOTDIR
        ("file", "Not a directory"),
    ],
)
def test_a_directory_not_made_for_the_experiment_is_refused_unchanged(
    storage_root: Path, kind: str, match: str
) -> None:
    isolation = Isolation("uid", BASE, 100)
    path = storage_root / "5"
    if kind == "open":
        path.mkdir()
        path.chmod(0o777)  # made by someone else, e.g. a squatter
    elif kind == "other-group":
        path.mkdir()
        os.chown(path, 0, BASE + 6)
        path.chmod(0o2770)
    elif kind == "symlink":
        path.symlink_to("/etc")
    else:
        path.write_text("")
    before = path.lstat()

    with pytest.raises(OSError, match=match):
        isolation.give_experiment_directory(path, 5)

    after = path.lstat()
    assert (after.st_uid, after.st_gid, after.st_mode) == (
        before.st_uid,
        before.st_gid,
        before.st_mode,
    )
    assert Path("/etc").stat().st_gid == 0


def test_a_storage_root_through_a_link_or_inside_an_experiments_directory_is_refused(
    storage_root: Path,
) -> None:
    """A trial of experiment 5 plants a link to /etc in its own (group-writable)
    directory; experiment 6 names that link, or experiment 5's directory, as its
    host_path: root would make 6's directory in /etc, or inside 5's."""
    isolation = Isolation("uid", BASE, 100)
    mine = storage_root / "5"
    isolation.give_experiment_directory(mine, 5)
    (mine / "evil").symlink_to("/etc")
    with pytest.raises(PermissionError, match="goes through a symbolic link"):
        isolation.give_experiment_directory(mine / "evil" / "6", 6)
    with pytest.raises(PermissionError, match="an experiment's checkpoint directory"):
        isolation.give_experiment_directory(mine / "6", 6)
    assert not Path("/etc/6").exists()
    assert sorted(p.name for p in mine.iterdir()) == ["evil"]


def test_the_storage_root_must_exist_and_without_isolation_nothing_is_made(
    storage_root: Path,
) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist on this agent"):
        Isolation("uid", BASE, 100).give_experiment_directory(storage_root / "no" / "5", 5)
    Isolation("none", BASE, 100).give_experiment_directory(storage_root / "5", 5)
    assert not (storage_root / "5").exists()
    assert not (storage_root / "no").exists()


def _allocation(
    work_dir: Path, isolation: Isolation, root: Path, storage: dict[str, str]
) -> Allocation:
    start = agent_pb2.StartAllocation(
        allocation_id="9.1.abc",
        trial_id=9,
        run_id=1,
        experiment_id=5,
        slots=[0],
        ranks=[0],
        world_size=1,
        config_json=json.dumps({"checkpoint_storage": storage}),
        checkpoint_root=str(root / "5"),
    )
    return Allocation(
        start,
        lambda _: None,
        lambda _: None,
        work_dir=work_dir,
        harness_command=["/bin/true"],
        slot_kind="cpu",
        address="127.0.0.1",
        tls=ClientTls.of(None, None, ""),
        grace=1.0,
        isolation=isolation,
    )


def test_an_allocation_prepares_its_experiments_directory(
    tmp_path: Path, storage_root: Path
) -> None:
    isolation = Isolation("uid", BASE, 100)
    s3 = _allocation(tmp_path, isolation, storage_root, {"type": "s3", "bucket": "b"})
    s3._prepare()
    isolation.give_back(s3.identity)
    assert not (storage_root / "5").exists()  # object storage: nothing on this disk

    allocation = _allocation(tmp_path, isolation, storage_root, {"type": "shared_fs"})
    allocation._prepare()
    isolation.give_back(allocation.identity)
    found = (storage_root / "5").stat()
    assert (found.st_uid, found.st_gid, found.st_mode & 0o7777) == (0, BASE + 5, 0o2770)

    (storage_root / "5").chmod(0o777)
    refused = _allocation(tmp_path, isolation, storage_root, {"type": "shared_fs"})
    with pytest.raises(AllocationError, match="cannot prepare experiment 5's checkpoint"):
        refused.launch()


def test_the_storage_roots_owner_may_delete_what_isolated_trials_wrote(
    storage_root: Path,
) -> None:
    master = Identity(BASE + 900, BASE + 900)  # the account the master runs as
    os.chown(storage_root, master.uid, master.gid)
    mine = storage_root / "5"
    Isolation("uid", BASE, 100).give_experiment_directory(mine, 5)
    assert mine.stat().st_mode & 0o7777 == 0o2770  # the ACL keeps the mode's meaning

    # A trial writes a checkpoint as its own uid and the experiment's group (umask 007).
    wrote = _run_as(
        Identity(BASE + 1, BASE + 5),
        f"mkdir {mine}/ckpt && echo w > {mine}/ckpt/model.pt && mkdir {mine}/ckpt/sub",
    )
    assert wrote.returncode == 0, wrote.stderr
    # Garbage collection, as the master's account: it may delete all of it.
    deleted = _run_as(master, f"rm -r {mine}/ckpt && ls -A {mine}")
    assert deleted.returncode == 0, deleted.stderr
    assert deleted.stdout == ""
    # Another experiment's trial still may not.
    _run_as(Identity(BASE + 1, BASE + 5), f"mkdir {mine}/ckpt2")
    other = _run_as(Identity(BASE + 2, BASE + 6), f"rm -r {mine}/ckpt2; echo rm=$?")
    assert "rm=1" in other.stdout
    assert (mine / "ckpt2").is_dir()


def test_an_isolating_agent_whose_python_no_trial_can_run_refuses_to_start(
    tmp_path: Path,
) -> None:
    """A Python under a directory only root may enter (e.g. a virtualenv in /root): every
    trial placed on the agent would fail; the agent says so at its start instead."""
    from assay.agent._agent import Agent
    from assay.agent._config import AgentSettings

    base = Path(tempfile.mkdtemp())  # pytest's own tmp_path is root's only
    base.chmod(0o755)
    private = base / "root-only"
    private.mkdir(mode=0o700)
    python = private / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    settings = AgentSettings(
        master="127.0.0.1:1",
        agent_id="probe",
        slot_type="cpu",
        slots=1,
        work_dir=base / "work",  # where the lent uid reaches it (checked first)
        isolation="uid",
        isolation_uid_base=BASE,
        isolation_uids=100,
        cgroups="off",  # tests/agent/test_cgroups.py covers them
    )
    try:
        with pytest.raises(ValueError, match="cannot run .*root-only/python -m assay._cluster"):
            Agent(settings, harness_command=(str(python), "-m", "assay._cluster"))
        private.chmod(0o755)
        real = Path(sys.executable).resolve()
        if all(parent.stat().st_mode & 0o001 for parent in real.parents):
            # The same Python where every user may run it: the agent starts.
            Agent(settings, harness_command=(str(python), "-m", "assay._cluster"))
        else:  # as on a machine whose Python is under /root: named too
            # The script execs this Python by the path it was started with (a venv's
            # link to it, maybe), which the shell names.
            denied = f"{re.escape(sys.executable)}: Permission denied"
            with pytest.raises(ValueError, match=denied):
                Agent(settings, harness_command=(str(python), "-m", "assay._cluster"))
    finally:
        shutil.rmtree(base)


# A uid range of this test run's own: the checks below kill what lives under its uids.
OWN_BASE = 1_950_000_000 + (os.getpid() % 10_000) * 10
# Forks and exits every few milliseconds (a new pid each time), beating into BEAT: a
# shell script, as a uid of no account cannot run this machine's Python. $0 is itself.
SHELL_FORK_LOOP = 'echo . >> BEAT; sleep 0.001; /bin/sh -c "$0" "$0" & exit 0'


@pytest.fixture
def beat() -> Iterator[Path]:
    """A heartbeat file any uid may append to."""
    folder = Path(tempfile.mkdtemp(prefix="assay-beat-"))
    folder.chmod(0o755)
    path = folder / "beat"
    path.touch(mode=0o666)
    path.chmod(0o666)
    yield path
    shutil.rmtree(folder)


def _beating(path: Path) -> bool:
    before = path.stat().st_size
    time.sleep(0.3)
    return path.stat().st_size > before


def test_the_turn_of_uids_survives_an_agents_restart(tmp_path: Path) -> None:
    first = Isolation("uid", OWN_BASE, 5, lock_dir=tmp_path / "uids")
    lent = [first.lend(f"a{i}", experiment_id=1) for i in range(2)]
    assert [i.uid for i in lent if i is not None] == [OWN_BASE, OWN_BASE + 1]
    for identity in lent:
        first.give_back(identity)

    restarted = Isolation("uid", OWN_BASE, 5, lock_dir=tmp_path / "uids")
    again = restarted.lend("b", experiment_id=1)
    assert again is not None
    assert again.uid == OWN_BASE + 2  # not the first of the range again


def test_a_uid_under_which_a_process_still_lives_is_not_lent(tmp_path: Path) -> None:
    """A process left under a uid (its agent was killed, say) keeps the uid from being
    lent, and is killed: a new allocation never shares a uid with a stranger's process."""
    leftover = Identity(OWN_BASE, OWN_BASE)
    sleeper = subprocess.Popen(wrap_command(["/bin/sleep", "60"], os.getpid(), leftover))
    try:
        deadline = time.monotonic() + 10
        while psutil.Process(sleeper.pid).uids().real != OWN_BASE:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        isolation = Isolation("uid", OWN_BASE, 3, lock_dir=tmp_path / "uids")
        lent = isolation.lend("a", experiment_id=1)
        assert lent is not None
        assert lent.uid == OWN_BASE + 1
        assert sleeper.wait(timeout=10) == -9  # and the leftover was killed
        assert processes_of(OWN_BASE) == set()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_every_process_of_a_uid_is_killed_even_one_forking_every_millisecond(
    beat: Path,
) -> None:
    identity = Identity(OWN_BASE + 3, OWN_BASE + 3)
    loop = SHELL_FORK_LOOP.replace("BEAT", str(beat))
    for _ in range(3):
        command = wrap_command(["/bin/sh", "-c", loop, loop], os.getpid(), identity)
        subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    assert _beating(beat)

    assert kill_processes_of(identity.uid)

    assert processes_of(identity.uid) == set()
    assert not _beating(beat), "a process of the uid outlived the kill"


@pytest.fixture
def closed_folder() -> Iterator[Path]:
    """A folder only root may enter, as `mktemp -d` makes one (0700), outside pytest's
    own folders (root's too)."""
    folder = Path(tempfile.mkdtemp(prefix="assay-closed-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _isolating_agent(work_dir: Path) -> Any:
    from assay.agent import Agent, AgentSettings

    settings = AgentSettings(
        master="127.0.0.1:9",
        agent_id="closed-work-dir",
        slot_type="cpu",
        slots=1,
        work_dir=work_dir,
        isolation="uid",
        cgroups="off",
    )
    # Not `python -m assay._cluster`: this Python may be out of a lent uid's reach too,
    # and that check is not this test's.
    return Agent(settings, harness_command=[sys.executable, "worker.py"])


def test_an_agent_whose_trials_cannot_reach_its_work_dir_refuses_to_start(
    closed_folder: Path,
) -> None:
    work_dir = closed_folder / "agent"

    with pytest.raises(ValueError, match="cannot reach the work dir") as refused:
        _isolating_agent(work_dir)

    said = str(refused.value)
    assert f"{closed_folder} (mode 0700) lets no other user through" in said
    assert f"`chmod o+x {closed_folder}`" in said
    assert "work_dir that every user can pass through" in said
    assert "isolation: none" in said


def test_once_its_trials_can_pass_through_the_agent_starts(closed_folder: Path) -> None:
    closed_folder.chmod(0o711)
    work_dir = closed_folder / "deeper" / "agent"
    (closed_folder / "deeper").mkdir(mode=0o755)

    agent = _isolating_agent(work_dir)

    assert agent.work_dir == work_dir
    assert (work_dir / "allocations").stat().st_mode & 0o777 == 0o711
    # What a lent uid does first: enter its allocation's directory and read trial.json.
    allocation = work_dir / "allocations" / "a1"
    allocation.mkdir(mode=0o700)
    (allocation / "trial.json").write_text("{}")
    os.chown(allocation, BASE + 8, BASE + 8)
    os.chown(allocation / "trial.json", BASE + 8, BASE + 8)
    read = _run_as(Identity(BASE + 8, BASE + 8), f"cat {allocation}/trial.json")
    assert read.returncode == 0, read.stderr
    assert read.stdout == "{}"


def test_assay_agent_says_what_to_do_about_a_closed_work_dir(closed_folder: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "assay.agent.main", "--master", "127.0.0.1:9", "--slot-type",
         "cpu", "--isolation", "uid", "--cgroups", "off", "--work-dir",
         str(closed_folder / "agent")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip

    assert done.returncode == 1
    assert done.stderr.startswith(
        "assay-agent: error: trials run as a uid of their own (isolation: uid), and such a "
        f"uid cannot reach the work dir {closed_folder / 'agent'}: {closed_folder} (mode 0700)"
    ), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
