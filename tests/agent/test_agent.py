"""The agent against a real gRPC master stand-in on loopback, launching real processes."""

from __future__ import annotations

import io
import json
import os
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from assay.agent import Agent
from assay.common.spec import ClusterSpec
from assay.proto import agent_pb2, common_pb2
from tests.agent.conftest import FakeMaster, FakeNVML, kill_message, start_message

RunAgent = Callable[..., Agent]


def _reports(master: FakeMaster, allocation_id: str) -> dict[int, dict[str, Any]]:
    """Each rank's REPORT line (environment, files, trial spec), by rank."""
    found = {}
    for line in master.lines(allocation_id):
        if line.message.startswith("REPORT "):
            found[line.rank] = json.loads(line.message.removeprefix("REPORT "))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_registers_cpu_slots_and_sends_heartbeats(master: FakeMaster, run_agent: RunAgent) -> None:
    run_agent()

    register = master.wait_for("register")
    assert register.agent_id == "test-agent"
    assert register.version
    assert register.slot_type == common_pb2.SLOT_TYPE_CPU
    assert [d.index for d in register.devices] == [0, 1]
    assert all(d.name and d.memory_bytes > 0 for d in register.devices)
    assert register.address == "127.0.0.1"
    assert register.memory_bytes > 0
    assert list(register.running_allocations) == []
    master.wait_for("heartbeat", lambda _: len(master.of("heartbeat")) >= 3, timeout=5)
    beat = master.of("heartbeat")[-1]
    assert len(beat.devices) == 2
    assert 0 < beat.memory_used_fraction < 1
    assert abs(beat.time.ToNanoseconds() / 1e9 - time.time()) < 60


def test_registers_gpus_from_nvml(master: FakeMaster, run_agent: RunAgent) -> None:
    run_agent(nvml=FakeNVML(), slot_type="cuda", slots=None)

    register = master.wait_for("register")
    assert register.slot_type == common_pb2.SLOT_TYPE_CUDA
    assert [(d.index, d.name, d.memory_bytes) for d in register.devices] == [
        (0, "NVIDIA H100 80GB HBM3", 80 * 2**30),
        (1, "NVIDIA H100 80GB HBM3", 80 * 2**30),
    ]
    assert register.devices[0].type == common_pb2.SLOT_TYPE_CUDA
    beat = master.wait_for("heartbeat")
    assert [d.utilization for d in beat.devices] == [0.25, 0.5]


