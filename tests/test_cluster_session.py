"""`python -m assay._cluster` against a real gRPC TrialService served by this test.

The servicer hands out operations (train to 8, then 16, then stop), records every call
with the token it carried, and can fail the first calls with UNAVAILABLE or refuse a
method with a chosen status, as a restarting or fencing master would.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message

from assay._checkpoint import read_metadata
from assay._rank_processes import free_port
from assay._trial_client import (
    MasterUnreachableError,
    TrialAPIError,
    TrialClient,
    retry_budget_from_env,
)
from assay.common.spec import ClusterSpec
from assay.errors import PERMANENT_ERROR_EXIT_CODE, PREEMPTED_EXIT_CODE, AssayError
from assay.proto import common_pb2, trial_pb2, trial_pb2_grpc
from tests.conftest import REGRESSION_DIR, S3Server, regression_config

TOKEN = "secret-token-7"
TRIAL_ID = 7
EXPERIMENT_ID = 3


@dataclass
class Call:
    method: str
    request: Any
    token: str | None


@dataclass
class FakeTrialService(trial_pb2_grpc.TrialServiceServicer):
    """Train to each of `targets` in turn, then stop; remember every call."""

    targets: list[int]
    fail_first: int = 0
    refuse: dict[str, tuple[grpc.StatusCode, str]] = field(default_factory=dict)
    preempt: bool = False  # the answer to ShouldPreempt
    attempts: list[Call] = field(default_factory=list)  # every call, failed ones too
    calls: list[Call] = field(default_factory=list)  # the calls that were answered
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _enter(self, method: str, request: Message, context: Any) -> None:
        token = dict(context.invocation_metadata()).get("x-assay-token")
        with self.lock:
            call = Call(method, request, token)
            self.attempts.append(call)
            if self.fail_first > 0:
                self.fail_first -= 1
                context.abort(grpc.StatusCode.UNAVAILABLE, "master restarting")
            if method in self.refuse:
                context.abort(*self.refuse[method])
            self.calls.append(call)

    def of(self, method: str) -> list[Any]:
        return [c.request for c in self.calls if c.method == method]

    def metrics(self, group: str) -> list[common_pb2.MetricsReport]:
        return [r for req in self.of("ReportMetrics") if req.group == group for r in req.reports]

    def NextOperation(  # noqa: N802
        self, request: trial_pb2.NextOperationRequest, context: Any
    ) -> trial_pb2.Operation:
        self._enter("NextOperation", request, context)
        for target in self.targets:
            if target > request.total_batches:
                return trial_pb2.Operation(total_batches=target)
        return trial_pb2.Operation(stop=True)

    def CompleteOperation(  # noqa: N802
        self, request: trial_pb2.CompleteOperationRequest, context: Any
    ) -> trial_pb2.CompleteOperationResponse:
        self._enter("CompleteOperation", request, context)
        return trial_pb2.CompleteOperationResponse()

    def ReportMetrics(  # noqa: N802
        self, request: trial_pb2.ReportMetricsRequest, context: Any
    ) -> trial_pb2.ReportMetricsResponse:
        self._enter("ReportMetrics", request, context)
        return trial_pb2.ReportMetricsResponse(stored=len(request.reports))

    def ReportCheckpoint(  # noqa: N802
        self, request: trial_pb2.ReportCheckpointRequest, context: Any
    ) -> trial_pb2.ReportCheckpointResponse:
        self._enter("ReportCheckpoint", request, context)
        return trial_pb2.ReportCheckpointResponse()

    def ShouldPreempt(  # noqa: N802
        self, request: trial_pb2.ShouldPreemptRequest, context: Any
    ) -> trial_pb2.ShouldPreemptResponse:
        self._enter("ShouldPreempt", request, context)
        return trial_pb2.ShouldPreemptResponse(preempt=self.preempt)

    def GetBestValidation(  # noqa: N802
        self, request: trial_pb2.GetBestValidationRequest, context: Any
    ) -> trial_pb2.GetBestValidationResponse:
        self._enter("GetBestValidation", request, context)
        return trial_pb2.GetBestValidationResponse(found=False)

    def ReportProgress(  # noqa: N802
        self, request: trial_pb2.ReportProgressRequest, context: Any
    ) -> trial_pb2.ReportProgressResponse:
        self._enter("ReportProgress", request, context)
        return trial_pb2.ReportProgressResponse()

    def DeleteTrialCheckpoints(  # noqa: N802
        self, request: trial_pb2.DeleteTrialCheckpointsRequest, context: Any
    ) -> trial_pb2.DeleteTrialCheckpointsResponse:
        self._enter("DeleteTrialCheckpoints", request, context)
        return trial_pb2.DeleteTrialCheckpointsResponse(deleted=list(request.uuids))


@contextmanager
def serve(servicer: FakeTrialService) -> Iterator[str]:
    server = grpc.server(ThreadPoolExecutor(max_workers=4))
    trial_pb2_grpc.add_TrialServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None)


@dataclass
class Finished:
    code: int
    stdout: str
    stderr: str


def write_spec(
    directory: Path,
    api: str,
    *,
    slots: int = 1,
    run_id: int = 1,
    restore_from: str | None = None,
    batches: int = 16,
    storage: dict[str, Any] | None = None,
    **hparams: Any,
) -> Path:
    config = regression_config(batches=batches, slots=slots, scheduling_unit=4, **hparams)
    if storage is not None:
        config["checkpoint_storage"] = storage
    spec = {
        "config": config,
        "hparams": dict(config["hyperparameters"]),
        "trial_seed": 11,
        "trial_id": TRIAL_ID,
        "run_id": run_id,
        "experiment_id": EXPERIMENT_ID,
        "allocation_id": f"alloc-{TRIAL_ID}-{run_id}",
        "checkpoint_root": str(directory / "checkpoints"),
        "restore_from": restore_from,
        "trial_api": api,
        "token": TOKEN,
    }
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"spec-{run_id}.json"
    path.write_text(json.dumps(spec))
    return path


def run_slots(
    spec: Path, *, slots: int = 1, extra_env: dict[str, str] | None = None
) -> list[Finished]:
    """Launch one `python -m assay._cluster` per slot, as an agent does; wait for all."""
    return wait_slots(start_slots(spec, slots=slots, extra_env=extra_env))


def start_slots(
    spec: Path, *, slots: int = 1, extra_env: dict[str, str] | None = None
) -> list[subprocess.Popen[str]]:
    port = free_port()
    procs: list[subprocess.Popen[str]] = []
    for rank in range(slots):
        env = {k: v for k, v in os.environ.items() if k != "ASSAY_MASTER_RETRY_S"}
        env.update(
            RANK=str(rank),
            WORLD_SIZE=str(slots),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(slots),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            ASSAY_TRIAL_SPEC=str(spec),
            PYTHONUNBUFFERED="1",
            OMP_NUM_THREADS="1",
            **(extra_env or {}),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "assay._cluster"],
                cwd=REGRESSION_DIR,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    return procs


def wait_slots(procs: list[subprocess.Popen[str]]) -> list[Finished]:
    finished = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=240)
            finished.append(Finished(proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return finished


def ok(finished: list[Finished]) -> None:
    for rank, f in enumerate(finished):
        assert f.code == 0, f"rank {rank} exited {f.code}:\n{f.stdout[-3000:]}\n{f.stderr[-3000:]}"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def check_checkpoints(service: FakeTrialService, root: Path, run_id: int = 1) -> None:
    validation = {r.total_batches: dict(r.metrics) for r in service.metrics("validation")}
    for req in service.of("ReportCheckpoint"):
        ckpt = req.checkpoint
        assert (req.trial_id, req.run_id) == (TRIAL_ID, run_id)
        assert (ckpt.trial_id, ckpt.experiment_id, ckpt.run_id) == (TRIAL_ID, EXPERIMENT_ID, run_id)
        assert ckpt.state == common_pb2.CHECKPOINT_STATE_COMPLETED
        location = Path(ckpt.location)
        assert location.parent == root
        assert location.name == ckpt.uuid
        assert read_metadata(location).total_batches == ckpt.total_batches
        on_disk = {p.name for p in location.iterdir()}  # the manifest too: restores check it
        assert {f.name for f in ckpt.files} == on_disk
        assert "models.pt" in on_disk
        for f in ckpt.files:
            assert f.size_bytes == (location / f.name).stat().st_size
            assert f.sha256 == sha256(location / f.name)
        assert dict(ckpt.validation_metrics) == validation[ckpt.total_batches]


# --- one slot, end to end -------------------------------------------------------------------


@dataclass
class FullRun:
    service: FakeTrialService
    directory: Path
    finished: Finished


@pytest.fixture(scope="module")
def full_run(tmp_path_factory: pytest.TempPathFactory) -> FullRun:
    directory = tmp_path_factory.mktemp("cluster-full")
    service = FakeTrialService(targets=[8, 16])
    with serve(service) as api:
        finished = run_slots(write_spec(directory, api))
    ok(finished)
    return FullRun(service, directory, finished[0])


def test_operations_are_followed_and_completed_with_the_searcher_metric(full_run: FullRun) -> None:
    service = full_run.service
    asked = service.of("NextOperation")
    assert [r.total_batches for r in asked] == [0, 8, 16]
    assert all((r.trial_id, r.run_id) == (TRIAL_ID, 1) for r in asked)
    validation = {r.total_batches: r.metrics["val_loss"] for r in service.metrics("validation")}
    completed = [(r.total_batches, r.searcher_metric) for r in service.of("CompleteOperation")]
    assert completed == [(8, validation[8]), (16, validation[16])]
    assert "done training (the searcher asks for no more)" in full_run.finished.stdout


def test_metrics_arrive_in_their_groups(full_run: FullRun) -> None:
    service = full_run.service
    groups = {r.group for r in service.of("ReportMetrics")}
    assert groups == {"training", "validation", "system"}
    assert all(len(r.reports) == 1 for r in service.of("ReportMetrics"))
    training = service.metrics("training")
    assert [r.total_batches for r in training] == [4, 8, 12, 16]  # every scheduling_unit
    assert all(set(r.metrics) == {"loss", "lr"} for r in training)
    validation = service.metrics("validation")
    assert [r.total_batches for r in validation] == [8, 16]
    assert all("val_loss" in r.metrics for r in validation)
    # Each rank's peak memory and step time, with every training report.
    system = service.metrics("system")
    assert [r.total_batches for r in system] == [4, 8, 12, 16]
    assert all(set(r.metrics) == {"memory_peak_mb/rank_0", "step_time_ms/rank_0"} for r in system)


def test_checkpoints_are_reported_with_their_files(full_run: FullRun) -> None:
    service = full_run.service
    assert [r.checkpoint.total_batches for r in service.of("ReportCheckpoint")] == [8, 16]
    check_checkpoints(service, full_run.directory / "checkpoints")


def test_every_call_carries_the_token(full_run: FullRun) -> None:
    assert full_run.service.attempts
    assert {c.token for c in full_run.service.attempts} == {TOKEN}


def test_a_restored_run_continues_at_the_checkpoints_batch(
    full_run: FullRun, tmp_path: Path
) -> None:
    at_8 = full_run.service.of("ReportCheckpoint")[0].checkpoint
    assert at_8.total_batches == 8
    service = FakeTrialService(targets=[8, 16])
    with serve(service) as api:
        spec = write_spec(tmp_path, api, run_id=2, restore_from=at_8.location)
        ok(run_slots(spec))
    assert [r.total_batches for r in service.of("NextOperation")] == [8, 16]
    assert [r.total_batches for r in service.metrics("training")] == [12, 16]
    assert [r.checkpoint.total_batches for r in service.of("ReportCheckpoint")] == [16]
    check_checkpoints(service, tmp_path / "checkpoints", run_id=2)
    # The restored run trains exactly as the uninterrupted one did.
    before = {r.total_batches: dict(r.metrics) for r in full_run.service.metrics("validation")}
    after = {r.total_batches: dict(r.metrics) for r in service.metrics("validation")}
    assert after[16] == pytest.approx(before[16], rel=1e-6)


def test_calls_survive_an_unavailable_master(tmp_path: Path) -> None:
    service = FakeTrialService(targets=[8], fail_first=3)
    with serve(service) as api:
        finished = run_slots(write_spec(tmp_path, api))
    ok(finished)
    assert len(service.attempts) == len(service.calls) + 3
    assert [r.total_batches for r in service.of("NextOperation")] == [0, 8]
    assert [r.total_batches for r in service.of("CompleteOperation")] == [8]
    out = finished[0].stdout
    assert out.count("master unreachable at") == 1  # once per outage, not per attempt
    assert "retrying" in out
    assert "reachable again" in out


def test_a_fenced_run_exits_2_with_one_clear_line(tmp_path: Path) -> None:
    reason = "run 1 of trial 7 is stale: run 2 holds the trial"
    service = FakeTrialService(
        targets=[8, 16], refuse={"ReportMetrics": (grpc.StatusCode.FAILED_PRECONDITION, reason)}
    )
    with serve(service) as api:
        [finished] = run_slots(write_spec(tmp_path, api))
    assert finished.code == 2, finished.stderr
    assert "Traceback" not in finished.stderr
    errors = [line for line in finished.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1
    assert reason in errors[0]
    assert "FAILED_PRECONDITION" in errors[0]
    assert len(service.attempts) == len(service.calls) + 1  # not retried
    assert not service.of("CompleteOperation")


@pytest.mark.slow
def test_two_slots_report_once_through_rank_0(tmp_path: Path) -> None:
    service = FakeTrialService(targets=[8, 16])
    with serve(service) as api:
        finished = run_slots(write_spec(tmp_path, api, slots=2), slots=2)
    ok(finished)
    assert [r.total_batches for r in service.of("NextOperation")] == [0, 8, 16]
    assert [r.total_batches for r in service.metrics("training")] == [4, 8, 12, 16]
    assert [r.total_batches for r in service.metrics("validation")] == [8, 16]
    assert [r.total_batches for r in service.of("CompleteOperation")] == [8, 16]
    check_checkpoints(service, tmp_path / "checkpoints")
    last = Path(service.of("ReportCheckpoint")[-1].checkpoint.location)
    assert read_metadata(last).world_size == 2
    assert {c.token for c in service.attempts} == {TOKEN}


# --- S3 checkpoint storage (a moto server on loopback) ---------------------------------------


def test_s3_checkpoints_are_uploaded_and_restored_from(s3_server: S3Server, tmp_path: Path) -> None:
    bucket = s3_server.new_bucket()
    storage = s3_server.storage_config(bucket, prefix="exp3")
    first = FakeTrialService(targets=[8, 16])
    with serve(first) as api:
        ok(run_slots(write_spec(tmp_path / "one", api, storage=storage)))
    reported = [r.checkpoint for r in first.of("ReportCheckpoint")]
    assert [c.total_batches for c in reported] == [8, 16]
    keys = s3_server.keys(bucket)
    for ckpt in reported:
        assert ckpt.location == f"s3://{bucket}/exp3/{ckpt.uuid}"
        names = {f.name for f in ckpt.files} | {"metadata.json"}
        assert {k for k in keys if k.startswith(f"exp3/{ckpt.uuid}/")} == {
            f"exp3/{ckpt.uuid}/{n}" for n in names
        }
    assert not (tmp_path / "one" / "checkpoints").exists(), "checkpoint_root is not used"

    second = FakeTrialService(targets=[8, 16])
    with serve(second) as api:
        spec = write_spec(
            tmp_path / "two", api, run_id=2, restore_from=reported[0].location, storage=storage
        )
        finished = run_slots(spec)
    ok(finished)
    assert f"downloading checkpoint {reported[0].location}" in finished[0].stdout
    assert [r.total_batches for r in second.of("NextOperation")] == [8, 16]
    assert [r.total_batches for r in second.metrics("training")] == [12, 16]
    [resumed] = [r.checkpoint for r in second.of("ReportCheckpoint")]
    assert resumed.location.startswith(f"s3://{bucket}/exp3/")
    before = {r.total_batches: dict(r.metrics) for r in first.metrics("validation")}
    after = {r.total_batches: dict(r.metrics) for r in second.metrics("validation")}
    assert after[16] == pytest.approx(before[16], rel=1e-6)


def test_a_corrupted_s3_checkpoint_is_refused_before_loading(
    s3_server: S3Server, tmp_path: Path
) -> None:
    bucket = s3_server.new_bucket()
    storage = s3_server.storage_config(bucket)
    first = FakeTrialService(targets=[8])
    with serve(first) as api:
        ok(run_slots(write_spec(tmp_path / "one", api, storage=storage)))
    [ckpt] = [r.checkpoint for r in first.of("ReportCheckpoint")]
    s3_server.client().put_object(
        Bucket=bucket, Key=f"runs/{ckpt.uuid}/models.pt", Body=b"tampered"
    )
    second = FakeTrialService(targets=[16])
    with serve(second) as api:
        spec = write_spec(
            tmp_path / "two", api, run_id=2, restore_from=ckpt.location, storage=storage
        )
        [finished] = run_slots(spec)
    assert finished.code == 2, finished.stderr
    assert "models.pt" in finished.stderr
    assert "corrupted" in finished.stderr
    assert not second.of("ReportMetrics")


# --- the client and the spec, in process ----------------------------------------------------


def test_client_raises_the_masters_refusal_without_retrying() -> None:
    service = FakeTrialService(
        targets=[8],
        refuse={"NextOperation": (grpc.StatusCode.PERMISSION_DENIED, "bad token\nfor trial 7")},
        preempt=True,
    )
    with serve(service) as api:
        client = TrialClient(api, "wrong", retry_s=30)
        try:
            with pytest.raises(TrialAPIError) as raised:
                client.next_operation(trial_pb2.NextOperationRequest(trial_id=7, run_id=1))
            answer = client.should_preempt(trial_pb2.ShouldPreemptRequest(trial_id=7, run_id=1))
        finally:
            client.close()
    assert raised.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert "bad token for trial 7" in str(raised.value)
    assert "\n" not in str(raised.value)
    assert answer.preempt
    assert [c.token for c in service.attempts] == ["wrong", "wrong"]


def test_client_reconnects_to_a_master_that_comes_back() -> None:
    port = free_port()
    service = FakeTrialService(targets=[8])
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    trial_pb2_grpc.add_TrialServiceServicer_to_server(service, server)

    def start_later() -> None:
        time.sleep(1.5)
        server.add_insecure_port(f"127.0.0.1:{port}")
        server.start()

    starter = threading.Thread(target=start_later)
    client = TrialClient(f"127.0.0.1:{port}", TOKEN, retry_s=30)
    try:
        starter.start()
        began = time.monotonic()
        op = client.next_operation(trial_pb2.NextOperationRequest(trial_id=7, run_id=1))
        took = time.monotonic() - began
    finally:
        starter.join()
        client.close()
        server.stop(grace=None)
    assert op.total_batches == 8
    assert 1.0 < took < 10  # found again within a few backoff steps, not gRPC's 2 minutes


def test_user_code_errors_exit_1_with_the_traceback(tmp_path: Path) -> None:
    service = FakeTrialService(targets=[8])
    with serve(service) as api:
        spec = write_spec(tmp_path, api)
        data = json.loads(spec.read_text())
        # The Trial appends to a file in this directory while training: it is not there.
        data["hparams"]["grad_log"] = str(tmp_path / "missing")
        spec.write_text(json.dumps(data))
        [finished] = run_slots(spec)
    assert finished.code == 1, finished.stderr
    assert "Traceback" in finished.stderr
    last = finished.stderr.strip().splitlines()[-1]
    assert last.startswith("error: _log_grads (model_def.py:"), last
    assert "raised FileNotFoundError" in last


def test_a_hyperparameter_the_trial_lacks_exits_78_not_to_be_restarted(tmp_path: Path) -> None:
    service = FakeTrialService(targets=[8])
    with serve(service) as api:
        spec = write_spec(tmp_path, api)
        data = json.loads(spec.read_text())
        del data["hparams"]["lr"]  # the Trial reads hp["lr"] itself: a KeyError in __init__
        spec.write_text(json.dumps(data))
        [finished] = run_slots(spec)
    assert finished.code == PERMANENT_ERROR_EXIT_CODE, finished.stderr
    assert "KeyError: 'lr'" in finished.stderr.strip().splitlines()[-1]


def test_client_gives_up_after_its_retry_budget() -> None:
    sleeps: list[float] = []
    now = [0.0]

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        now[0] += seconds

    service = FakeTrialService(targets=[8], fail_first=10**6)
    with serve(service) as api:
        client = TrialClient(api, TOKEN, retry_s=20, sleep=sleep, clock=lambda: now[0])
        try:
            with pytest.raises(MasterUnreachableError, match="unreachable"):
                client.complete_operation(trial_pb2.CompleteOperationRequest(trial_id=7))
        finally:
            client.close()
    assert sleeps[:6] == pytest.approx([0.2, 0.4, 0.8, 1.6, 3.2, 5.0])
    assert max(sleeps) == 5.0
    assert sum(sleeps) <= 20
    assert len(service.attempts) == len(sleeps) + 1


def test_retry_budget_comes_from_the_environment() -> None:
    assert retry_budget_from_env({}) == 900
    assert retry_budget_from_env({"ASSAY_MASTER_RETRY_S": "2.5"}) == 2.5
    with pytest.raises(AssayError, match="ASSAY_MASTER_RETRY_S"):
        retry_budget_from_env({"ASSAY_MASTER_RETRY_S": "soon"})


def test_spec_problems_are_named() -> None:
    with pytest.raises(AssayError) as raised:
        ClusterSpec.from_dict({"config": {}, "trial_seed": "7", "restore_from": None})
    message = str(raised.value)
    assert "token: missing" in message
    assert "trial_seed: expected an integer" in message
    assert "restore_from" not in message


# --- graceful preemption ----------------------------------------------------------------------


def _wait_for(check: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


@pytest.mark.parametrize("slots", [1, 2])
def test_sigterm_checkpoints_at_the_next_batch_and_exits_80(tmp_path: Path, slots: int) -> None:
    service = FakeTrialService(targets=[2000])
    with serve(service) as api:
        spec = write_spec(tmp_path, api, slots=slots, batches=2000, sleep_s=0.02)
        procs = start_slots(spec, slots=slots)
        _wait_for(lambda: len(service.metrics("training")) >= 2)
        for proc in procs:  # as the agent does: SIGTERM to each slot's process
            proc.terminate()
        finished = wait_slots(procs)
    assert [f.code for f in finished] == [PREEMPTED_EXIT_CODE] * slots, finished[0].stderr
    [checkpoint] = service.of("ReportCheckpoint")
    stopped = checkpoint.checkpoint.total_batches
    assert 8 <= stopped < 2000
    assert not service.of("CompleteOperation")  # the target was not reached
    assert max(r.total_batches for r in service.metrics("training")) <= stopped
    assert "to be resumed later" in finished[0].stdout
    assert read_metadata(Path(checkpoint.checkpoint.location)).total_batches == stopped


def test_the_masters_preempt_answer_stops_the_trial_at_a_checkpoint(tmp_path: Path) -> None:
    service = FakeTrialService(targets=[2000], preempt=True)
    with serve(service) as api:
        spec = write_spec(tmp_path, api, batches=2000, sleep_s=0.02)
        finished = run_slots(spec, extra_env={"ASSAY_PREEMPT_POLL_S": "0.3"})
    assert finished[0].code == PREEMPTED_EXIT_CODE, finished[0].stderr
    assert service.of("ShouldPreempt")
    [checkpoint] = service.of("ReportCheckpoint")
    assert 0 < checkpoint.checkpoint.total_batches < 2000
    assert not service.of("CompleteOperation")


def test_invalid_hp_exits_77(tmp_path: Path) -> None:
    service = FakeTrialService(targets=[16])
    with serve(service) as api:
        finished = run_slots(write_spec(tmp_path, api, invalid_hp_at=3))
    assert finished[0].code == 77
    assert "hyperparameters are unusable: lr 0.05 diverges" in finished[0].stderr
