"""Device detection (with a fake NVML), backoff, outbox, log batching, request checks."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from assay.agent import NoGPUError, detect_devices
from assay.agent._allocation import AllocationError, trial_spec, validate
from assay.agent._config import AgentSettings
from assay.agent._connection import Backoff, Outbox
from assay.agent._devices import cpu_devices, cpu_model_name
from assay.agent._logs import MAX_BATCH_BYTES, MAX_LINES, LogBatcher, parse_level
from assay.common.settings import SettingsError
from assay.common.spec import SPEC_ENV, ClusterSpec, spec_from_env
from assay.proto import agent_pb2, common_pb2
from tests.agent.conftest import BrokenNVML, FakeNVML


def test_fake_nvml_gives_two_cuda_devices() -> None:
    monitor = detect_devices(nvml=FakeNVML())

    assert monitor.kind == "cuda"
    assert [d.index for d in monitor.devices] == [0, 1]
    assert {d.name for d in monitor.devices} == {"NVIDIA H100 80GB HBM3"}
    assert monitor.devices[1].uuid == "GPU-00000001-aaaa"
    assert all(d.memory_bytes == 80 * 2**30 for d in monitor.devices)
    assert [d.utilization for d in monitor.sample()] == [0.25, 0.5]
    proto = monitor.devices[0].to_proto()
    assert proto.type == common_pb2.SLOT_TYPE_CUDA


def test_slots_caps_the_gpus_and_cpu_type_ignores_them() -> None:
    assert len(detect_devices(slots=1, nvml=FakeNVML()).devices) == 1
    monitor = detect_devices("cpu", 3, nvml=FakeNVML())
    assert monitor.kind == "cpu"
    assert len(monitor.devices) == 3


@pytest.mark.parametrize("nvml", [BrokenNVML(), FakeNVML(count=0)])
def test_without_gpus_cpu_slots_are_offered(nvml: FakeNVML) -> None:
    monitor = detect_devices(slots=2, nvml=nvml)

    assert monitor.kind == "cpu"
    assert [d.name for d in monitor.devices] == [cpu_model_name()] * 2
    assert monitor.devices[0].memory_bytes > 0
    assert 0.0 <= monitor.sample()[0].utilization <= 1.0


def test_cuda_without_gpus_is_a_clear_error() -> None:
    with pytest.raises(NoGPUError, match=r"no GPU was found \(NVML failed: Driver Not Loaded\)"):
        detect_devices("cuda", nvml=BrokenNVML())


def test_cpu_slots_default_to_cpu_count_and_must_be_positive() -> None:
    assert len(cpu_devices()) >= 1
    with pytest.raises(ValueError, match="at least 1"):
        cpu_devices(0)


def test_backoff_retries_steadily_then_doubles_to_ten_seconds_with_jitter() -> None:
    no_jitter = Backoff(rng=lambda: 0.0)
    assert [no_jitter.next() for _ in range(13)] == [0.5] * 8 + [1, 2, 4, 8, 10]
    assert no_jitter.next() == 10
    no_jitter.reset()
    assert no_jitter.next() == 0.5
    doubling = Backoff(rng=lambda: 0.0, steady=1)
    assert [doubling.next() for _ in range(7)] == [0.5, 1, 2, 4, 8, 10, 10]
    full = Backoff(rng=lambda: 1.0)
    assert full.next() == pytest.approx(0.4)
    with pytest.raises(ValueError, match="initial"):
        Backoff(initial=0)
    with pytest.raises(ValueError, match="steady"):
        Backoff(steady=0)


def _batch(allocation: str, *messages: str) -> agent_pb2.AgentMessage:
    lines = [common_pb2.LogLine(trial_id=7, run_id=1, message=m) for m in messages]
    return agent_pb2.AgentMessage(logs=agent_pb2.LogBatch(allocation_id=allocation, lines=lines))


def _drain(outbox: Outbox) -> list[agent_pb2.AgentMessage]:
    got = []
    while (message := outbox.get(0)) is not None:
        got.append(message)
    return got


def test_outbox_drops_oldest_logs_but_never_state_changes() -> None:
    outbox = Outbox(max_log_batches=2)
    state = agent_pb2.AgentMessage(
        allocation_state=agent_pb2.AllocationStateChange(allocation_id="a")
    )
    outbox.put(state)
    for name in "xyz":
        outbox.put(_batch(name, f"{name} line"))

    got = _drain(outbox)
    assert got[0] == state
    assert [[line.message for line in m.logs.lines] for m in got[1:]] == [
        [
            "assay-agent: 1 log lines were dropped here: the trial printed faster than the "
            "master stored its log"
        ],
        ["y line"],
        ["z line"],
    ]
    assert got[1].logs.lines[0].stream == "assay"
    assert outbox.dropped_log_batches == 1
    assert outbox.get(0.01) is None


def test_a_flooding_allocation_loses_its_own_lines_not_a_quiet_ones() -> None:
    """The stream takes one batch for every two the flood puts: the outbox stays full,
    and the quiet allocation, far below its half of the stream, loses nothing."""
    outbox = Outbox(max_log_batches=10)
    got: list[agent_pb2.AgentMessage] = []
    for i in range(200):
        outbox.put(_batch("flood", *[f"flood {i}.{j}" for j in range(5)]))
        if i % 10 == 0:
            outbox.put(_batch("quiet", f"quiet {i}"))
        if i % 2 and (message := outbox.get(0)) is not None:
            got.append(message)
    got += _drain(outbox)

    quiet = [line for m in got if m.logs.allocation_id == "quiet" for line in m.logs.lines]
    flood = [line for m in got if m.logs.allocation_id == "flood" for line in m.logs.lines]
    assert [line.message for line in quiet] == [f"quiet {i}" for i in range(0, 200, 10)]
    markers = [line for line in flood if line.stream == "assay"]
    kept = [line for line in flood if line.stream != "assay"]
    assert markers
    assert all(line.trial_id == 7 for line in markers)
    dropped = sum(int(line.message.split()[1]) for line in markers)
    assert dropped == outbox.dropped_log_lines
    assert dropped + len(kept) == 1000
    assert kept[-1].message == "flood 199.4"


def test_allocations_take_turns() -> None:
    outbox = Outbox()
    for i in range(3):
        outbox.put(_batch("a", f"a{i}"))
    outbox.put(_batch("b", "b0"))
    outbox.put(_batch("b", "b1"))

    order = [m.logs.lines[0].message for m in _drain(outbox)]
    assert order == ["a0", "b0", "a1", "b1", "a2"]


def test_an_exit_goes_out_after_the_lines_queued_before_it() -> None:
    outbox = Outbox()
    outbox.put(_batch("a", "first"))
    outbox.put(_batch("a", "last"))
    exited = agent_pb2.AgentMessage(
        allocation_state=agent_pb2.AllocationStateChange(
            allocation_id="a", state=agent_pb2.ALLOCATION_STATE_EXITED
        )
    )
    outbox.put(exited)
    outbox.put(_batch("b", "other"))

    got = _drain(outbox)
    assert [m.WhichOneof("message") for m in got] == ["logs", "logs", "allocation_state", "logs"]
    assert [m.logs.lines[0].message for m in got[:2]] == ["first", "last"]


def test_lines_dropped_while_the_master_is_away_say_so(caplog: pytest.LogCaptureFixture) -> None:
    connected = False
    outbox = Outbox(max_log_batches=1, connected=lambda: connected)
    outbox.put(_batch("a", "1"))
    outbox.put(_batch("a", "2"))

    assert "the master was unreachable" in _drain(outbox)[0].logs.lines[0].message
    assert "master was unreachable" in caplog.text
    assert "master unreachable" not in caplog.text


@pytest.mark.parametrize(
    ("line", "level"),
    [
        ("ERROR: boom", "ERROR"),
        ("WARNING:root:careful", "WARNING"),
        ("[INFO] hello", "INFO"),
        ("  WARN low disk", "WARNING"),
        ("epoch 3 ERROR rate 0.1", ""),
        ("INFORMATION", ""),
    ],
)
def test_levels_are_parsed_from_the_start_of_a_line(line: str, level: str) -> None:
    assert parse_level(line) == level


def test_batcher_flushes_on_time_and_size() -> None:
    batches: list[agent_pb2.LogBatch] = []
    sent = threading.Event()

    def send(batch: agent_pb2.LogBatch) -> None:
        batches.append(batch)
        sent.set()

    batcher = LogBatcher("a1", send, trial_id=4, flush_interval=60, max_lines=3)
    batcher.start()
    for i in range(3):
        batcher.add(1, "stderr", f"ERROR {i}")
    assert sent.wait(5), "a full batch was not flushed before the interval"
    batcher.add(0, "stdout", "tail")
    batcher.close()

    assert [len(b.lines) for b in batches] == [3, 1]
    first = batches[0].lines[0]
    assert (first.rank, first.stream, first.level, first.trial_id) == (1, "stderr", "ERROR", 4)
    assert abs(first.timestamp.ToNanoseconds() / 1e9 - time.time()) < 60


def test_log_batches_stay_under_the_masters_message_limit() -> None:
    batches: list[agent_pb2.LogBatch] = []
    batcher = LogBatcher("a1", batches.append, flush_interval=60)
    long_line = "x" * 64 * 1024  # the longest line the agent reads
    for _ in range(MAX_LINES):  # 32 MiB in 500 lines: once one message
        batcher.add(0, "stdout", long_line)
    batcher.close()

    assert sum(len(b.lines) for b in batches) == MAX_LINES
    assert max(b.ByteSize() for b in batches) < MAX_BATCH_BYTES + 2 * len(long_line)
    assert max(b.ByteSize() for b in batches) < 4 * 2**20  # what the master takes


@pytest.mark.parametrize(
    ("fields", "busy", "problem"),
    [
        ({"allocation_id": "../x", "slots": [0], "ranks": [0], "world_size": 1}, set(), "safe"),
        ({"allocation_id": "a", "slots": [0, 1], "ranks": [0], "world_size": 2}, set(), "2 slots"),
        (
            {"allocation_id": "a", "slots": [5], "ranks": [0], "world_size": 1},
            set(),
            "do not exist",
        ),
        ({"allocation_id": "a", "slots": [1], "ranks": [0], "world_size": 1}, {1}, "already"),
        ({"allocation_id": "a", "slots": [0], "ranks": [3], "world_size": 2}, set(), "world size"),
    ],
)
def test_impossible_allocations_are_refused(
    fields: dict[str, object], busy: set[int], problem: str
) -> None:
    with pytest.raises(AllocationError, match=problem):
        validate(agent_pb2.StartAllocation(**fields), 2, busy)  # type: ignore[arg-type]


def test_exits_still_queued_are_listed_as_unreported() -> None:
    outbox = Outbox()
    exited = agent_pb2.AllocationStateChange(
        allocation_id="a.1", state=agent_pb2.ALLOCATION_STATE_EXITED, exit_codes=[0]
    )
    running = agent_pb2.AllocationStateChange(
        allocation_id="b.1", state=agent_pb2.ALLOCATION_STATE_RUNNING
    )
    outbox.put(agent_pb2.AgentMessage(allocation_state=running))
    outbox.put(agent_pb2.AgentMessage(allocation_state=exited))
    assert outbox.unreported_exits() == {"a.1"}
    outbox.get(0.1)
    outbox.get(0.1)  # handed to a stream: the master hears of it there
    assert outbox.unreported_exits() == set()


@pytest.mark.parametrize("location", ["", "s3://bucket/runs/abc"])
def test_the_spec_the_agent_writes_is_the_one_the_harness_reads(
    tmp_path: Path, location: str
) -> None:
    start = agent_pb2.StartAllocation(
        allocation_id="a.7",
        trial_id=11,
        run_id=2,
        experiment_id=5,
        config_json=json.dumps({"name": "spec", "searcher": {"name": "single"}}),
        hparams_json=json.dumps({"lr": 0.1, "layers": [2, 3]}),
        trial_seed=77,
        checkpoint_root="/checkpoints",
        checkpoint_location=location,
        trial_api="127.0.0.1:9999",
        token="secret-token",
    )
    path = tmp_path / "trial.json"

    trial_spec(start).write(path)
    read = spec_from_env({SPEC_ENV: str(path)})

    assert read == ClusterSpec(
        config={"name": "spec", "searcher": {"name": "single"}},
        hparams={"lr": 0.1, "layers": [2, 3]},
        trial_seed=77,
        trial_id=11,
        run_id=2,
        experiment_id=5,
        allocation_id="a.7",
        checkpoint_root="/checkpoints",
        restore_from=location or None,
        trial_api="127.0.0.1:9999",
        token="secret-token",
    )
    assert os.stat(path).st_mode & 0o777 == 0o600  # it holds the allocation's token


def test_a_spec_with_a_bad_config_is_refused_before_anything_runs() -> None:
    start = agent_pb2.StartAllocation(allocation_id="a", config_json="{not json")
    with pytest.raises(AllocationError, match="config_json is not valid JSON"):
        trial_spec(start)


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        ({"master": "nohost"}, "master must be HOST:PORT, got 'nohost'"),
        ({"master": "m:1", "slots": 0}, "slots must be at least 1, got 0"),
        ({"master": "m:1", "heartbeat_timeout": 0.0}, "heartbeat_timeout must be positive"),
    ],
)
def test_agent_settings_refuse_what_a_key_kind_cannot_judge(
    values: dict[str, object], problem: str
) -> None:
    with pytest.raises(SettingsError, match=problem):
        AgentSettings(**values)  # type: ignore[arg-type]


def test_the_agents_secret_variables_never_reach_a_trial() -> None:
    from assay.agent._allocation import is_agent_secret

    for name in (
        "ASSAY_JOIN_TOKEN",
        "ASSAY_METRICS_TOKEN",  # a master's setting in the same environment
        "ASSAY_DB_URL",
        "ASSAY_TLS_KEY",
        "ASSAY_S3_SECRET_ACCESS_KEY",
        "ASSAY_INITIAL_ADMIN_PASSWORD",
    ):
        assert is_agent_secret(name), name
    for name in ("ASSAY_MASTER", "ASSAY_TRIAL_SPEC", "ASSAY_TRACEBACK", "PATH", "HF_TOKEN"):
        assert not is_agent_secret(name), name  # HF_TOKEN: the user's own, if the agent has it


def test_a_process_that_outlives_its_sigterm_grace_is_killed_and_the_log_says_so(
    tmp_path: Path,
) -> None:
    from assay.agent._process import RankProcesses, RankSpec

    lines: list[tuple[int, str, str]] = []
    ignores = "trap '' TERM; echo ready; sleep 30"
    processes = RankProcesses(
        ["/bin/sh", "-c", ignores],
        tmp_path,
        [RankSpec(0, {"PATH": "/usr/bin:/bin"})],
        lambda rank, stream, line: lines.append((rank, stream, line)),
    )
    processes.spawn()
    deadline = time.monotonic() + 10
    while not any(line == "ready" for _, _, line in lines):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    processes.terminate(0.3)
    assert processes.wait().codes == [-9]
    said = [line for _, stream, line in lines if stream == "assay"]
    assert len(said) == 1
    assert "rank 0 still running 0.3 s after SIGTERM: killed (SIGKILL)" in said[0]
    assert "should_preempt()" in said[0]


def test_a_process_killed_outright_gets_no_grace_line(tmp_path: Path) -> None:
    from assay.agent._process import RankProcesses, RankSpec

    lines: list[str] = []
    processes = RankProcesses(
        ["/bin/sh", "-c", "sleep 30"],
        tmp_path,
        [RankSpec(0, {"PATH": "/usr/bin:/bin"})],
        lambda rank, stream, line: lines.append(stream),
    )
    processes.spawn()
    processes.kill()
    processes.wait()
    assert "assay" not in lines


def test_the_exit_report_names_the_ranks_that_had_left_when_another_failed(
    tmp_path: Path,
) -> None:
    from assay.agent._process import RankProcesses, RankSpec

    processes = RankProcesses(
        ["/bin/sh", "-c", 'if [ "$RANK" = 0 ]; then exit 0; fi; sleep 0.5; exit 1'],
        tmp_path,
        [RankSpec(r, {"PATH": "/usr/bin:/bin", "RANK": str(r)}) for r in (0, 1)],
        lambda rank, stream, line: None,
    )
    processes.spawn()
    report = processes.wait()
    assert report.codes == [0, 1]
    assert (report.failed, report.early) == (1, (0,))