def test_two_slots_get_the_distributed_environment_and_the_model(
    master: FakeMaster, run_agent: RunAgent, tmp_path: Path
) -> None:
    agent = run_agent()
    master.wait_for("register")

    # Slot 1 runs rank 3, slot 0 runs rank 2, of a trial spread over two agents.
    master.send(start_message("a1", {"mode": "exit"}, slots=[1, 0], ranks=[3, 2], world_size=4))

    running = master.wait_for("allocation_state", lambda c: c.allocation_id == "a1")
    assert running.state == agent_pb2.ALLOCATION_STATE_RUNNING
    exited = master.exited("a1")
    assert list(exited.exit_codes) == [0, 0]
    assert exited.message == "all 2 processes exited with code 0"
    reports = _reports(master, "a1")
    assert sorted(reports) == [2, 3]
    spec_path = str(agent.work_dir / "allocations" / "a1" / "trial.json")
    for rank, local_rank in ((3, 0), (2, 1)):
        env = reports[rank]["env"]
        assert env == {
            "RANK": str(rank),
            "WORLD_SIZE": "4",
            "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "10.1.2.3",
            "MASTER_PORT": "29555",
            "ASSAY_TRIAL_SPEC": spec_path,
            "CUDA_VISIBLE_DEVICES": "",
            "OMP_NUM_THREADS": env["OMP_NUM_THREADS"]
            if "OMP_NUM_THREADS" in os.environ
            else str(max(1, (os.cpu_count() or 1) // 2)),
            "PYTHONUNBUFFERED": "1",
            # The agent's secrets (set for this test session) never reach a trial.
            "ASSAY_JOIN_TOKEN": None,
            "ASSAY_PASSWORD": None,
            "ASSAY_INITIAL_ADMIN_PASSWORD": None,
        }
        assert os.environ["ASSAY_JOIN_TOKEN"]
        assert reports[rank]["files"] == ["data/info.txt", "worker.py"]
    spec = reports[3]["spec"]
    assert spec == {
        "config": {"name": "agent-test"},
        "hparams": {"mode": "exit"},
        "trial_seed": 77,
        "trial_id": 11,
        "run_id": 2,
        "experiment_id": 5,
        "allocation_id": "a1",
        "checkpoint_root": "/checkpoints",
        "restore_from": "/checkpoints/abc",
        "trial_api": "127.0.0.1:9999",
        "token": "secret-token",
        "restore_sha256": None,  # the master recorded no sha256s for it
    }
    assert ClusterSpec.from_dict(spec).to_dict() == spec  # what the harness reads
    # The directory goes once the processes are done.
    deadline = time.monotonic() + 5
    while (agent.work_dir / "allocations" / "a1").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not (agent.work_dir / "allocations" / "a1").exists()


def test_log_lines_carry_rank_stream_and_level(master: FakeMaster, run_agent: RunAgent) -> None:
    run_agent()
    master.wait_for("register")

    master.send(start_message("logs", {"mode": "exit"}))
    master.exited("logs")

    lines = master.lines("logs")
    got = {(x.rank, x.stream, x.level, x.message) for x in lines if "REPORT" not in x.message}
    assert got == {
        (0, "stdout", "INFO", "INFO rank 0 started"),
        (1, "stdout", "INFO", "INFO rank 1 started"),
        (0, "stderr", "WARNING", "WARNING rank 0 writes to stderr"),
        (1, "stderr", "WARNING", "WARNING rank 1 writes to stderr"),
    }
    assert {(x.trial_id, x.run_id) for x in lines} == {(11, 2)}
    # Every log line reaches the master before the EXITED that follows it.
    order = [
        m.WhichOneof("message") for m in master.messages if m.WhichOneof("message") != "heartbeat"
    ]
    assert order[-1] == "allocation_state"


def test_exit_codes_are_reported_per_rank(master: FakeMaster, run_agent: RunAgent) -> None:
    run_agent()
    master.wait_for("register")

    master.send(start_message("codes", {"mode": "exit", "codes": [0, 4], "delays": [0, 0.5]}))

    exited = master.exited("codes")
    assert list(exited.exit_codes) == [0, 4]
    assert exited.message.startswith("rank 1 exited with code 4; its last output: ")


def test_a_failing_rank_takes_down_the_other(master: FakeMaster, run_agent: RunAgent) -> None:
    run_agent()
    master.wait_for("register")

    master.send(start_message("fail", {"mode": "fail", "failing_rank": 1}))

    exited = master.exited("fail")
    assert list(exited.exit_codes) == [-15, 3]
    assert exited.message == (
        "rank 1 exited with code 3; its last output: ERROR rank 1 is failing; "
        "the other ranks were stopped"
    )
    # What the master compares with the run before, the rank left out.
    assert exited.failure == "exited with code 3: ERROR rank 1 is failing"
    pids = [r["pid"] for r in _reports(master, "fail").values()]
    assert not any(_alive(pid) for pid in pids)


def test_graceful_kill_lets_processes_exit_cleanly(master: FakeMaster, run_agent: RunAgent) -> None:
    run_agent()
    master.wait_for("register")
    master.send(start_message("trap", {"mode": "trap"}))
    master.wait_ready("trap", 2)

    master.send(kill_message("trap", graceful=True, grace=20))

    exited = master.exited("trap", timeout=10)
    assert list(exited.exit_codes) == [0, 0]
    assert exited.message == "killed by the master (SIGTERM, then SIGKILL after 20s)"
    assert exited.failure == ""  # the master's stop is no failure of the trial
    assert master.wait_line("trap", "got SIGTERM").stream == "stdout"


def test_processes_ignoring_sigterm_are_killed_after_the_grace(
    master: FakeMaster, run_agent: RunAgent
) -> None:
    run_agent()
    master.wait_for("register")
    master.send(start_message("stubborn", {"mode": "ignore"}, slots=[0]))
    master.wait_line("stubborn", "ready")

    began = time.monotonic()
    master.send(kill_message("stubborn", graceful=True, grace=1))

    exited = master.exited("stubborn", timeout=10)
    assert list(exited.exit_codes) == [-9]
    assert 0.9 <= time.monotonic() - began < 5


def test_forced_kill_is_immediate(master: FakeMaster, run_agent: RunAgent) -> None:
    run_agent()
    master.wait_for("register")
    master.send(start_message("forced", {"mode": "ignore"}, slots=[0]))
    master.wait_line("forced", "ready")

    began = time.monotonic()
    master.send(kill_message("forced", graceful=False))

    exited = master.exited("forced", timeout=10)
    assert list(exited.exit_codes) == [-9]
    assert exited.message == "killed by the master (SIGKILL)"
    assert time.monotonic() - began < 2


def test_killing_an_unknown_allocation_reports_it_exited(
    master: FakeMaster, run_agent: RunAgent
) -> None:
    run_agent()
    master.wait_for("register")

    master.send(kill_message("ghost", graceful=True))

    assert master.exited("ghost").message == "not running on this agent"


def _evil_tarball(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        good = tarfile.TarInfo("worker.py")
        good.size = 2
        tar.addfile(good, io.BytesIO(b"#\n"))
        info = tarfile.TarInfo(name)
        info.type = kind
        info.linkname = link
        data = b"pwned\n" if kind == tarfile.REGTYPE else b""
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.mark.parametrize("case", ["dotdot", "absolute", "symlink"])
def test_unsafe_model_definitions_are_refused(
    master: FakeMaster, run_agent: RunAgent, tmp_path: Path, case: str
) -> None:
    agent = run_agent()
    master.wait_for("register")
    target = tmp_path / "evil"
    model = {
        "dotdot": _evil_tarball("../../../evil"),
        "absolute": _evil_tarball(str(target)),
        "symlink": _evil_tarball("escape", tarfile.SYMTYPE, str(tmp_path)),
    }[case]

    master.send(start_message("evil", {"mode": "exit"}, model=model))

    exited = master.exited("evil")
    assert list(exited.exit_codes) == []
    assert exited.message.startswith("refused the model definition: ")
    assert "outside" in exited.message
    assert not target.exists()
    assert not (agent.work_dir / "allocations" / "evil").exists()
    assert not any(x.message for x in master.lines("evil"))


def test_a_bad_start_is_refused_with_a_reason(master: FakeMaster, run_agent: RunAgent) -> None:
    run_agent()
    master.wait_for("register")

    master.send(start_message("too-many", {"mode": "exit"}, slots=[0, 1, 2]))

    assert "do not exist on this agent" in master.exited("too-many").message


@pytest.mark.slow
def test_reconnects_and_lists_its_running_allocation(
    master: FakeMaster, run_agent: RunAgent, caplog: pytest.LogCaptureFixture
) -> None:
    run_agent()
    master.wait_for("register")
    master.send(start_message("survivor", {"mode": "trap"}, slots=[0]))
    master.wait_line("survivor", "ready")
    pid = _reports(master, "survivor")[0]["pid"]

    port = master.port
    master.stop()
    time.sleep(1.0)  # at least one refused attempt
    master.start(port)

    again = master.wait_for("register", lambda _: len(master.of("register")) >= 2, timeout=15)
    again = master.of("register")[-1]
    assert list(again.running_allocations) == ["survivor"]
    assert _alive(pid)
    assert f"cannot reach master at 127.0.0.1:{port} (" in caplog.text
    assert "; retrying in " in caplog.text
    master.send(kill_message("survivor", graceful=True))
    assert list(master.exited("survivor").exit_codes) == [0]
