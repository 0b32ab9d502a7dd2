"""The Core API off the cluster: the local twins, checkpoints, reports, scripts under
run-local (one and several processes), launchers and their bad paths."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import assay
import assay.core
from assay._checkpoint import CheckpointError
from assay._local import run_local
from assay._script import launcher_trial, missing_script, resolve_command
from assay.errors import AssayError, TrainingError
from assay.proto import trial_pb2
from tests.conftest import S3Server
from tests.test_cluster_session import (
    EXPERIMENT_ID,
    TOKEN,
    TRIAL_ID,
    FakeTrialService,
    serve,
    sha256,
)

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "tests" / "fixtures" / "scripts"
CORE_EXAMPLES = ROOT / "examples" / "core_api"


@pytest.fixture
def local_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A plain `python train.py` run: no spec, cwd in a fresh directory."""
    for name in ("ASSAY_TRIAL_SPEC", "ASSAY_LOCAL_SPEC", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    assay.core.get_cluster_info.cache_clear()
    yield tmp_path
    assay.core.get_cluster_info.cache_clear()


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# --- the local twin ---------------------------------------------------------------------


def test_plain_run_reports_to_a_local_file_and_has_no_cluster_info(local_dir: Path) -> None:
    assert assay.get_cluster_info() is None

    with assay.core.init() as core:
        core.train.report_training_metrics(10, {"loss": 0.5, "note": "text"})
        core.train.report_validation_metrics(10, {"accuracy": 0.75})
        core.train.report_metrics("test", 10, {"accuracy": 0.7})
        core.train.report_progress(0.5)
        preempt = core.preempt.should_preempt()

    records = _records(local_dir / "assay-metrics" / "metrics.jsonl")
    groups = [(r.get("group"), r.get("metrics")) for r in records if "group" in r]
    assert groups == [
        ("training", {"loss": 0.5}),  # the string is left out (with a warning)
        ("validation", {"accuracy": 0.75}),
        ("test", {"accuracy": 0.7}),
    ]
    assert preempt is False


@pytest.mark.parametrize(
    ("setup", "shown"),
    [
        ("", 1),  # no logging configured: core.init() prints its reports itself
        ("logging.basicConfig(level=logging.INFO, format='%(message)s')", 1),  # once
        ("logging.basicConfig(level=logging.WARNING)", 0),  # the script's level rules
    ],
)
def test_a_plain_run_prints_its_reports_once_unless_the_scripts_logging_says_not(
    local_dir: Path, setup: str, shown: int
) -> None:
    script = local_dir / "train.py"
    script.write_text(
        "import logging, assay.core\n"
        "with assay.core.init() as core:\n"
        f"    {setup or 'pass'}\n"
        "    core.train.report_training_metrics(3, {'loss': 0.25})\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASSAY_")}
    out = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    lines = (out.stdout + out.stderr).splitlines()
    assert lines.count("step 3 training: loss=0.25") == shown, lines


def test_core_init_leaves_the_processes_logging_as_it_was(
    local_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Printing reports for an unconfigured script changes no logger: a level, handler or
    filter left on `assay` hid later INFO records from a test's (or a user's) capture."""
    import logging

    logger = logging.getLogger("assay")
    before = (logger.level, list(logger.handlers), list(logger.filters))
    with assay.core.init() as core:
        core.train.report_training_metrics(1, {"loss": 1.0})
    assert (logger.level, list(logger.handlers), list(logger.filters)) == before
    with caplog.at_level(logging.INFO, logger="assay"), assay.core.init() as core:
        core.train.report_training_metrics(2, {"loss": 0.5})
    assert "step 2 training: loss=0.5" in caplog.text


def test_metric_values_from_numpy_and_torch(local_dir: Path) -> None:
    import numpy as np
    import torch

    with assay.core.init() as core:
        values = core.train.report_metrics(
            "training",
            1,
            {"a": np.float32(0.5), "b": torch.tensor(2.0), "c": torch.ones(3), "d": 3},
        )

    assert values == {"a": 0.5, "b": 2.0, "d": 3.0}  # a 3-element tensor is not a metric


def test_a_metric_name_the_master_would_refuse_is_refused_in_the_script(local_dir: Path) -> None:
    """The same rule as the store's, so run-local refuses what a cluster would (there,
    the master's refusal failed the run, and every restart again)."""
    from assay.config._limits import MAX_METRIC_NAME_CHARS
    from assay.master.store._metrics import MAX_NAME_LEN

    assert MAX_METRIC_NAME_CHARS == MAX_NAME_LEN
    with assay.core.init() as core:
        core.train.report_training_metrics(1, {"x" * MAX_NAME_LEN: 1.0})
        with pytest.raises(
            AssayError, match=r"'xxxx.*\(5,000 characters\): a metric name is 1 to 255"
        ):
            core.train.report_training_metrics(2, {"x" * 5000: 1.0})
        with pytest.raises(AssayError, match="metric name '': a metric name is 1 to 255"):
            core.train.report_validation_metrics(2, {"": 1.0})


def test_a_report_after_the_context_closed_says_so(local_dir: Path) -> None:
    with assay.core.init() as core:
        core.train.report_training_metrics(1, {"loss": 1.0})
    with pytest.raises(AssayError, match="the Core API context is closed"):
        core.train.report_training_metrics(2, {"loss": 0.5})
    with pytest.raises(AssayError, match="inside `with assay.core.init"):
        core.train.report_validation_metrics(2, {"loss": 0.5})


@pytest.mark.parametrize("steps", [-1, 1.5, "ten", None])
def test_bad_steps_completed_is_refused(local_dir: Path, steps: Any) -> None:
    with assay.core.init() as core, pytest.raises(AssayError, match="steps_completed"):
        core.train.report_training_metrics(steps, {"loss": 1.0})


def test_checkpoints_store_restore_metadata_download_upload_delete(local_dir: Path) -> None:
    with assay.core.init() as core:
        with core.checkpoint.store_path({"steps_completed": 7, "note": "hi"}) as (path, uuid):
            (path / "weights.bin").write_bytes(b"\x00" * 100)
            (path / "sub").mkdir()
            (path / "sub" / "opt.txt").write_text("state")
        stored = local_dir / "checkpoints" / uuid
        assert sorted(p.name for p in stored.iterdir()) == ["metadata.json", "sub", "weights.bin"]
        manifest = json.loads((stored / "metadata.json").read_text())
        assert set(manifest["files"]) == {"weights.bin", "sub/opt.txt"}
        assert manifest["total_batches"] == 7

        with core.checkpoint.restore_path(uuid) as restored:
            assert (restored / "sub" / "opt.txt").read_text() == "state"
        assert core.checkpoint.get_metadata(uuid) == {"steps_completed": 7, "note": "hi"}
        core.checkpoint.download(uuid, local_dir / "copy")
        assert (local_dir / "copy" / "weights.bin").stat().st_size == 100
        again = core.checkpoint.upload(local_dir / "copy", {"steps_completed": 8})
        assert again != uuid
        assert core.checkpoint.get_metadata(again)["steps_completed"] == 8

        core.checkpoint.delete(uuid)
        assert not stored.exists()
        with pytest.raises(CheckpointError, match="is not in"):
            core.checkpoint.delete(uuid)

    records = _records(local_dir / "assay-metrics" / "metrics.jsonl")
    assert [r["checkpoint"] for r in records if "checkpoint" in r] == [uuid, again]


def test_restore_of_an_unknown_or_malformed_uuid_says_so(local_dir: Path) -> None:
    with assay.core.init() as core:
        unknown = "123e4567-e89b-42d3-a456-426614174000"
        with pytest.raises(CheckpointError, match=f"checkpoint {unknown} is not in"):  # noqa: SIM117
            with core.checkpoint.restore_path(unknown):
                pass
        for bad in ("../../etc", "checkpoints", ""):
            with pytest.raises(CheckpointError, match="not a checkpoint uuid"):  # noqa: SIM117
                with core.checkpoint.restore_path(bad):
                    pass


def test_a_corrupted_checkpoint_is_refused_on_restore(local_dir: Path) -> None:
    with assay.core.init() as core:
        with core.checkpoint.store_path() as (path, uuid):
            (path / "w").write_text("weights")
        (local_dir / "checkpoints" / uuid / "w").write_text("tampered")
        with pytest.raises(CheckpointError, match="corrupted"):  # noqa: SIM117
            with core.checkpoint.restore_path(uuid):
                pass


def test_failed_store_leaves_nothing_and_own_manifest_is_refused(local_dir: Path) -> None:
    with assay.core.init() as core:
        with pytest.raises(ValueError, match="boom"):  # noqa: SIM117, PT012
            with core.checkpoint.store_path() as (path, _):
                (path / "half").write_text("x")
                raise ValueError("boom")
        with pytest.raises(CheckpointError, match="may not hold its own metadata.json"):  # noqa: SIM117
            with core.checkpoint.store_path() as (path, _):
                (path / "metadata.json").write_text("{}")
    # nothing but the mark of a local run's output directory
    assert [p.name for p in (local_dir / "checkpoints").iterdir()] == [".assay-local-output"]


def test_checkpoint_storage_argument_off_cluster(local_dir: Path) -> None:
    core = assay.core.init(checkpoint_storage=str(local_dir / "elsewhere"))
    with core, core.checkpoint.store_path() as (path, uuid):
        (path / "w").write_text("x")
    assert (local_dir / "elsewhere" / uuid / "w").exists()


def test_a_worker_that_reports_or_stores_alone_gets_a_clear_error(local_dir: Path) -> None:
    worker = assay.core.DistributedContext(rank=1, size=2, local_rank=1, local_size=2)
    core = assay.core.init(distributed=worker)
    try:
        with pytest.raises(RuntimeError, match="rank 1: only the chief"):
            core.train.report_training_metrics(1, {"loss": 1.0})
        with pytest.raises(RuntimeError, match="only the chief"):
            core.train.report_validation_metrics(1, {"loss": 1.0})
        with pytest.raises(RuntimeError, match="shard=False.*rank 1"):  # noqa: SIM117
            with core.checkpoint.store_path():
                pass
    finally:
        core.close()


def test_determined_accessors(local_dir: Path) -> None:
    d = assay.core.DistributedContext(
        rank=3, size=4, local_rank=1, local_size=2, cross_rank=1, cross_size=2
    )
    assert (d.get_rank(), d.get_size(), d.get_local_rank(), d.get_local_size()) == (3, 4, 1, 2)
    assert (d.get_cross_rank(), d.get_cross_size()) == (1, 2)
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    assert assay.core.DistributedContext.from_env(env).rank == 1
    with pytest.raises(AssayError, match="outside"):
        assay.core.DistributedContext.from_env({"RANK": "2", "WORLD_SIZE": "2"})


def _local_spec(tmp: Path, monkeypatch: pytest.MonkeyPatch, **searcher: Any) -> None:
    """As `assay trial run-local` starts a script: ASSAY_LOCAL_SPEC names the run's spec."""
    from assay.common.spec import LocalSpec

    config = {
        "entrypoint": "python3 train.py",
        "searcher": {"name": "single", "metric": "x", **searcher},
    }
    spec = LocalSpec(
        config=config,
        hparams={},
        trial_seed=0,
        checkpoint_dir=str(tmp / "ckpts"),
        metrics_path=str(tmp / "metrics.jsonl"),
    )
    spec.write(tmp / "spec.json")
    monkeypatch.setenv("ASSAY_LOCAL_SPEC", str(tmp / "spec.json"))
    assay.core.get_cluster_info.cache_clear()


def _operations(core: assay.core.Context) -> list[int]:
    lengths = []
    for op in core.searcher.operations():
        lengths.append(op.length)
        op.report_completed(0.5)
    return lengths


def test_searcher_operations_off_the_cluster(
    local_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with assay.core.init() as core:
        assert _operations(core) == [1]  # no config: one operation of length 1

    _local_spec(local_dir, monkeypatch, max_length={"batches": 30})
    with assay.core.init() as core:
        assert _operations(core) == [30]
        assert core.searcher.get_configured_units() == "batches"

    _local_spec(local_dir, monkeypatch)  # run-local without a length: as on a cluster
    with (
        assay.core.init() as core,
        pytest.raises(AssayError, match="operations\\(\\) needs a length"),
    ):
        _operations(core)


def test_a_validation_at_the_target_stops_the_trial(
    local_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _local_spec(local_dir, monkeypatch, max_length={"batches": 30})
    with assay.core.init() as core:
        core.train.report_validation_metrics(20, {"x": 1.0})
        assert not core.preempt.should_preempt()
        core.train.report_validation_metrics(30, {"y": 1.0})  # not the searcher's metric
        assert not core.preempt.should_preempt()
        core.train.report_validation_metrics(31, {"x": 2.0})  # past the target: complete
        assert core.preempt.should_preempt()
        assert core.train.get_experiment_best_validation() == 1.0  # smaller is better


def test_a_first_validation_without_the_searchers_metric_is_a_permanent_error(
    local_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A misnamed `searcher.metric` fails at the first validation, naming what was
    reported (the searcher would otherwise wait for it to the end: an ASHA search trained
    every trial to max_length); `operations()` scripts report the metric themselves."""
    from assay.errors import PermanentError, SearcherMetricError

    _local_spec(local_dir, monkeypatch, max_length={"batches": 30})
    with assay.core.init() as core:
        with pytest.raises(SearcherMetricError, match=r"'x' is not among .*\(loss, y\)") as e:
            core.train.report_validation_metrics(10, {"y": 1.0, "loss": 2.0})
        assert isinstance(e.value, PermanentError)  # exit 78: ERROR without restarts
    with assay.core.init() as core:
        assert _operations(core) == [30]
        core.train.report_validation_metrics(10, {"y": 1.0})  # operations() decide
    monkeypatch.delenv("ASSAY_LOCAL_SPEC")
    assay.core.get_cluster_info.cache_clear()
    with assay.core.init() as core:  # plain python: no searcher, nothing to check
        core.train.report_validation_metrics(10, {"y": 1.0})


def test_run_local_of_a_script_without_the_searchers_metric_exits_78(tmp_path: Path) -> None:
    config = _config("python3 loop.py")
    config["searcher"]["metric"] = "val_loss"

    with pytest.raises(TrainingError, match="exited with code 78") as e:
        run_local(config=config, model_dir=SCRIPTS, checkpoint_dir=tmp_path)
    assert "searcher.metric 'val_loss' is not among the validation metrics" in str(e.value)


def test_without_max_length_no_validation_stops_a_script(
    local_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _local_spec(local_dir, monkeypatch)
    with assay.core.init() as core:
        assert assay.get_cluster_info().trial.max_length == 0  # type: ignore[union-attr]
        core.train.report_validation_metrics(10_000, {"x": 1.0})
        assert not core.preempt.should_preempt()


# --- on a cluster: the chief's calls to the master --------------------------------------


class _Master(FakeTrialService):
    """Answers NextOperation as the master does: the first target not yet completed,
    whatever count the trial gives."""

    def NextOperation(  # noqa: N802
        self, request: trial_pb2.NextOperationRequest, context: Any
    ) -> trial_pb2.Operation:
        self._enter("NextOperation", request, context)
        done = {r.total_batches for r in self.of("CompleteOperation")}
        for target in self.targets:
            if target not in done:
                return trial_pb2.Operation(total_batches=target)
        return trial_pb2.Operation(stop=True)


def _cluster_spec(
    tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
    api: str,
    *,
    run_id: int = 1,
    storage: dict[str, Any] | None = None,
    restore_from: str | None = None,
    restore_sha256: dict[str, str] | None = None,
) -> None:
    """As the agent starts a script's slot: ASSAY_TRIAL_SPEC names the trial's spec."""
    config: dict[str, Any] = {
        "entrypoint": "python3 train.py",
        "hyperparameters": {"lr": 0.1},
        "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 16}},
    }
    if storage is not None:
        config["checkpoint_storage"] = storage
    spec = {
        "config": config,
        "hparams": {"lr": 0.1},
        "trial_seed": 11,
        "trial_id": TRIAL_ID,
        "run_id": run_id,
        "experiment_id": EXPERIMENT_ID,
        "allocation_id": f"alloc-{run_id}",
        "checkpoint_root": str(tmp / "root"),
        "restore_from": restore_from,
        "trial_api": api,
        "token": TOKEN,
        "restore_sha256": restore_sha256,
    }
    path = tmp / f"spec-{run_id}.json"
    path.write_text(json.dumps(spec))
    monkeypatch.setenv("ASSAY_TRIAL_SPEC", str(path))
    monkeypatch.setenv("ASSAY_MASTER_RETRY_S", "5")
    assay.core.get_cluster_info.cache_clear()


def test_on_a_cluster_the_chief_follows_targets_and_reports_to_the_master(
    local_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = _Master(targets=[8, 16])
    with serve(service) as api:
        _cluster_spec(local_dir, monkeypatch, api)
        info = assay.get_cluster_info()
        assert info is not None
        assert (info.trial.trial_id, info.trial.experiment_id) == (TRIAL_ID, EXPERIMENT_ID)
        assert (info.trial.hparams, info.trial.max_length, info.latest_checkpoint) == (
            {"lr": 0.1},
            16,
            None,
        )
        with assay.core.init() as core:
            assert core.searcher.get_target() == 8
            core.train.report_training_metrics(4, {"loss": 2.0})
            core.train.report_validation_metrics(8, {"loss": 1.0})
            assert core.searcher.get_target() == 16
            assert not core.preempt.should_preempt()
            core.train.report_progress(0.5)
            assert core.train.get_experiment_best_validation() is None
            with core.checkpoint.store_path({"steps_completed": 8}) as (path, uuid):
                (path / "w.bin").write_bytes(b"\x01" * 10)
            core.checkpoint.delete(uuid)
            core.train.report_validation_metrics(16, {"loss": 0.5})  # the last target
            assert core.preempt.should_preempt()

    assert {(c.token, c.request.trial_id, c.request.run_id) for c in service.calls} == {
        (TOKEN, TRIAL_ID, 1)
    }
    completed = [(r.total_batches, r.searcher_metric) for r in service.of("CompleteOperation")]
    assert completed == [(8, 1.0), (16, 0.5)]
    assert [r.progress for r in service.of("ReportProgress")] == [0.5]
    [report] = service.of("ReportCheckpoint")
    location = Path(report.checkpoint.location)
    assert location == local_dir / "root" / uuid
    assert report.checkpoint.total_batches == 8
    # The manifest too: a restore verifies it against this record.
    assert [(f.name, f.sha256) for f in report.checkpoint.files] == [
        ("metadata.json", sha256(location / "metadata.json")),
        ("w.bin", sha256(location / "w.bin")),
    ]
    assert [list(r.uuids) for r in service.of("DeleteTrialCheckpoints")] == [[uuid]]


def test_on_a_cluster_searcher_operations_follow_the_masters_targets(
    local_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scripts written before Determined 0.38: train to op.length, report_completed."""
    service = _Master(targets=[8, 16])
    with serve(service) as api:
        _cluster_spec(local_dir, monkeypatch, api)
        with assay.core.init() as core:
            lengths = []
            for op in core.searcher.operations():
                lengths.append(op.length)
                op.report_progress(op.length / 2)
                core.train.report_validation_metrics(op.length, {"loss": 1.0 / op.length})
                op.report_completed(1.0 / op.length)
            assert core.preempt.should_preempt()  # the searcher has nothing more for it
    assert lengths == [8, 16]
    completed = [(r.total_batches, r.searcher_metric) for r in service.of("CompleteOperation")]
    assert completed == [(8, 1 / 8), (16, 1 / 16)]  # once each: not again for the report
    assert [r.progress for r in service.of("ReportProgress")] == [0.5, 0.5]

    forgetful = _Master(targets=[8])
    with serve(forgetful) as api:
        _cluster_spec(local_dir, monkeypatch, api, run_id=2)
        core = assay.core.init()
        with core, pytest.raises(RuntimeError, match="to 8 ended without op.report_completed"):
            for _ in core.searcher.operations():
                pass
    assert not forgetful.of("CompleteOperation")


def test_on_a_cluster_sigterm_and_the_masters_answer_turn_should_preempt_true(
    local_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = _Master(targets=[100])
    monkeypatch.setenv("ASSAY_PREEMPT_POLL_S", "0.1")
    with serve(service) as api:
        _cluster_spec(local_dir, monkeypatch, api)
        before = signal.getsignal(signal.SIGTERM)
        with assay.core.init() as core:
            assert not core.preempt.should_preempt()
            os.kill(os.getpid(), signal.SIGTERM)  # what the agent sends first
            assert core.preempt.should_preempt()
        assert signal.getsignal(signal.SIGTERM) is before  # handed back on close

        _cluster_spec(local_dir, monkeypatch, api, run_id=2)
        with assay.core.init() as core:
            time.sleep(0.3)
            assert not core.preempt.should_preempt()
            service.preempt = True  # a pause, a cancel, a preemption for a higher priority
            deadline = time.monotonic() + 10
            while not core.preempt.should_preempt():
                assert time.monotonic() < deadline, "should_preempt() stayed False"
                time.sleep(0.05)
    assert service.of("ShouldPreempt")


def test_on_a_cluster_with_s3_a_checkpoint_is_uploaded_and_resumed_from(
    local_dir: Path, monkeypatch: pytest.MonkeyPatch, s3_server: S3Server
) -> None:
    bucket = s3_server.new_bucket()
    storage = s3_server.storage_config(bucket)
    service = _Master(targets=[16])
    with serve(service) as api:
        _cluster_spec(local_dir, monkeypatch, api, storage=storage)
        core = assay.core.init()
        with core, core.checkpoint.store_path({"steps_completed": 8, "note": "s3"}) as stored:
            path, uuid = stored
            (path / "state.json").write_text(json.dumps({"step": 8}))
        [report] = service.of("ReportCheckpoint")
        assert report.checkpoint.location == f"s3://{bucket}/runs/{uuid}"
        assert s3_server.keys(bucket) == [f"runs/{uuid}/metadata.json", f"runs/{uuid}/state.json"]
        assert not (local_dir / "root").exists()  # nothing left on the local disk

        # The next run (after a pause, a restart, a promotion) resumes from it.
        _cluster_spec(
            local_dir,
            monkeypatch,
            api,
            run_id=2,
            storage=storage,
            restore_from=report.checkpoint.location,
        )
        info = assay.get_cluster_info()
        assert info is not None
        assert info.latest_checkpoint == uuid
        with assay.core.init() as core:
            with core.checkpoint.restore_path(info.latest_checkpoint) as path:
                assert json.loads((path / "state.json").read_text()) == {"step": 8}
            assert core.checkpoint.get_metadata(uuid) == {"steps_completed": 8, "note": "s3"}
            unknown = "123e4567-e89b-42d3-a456-426614174000"
            with pytest.raises(CheckpointError, match=f"checkpoint {unknown} cannot be"):  # noqa: SIM117
                with core.checkpoint.restore_path(unknown):
                    pass


def test_on_a_cluster_the_latest_checkpoint_is_verified_against_the_masters_record(
    local_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What another experiment's trial plants in, or changes of, the checkpoint a script
    restores is refused: the master's record counts, not the manifest beside the files."""
    service = _Master(targets=[16])
    with serve(service) as api:
        _cluster_spec(local_dir, monkeypatch, api)
        with (
            assay.core.init() as core,
            core.checkpoint.store_path({"steps_completed": 8}) as (
                path,
                uuid,
            ),
        ):
            (path / "state.json").write_text(json.dumps({"step": 8}))
        [report] = service.of("ReportCheckpoint")
        recorded = {f.name: f.sha256 for f in report.checkpoint.files}
        location = Path(report.checkpoint.location)
        (location / "planted.py").write_text("print('hello')")

        def restore(record: dict[str, str] | None) -> None:
            _cluster_spec(
                local_dir,
                monkeypatch,
                api,
                run_id=2,
                restore_from=str(location),
                restore_sha256=record,
            )
            info = assay.get_cluster_info()
            assert info is not None
            assert info.latest_checkpoint == uuid
            with assay.core.init() as core, core.checkpoint.restore_path(uuid) as path:
                assert json.loads((path / "state.json").read_text()) == {"step": 8}

        restore(None)  # an older record: the manifest alone, which lists no planted.py
        with pytest.raises(CheckpointError, match=r"planted.py is not in the record"):
            restore(recorded)
        (location / "planted.py").unlink()
        restore(recorded)


# --- commands and launchers -------------------------------------------------------------


def test_commands_use_this_python_and_determineds_launcher_name() -> None:
    argv = ["python3", "-m", "determined.launch.torch_distributed", "python3", "train.py"]

    resolved = resolve_command(argv, python="/venv/bin/python")

    assert resolved == [
        "/venv/bin/python",
        "-m",
        "assay.launch.torch_distributed",
        "python3",
        "train.py",
    ]
    assert resolve_command(["./run.sh"]) == ["./run.sh"]
    with pytest.raises(AssayError, match="deepspeed.*torch_distributed"):
        resolve_command(["python3", "-m", "determined.launch.deepspeed", "python3", "t.py"])


def test_a_missing_script_is_named_before_anything_runs(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")

    assert missing_script(["python3", "train.py"], tmp_path) is None
    assert missing_script(["python3", "-u", "train.py", "--x", "1"], tmp_path) is None
    problem = missing_script(["python3", "trian.py"], tmp_path)
    assert problem is not None
    assert "trian.py" in problem
    assert "train" in problem
    launched = ["python3", "-m", "determined.launch.torch_distributed", "python3", "nope.py"]
    assert "nope.py" in (missing_script(launched, tmp_path) or "")
    with_option = ["python3", "-m", "assay.launch.torch_distributed", "--nproc_per_node", "2"]
    assert missing_script([*with_option, "python3", "train.py"], tmp_path) is None
    assert missing_script(["python3", "-m", "pkg.train"], tmp_path) is None
    # A shell script must be there too, and a module whose name is a typo of one there.
    assert "run.sh, which is not in the model directory" in str(
        missing_script(["./run.sh"], tmp_path)
    )
    assert "run.sh" in str(missing_script(["bash", "run.sh", "--fast"], tmp_path))
    (tmp_path / "run.sh").write_text("python3 train.py\n")
    assert missing_script(["./run.sh"], tmp_path) is None
    assert missing_script(["bash", "run.sh"], tmp_path) is None
    assert missing_script(["bash", "-c", "python3 train.py"], tmp_path) is None
    assert "did you mean 'train'" in str(missing_script(["python3", "-m", "trian"], tmp_path))
    assert missing_script(["python3", "-m", "train"], tmp_path) is None
    assert missing_script(["python3", "-m", "json.tool"], tmp_path) is None  # installed
    with pytest.raises(AssayError, match="trian.py"):
        run_local(config=_config("python3 trian.py"), model_dir=tmp_path, checkpoint_dir=tmp_path)


def test_launcher_trial_form() -> None:
    argv = ["python3", "-m", "determined.launch.torch_distributed", "--trial", "model_def:T"]
    assert launcher_trial(argv) == "model_def:T"
    assert launcher_trial(["python3", "train.py", "--trial", "x"]) is None


def test_launcher_by_hand_starts_processes_and_passes_the_exit_code(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text(
        "import os, pathlib, sys, time\n"
        "print('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], flush=True)\n"
        f"said = pathlib.Path({str(tmp_path / 'said')!r})\n"
        "if os.environ['RANK'] == '0':\n"
        "    said.touch()\n"
        "    sys.exit(0)\n"
        "while not said.exists():\n"
        "    time.sleep(0.01)\n"
        "sys.exit(3)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    launcher = [sys.executable, "-m", "assay.launch.torch_distributed", "--nproc_per_node", "2"]
    done = subprocess.run(
        [*launcher, "python3", str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 3, done.stderr
    assert "[rank 0] rank 0 of 2" in done.stderr
    missing = subprocess.run(
        [sys.executable, "-m", "assay.launch.torch_distributed"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert missing.returncode == 2
    assert "give the command" in missing.stderr


# --- scripts under run-local ------------------------------------------------------------


def _config(entrypoint: str, **extra: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "entrypoint": entrypoint,
        "hyperparameters": {"steps": 20, "every": 5},
        "searcher": {"name": "single", "metric": "value", "max_length": {"batches": 20}},
    }
    config.update(extra)
    return config


def test_run_local_script_reports_checkpoints_and_resumes(tmp_path: Path) -> None:
    ckpts = tmp_path / "ckpts"

    result = run_local(config=_config("python3 loop.py"), model_dir=SCRIPTS, checkpoint_dir=ckpts)

    assert result.total_batches == 20
    assert result.validation_metrics == {"value": 20.0, "batches": 20.0}
    assert [h["total_batches"] for h in result.training_history] == [5, 10, 15, 20]
    assert result.checkpoint is not None
    assert Path(result.checkpoint).parent == ckpts

    longer = _config("python3 loop.py", hyperparameters={"steps": 30, "every": 5})
    longer["searcher"]["max_length"] = {"batches": 30}
    resumed = run_local(
        config=longer,
        model_dir=SCRIPTS,
        checkpoint_dir=tmp_path / "b",
        resume_from=result.checkpoint,
    )
    assert [h["total_batches"] for h in resumed.training_history] == [25, 30]


def test_a_script_config_without_max_length_trains_as_the_script_decides(
    tmp_path: Path,
) -> None:
    """Determined 0.38's Core API configs give a `single` searcher no max_length."""
    config = _config("python3 loop.py", hyperparameters={"steps": 15, "every": 5})
    del config["searcher"]["max_length"]

    result = run_local(config=config, model_dir=SCRIPTS, checkpoint_dir=tmp_path)

    assert result.total_batches == 15
    assert [h["total_batches"] for h in result.validation_history] == [5, 10, 15]


def test_run_local_script_failure_names_the_exit_code(tmp_path: Path) -> None:
    config = _config("python3 loop.py", hyperparameters={"steps": 5, "exit_code": 4})

    with pytest.raises(TrainingError, match="exited with code 4"):
        run_local(config=config, model_dir=SCRIPTS, checkpoint_dir=tmp_path)


def test_a_script_raising_invalid_hp_exits_as_a_trial_does(tmp_path: Path) -> None:
    """77, which the master reads as "replace this trial" (it counted as a failure, was
    restarted up to max_restarts and ended in ERROR)."""
    config = _config("python3 loop.py", hyperparameters={"steps": 5, "invalid_hp": True})

    with pytest.raises(TrainingError, match=r"exited with code 77 \(assay.InvalidHP: on a cluster"):
        run_local(config=config, model_dir=SCRIPTS, checkpoint_dir=tmp_path)


def test_run_local_script_that_cannot_start(tmp_path: Path) -> None:
    with pytest.raises(AssayError, match="no-such-program, which is not in the model directory"):
        run_local(config=_config("./no-such-program"), model_dir=SCRIPTS, checkpoint_dir=tmp_path)
    with pytest.raises(AssayError, match="cannot run the entrypoint"):
        run_local(config=_config("no-such-program"), model_dir=SCRIPTS, checkpoint_dir=tmp_path)


@pytest.mark.slow
def test_two_processes_share_collectives_and_a_sharded_checkpoint(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    config = _config("python3 collectives.py", resources={"slots_per_trial": 2})
    config["searcher"] = {"name": "single", "metric": "ok", "max_length": {"batches": 1}}

    result = run_local(config=config, model_dir=SCRIPTS, checkpoint_dir=tmp_path)

    seen_line = next(x for x in capfd.readouterr().err.splitlines() if "SEEN " in x)
    seen = json.loads(seen_line.split("SEEN ", 1)[1])
    assert seen["allgather"] == [0, 1]
    assert seen["gather"] == [0, 10]
    assert seen["broadcast"] == "from 0"
    assert seen["allgather_local"] == [0, 1]
    assert seen["broadcast_local"] == 0
    assert seen["preempt"] is False
    assert result.checkpoint == str(tmp_path / seen["uuid"])
    stored = sorted(p.name for p in Path(result.checkpoint).iterdir())
    assert stored == ["metadata.json", "rank0.json", "rank1.json"]
    manifest = json.loads((Path(result.checkpoint) / "metadata.json").read_text())
    assert set(manifest["files"]) == {"rank0.json", "rank1.json"}


@pytest.mark.slow
def test_sharded_checkpoint_with_clashing_names_is_refused_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLASH", "1")
    config = _config("python3 collectives.py", resources={"slots_per_trial": 2})

    with pytest.raises(TrainingError, match="both wrote 'same.txt'"):
        run_local(config=config, model_dir=SCRIPTS, checkpoint_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_rank_failing_inside_a_sharded_store_fails_every_rank_without_a_hang(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FAIL_RANK", "1")
    config = _config("python3 collectives.py", resources={"slots_per_trial": 2})

    started = time.monotonic()
    with pytest.raises(TrainingError, match="exited with code 1"):
        run_local(config=config, model_dir=SCRIPTS, checkpoint_dir=tmp_path)

    assert time.monotonic() - started < 60  # no rank waited in a collective for ever
    assert "rank 1 failed while writing" in capfd.readouterr().err
    assert list(tmp_path.iterdir()) == []


def _weights(checkpoint: str) -> dict[str, Any]:
    import torch

    state: dict[str, Any] = torch.load(Path(checkpoint) / "state.pt", weights_only=True)
    return state["model"]  # type: ignore[no-any-return]


@pytest.mark.slow
def test_a_scripts_two_slot_run_equals_its_one_slot_run(tmp_path: Path) -> None:
    """Ground truth: 2 slots x 32 samples train the same weights as 1 slot x 64 (gloo)."""
    import torch

    config: dict[str, Any] = {
        "entrypoint": "python3 torch_loop.py",
        "hyperparameters": {"global_batch_size": 64, "lr": 0.1, "hidden": 16},
        "searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": 60}},
    }
    one = run_local(config=config, model_dir=CORE_EXAMPLES, checkpoint_dir=tmp_path / "one")
    two = run_local(
        config=config, model_dir=CORE_EXAMPLES, checkpoint_dir=tmp_path / "two", slots=2
    )

    assert one.checkpoint is not None
    assert two.checkpoint is not None
    a, b = _weights(one.checkpoint), _weights(two.checkpoint)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.allclose(a[name], b[name], rtol=0, atol=1e-6), name
    assert one.validation_metrics["validation_loss"] == pytest.approx(
        two.validation_metrics["validation_loss"], abs=1e-6
    )


@pytest.mark.slow
def test_a_lightning_fabric_loop_reports_through_core_on_two_slots(tmp_path: Path) -> None:
    config: dict[str, Any] = {
        "entrypoint": "python3 fabric_loop.py",
        "hyperparameters": {},
        "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 20}},
        "resources": {"slots_per_trial": 2},
    }

    result = run_local(config=config, model_dir=SCRIPTS, checkpoint_dir=tmp_path)

    assert [h["total_batches"] for h in result.training_history] == [5, 10, 15, 20]
    assert result.validation_metrics["loss"] < result.training_history[0]["metrics"]["loss"]
    assert result.checkpoint is not None
    assert (Path(result.checkpoint) / "model.pt").exists()


# --- TensorBoard files ------------------------------------------------------------------


def test_plain_run_keeps_tensorboard_files_beside_its_checkpoints(local_dir: Path) -> None:
    with assay.core.init() as core:
        path = core.train.get_tensorboard_path()
        (path / "events.out.tfevents.1").write_bytes(b"e")

    assert path == local_dir / "checkpoints" / "tensorboard" / "trial-0"
    assert (path / "events.out.tfevents.1").read_bytes() == b"e"  # kept after close


def test_on_a_cluster_with_s3_tensorboard_files_go_up_with_checkpoints_and_at_the_end(
    local_dir: Path, monkeypatch: pytest.MonkeyPatch, s3_server: S3Server
) -> None:
    bucket = s3_server.new_bucket()
    service = _Master(targets=[16])
    events = f"runs/tensorboard/trial-{TRIAL_ID}/events.out.tfevents.1"
    with serve(service) as api:
        _cluster_spec(local_dir, monkeypatch, api, storage=s3_server.storage_config(bucket))
        with assay.core.init() as core:
            path = core.train.get_tensorboard_path()
            (path / "events.out.tfevents.1").write_bytes(b"first")
            assert events not in s3_server.keys(bucket)  # nothing before a checkpoint
            with core.checkpoint.store_path({"steps_completed": 8}) as (ckpt, uuid):
                (ckpt / "state.json").write_text("{}")
            assert events in s3_server.keys(bucket)  # with the checkpoint
            (path / "events.out.tfevents.1").write_bytes(b"first and more")

    assert sorted(s3_server.keys(bucket)) == sorted(
        [events, f"runs/{uuid}/metadata.json", f"runs/{uuid}/state.json"]
    )
    from assay.common.storage import S3Storage, storage_for
    from assay.config import parse_config

    config = {**_config("python3 x.py"), "checkpoint_storage": s3_server.storage_config(bucket)}
    storage = storage_for(parse_config(config).checkpoint_storage)
    assert isinstance(storage, S3Storage)
    back = local_dir / "back"
    assert storage.download_tree("tensorboard", f"trial-{TRIAL_ID}", back) == 1
    assert (back / "events.out.tfevents.1").read_bytes() == b"first and more"  # at the end
    assert not path.exists()  # the local copy is gone


@pytest.mark.parametrize("slots", [1, 2])
def test_run_local_script_keeps_every_ranks_tensorboard_files(tmp_path: Path, slots: int) -> None:
    ckpts = tmp_path / "ckpts"

    run_local(
        config=_config("python3 tensorboard_loop.py", resources={"slots_per_trial": slots}),
        model_dir=SCRIPTS,
        checkpoint_dir=ckpts,
    )

    files = sorted(p.relative_to(ckpts).as_posix() for p in ckpts.glob("tensorboard/**/events*"))
    (trial,) = {f.split("/")[1] for f in files}
    expected = [f"tensorboard/{trial}/events.out.tfevents.test"]
    if slots == 2:
        expected.insert(0, f"tensorboard/{trial}/rank-1/events.out.tfevents.test")
    assert files == sorted(expected)
    assert (ckpts / expected[-1]).read_text() == "rank 0\n"


SPLIT_REPORTS = """
import sys
import assay

with assay.core.init() as core:
    core.train.report_training_metrics(5, {"loss": 0.5})
    core.train.report_validation_metrics(5, {"value": 1.0})
    core.train.report_validation_metrics(5, {"test_acc": 0.5})  # another report, same step
    core.train.report_metrics("custom", 5, {"thing": 3.0})
    core.train.report_validation_metrics(5, {"value": 1.0})  # the same again: a no-op
    if sys.argv[1:] == ["again"]:
        core.train.report_training_metrics(5, {"loss": 100.5})  # the master refuses this
"""


def test_run_local_merges_one_steps_reports_and_refuses_what_the_master_refuses(
    tmp_path: Path,
) -> None:
    (tmp_path / "split.py").write_text(SPLIT_REPORTS)
    config = _config("python3 split.py")
    config["searcher"]["max_length"] = {"batches": 5}

    result = run_local(config=config, model_dir=tmp_path, checkpoint_dir=tmp_path / "c")

    # As on a cluster: the searcher's metric and the other report's, together.
    assert result.validation_metrics == {"value": 1.0, "test_acc": 0.5}
    assert [h["metrics"] for h in result.validation_history] == [{"value": 1.0, "test_acc": 0.5}]
    assert [h["metrics"] for h in result.training_history] == [{"loss": 0.5}]  # not "custom"
    config["entrypoint"] = "python3 split.py again"
    with pytest.raises(TrainingError, match=r"already reported training metric 'loss' at step 5"):
        run_local(config=config, model_dir=tmp_path, checkpoint_dir=tmp_path / "d")


def test_run_local_warns_of_a_script_length_in_epochs_the_master_would_refuse(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The master converts a script's epochs with records_per_epoch and the global batch
    size, and refuses a config without them; run-local says so (a Core API script reads
    the raw number as batches) and converts when it can."""
    config = _config("python3 loop.py")
    config["searcher"]["max_length"] = {"epochs": 2}
    with caplog.at_level("WARNING", logger="assay"):
        run_local(config=config, model_dir=SCRIPTS, checkpoint_dir=tmp_path / "a")
    assert "needs records_per_epoch" in caplog.text
    assert "a cluster refuses this config" in caplog.text
    caplog.clear()
    config["records_per_epoch"] = 20
    config["hyperparameters"]["global_batch_size"] = 4
    with caplog.at_level("WARNING", logger="assay"):
        result = run_local(config=config, model_dir=SCRIPTS, checkpoint_dir=tmp_path / "b")
    assert result.total_batches == 10
    assert "refuses" not in caplog.text


def test_run_local_says_which_rank_left_early_when_another_then_fails(tmp_path: Path) -> None:
    """Rank 1 returns early with exit 0; rank 0, left alone, fails: the message says that
    rank 1 had left, not only that rank 0 exited 1."""
    (tmp_path / "early.py").write_text(
        "import os, sys, time\n"
        "if os.environ['RANK'] == '1':\n"
        "    sys.exit(0)\n"
        "time.sleep(1.0)\n"
        "sys.exit(1)\n"
    )
    config = _config("python3 early.py", resources={"slots_per_trial": 2})
    with pytest.raises(TrainingError) as failed:
        run_local(config=config, model_dir=tmp_path, checkpoint_dir=tmp_path / "c")
    message = str(failed.value)
    assert "(rank 0) exited with code 1" in message
    assert "rank 1 had already exited 0 while it trained on" in message
    assert "its last output:\n  (none)" in message


def test_a_local_run_remembers_only_its_latest_steps_values(tmp_path: Path) -> None:
    from assay._backend import _RECENT_STEPS, LocalBackend

    backend = LocalBackend(tmp_path / "m.jsonl", None)
    for step in range(_RECENT_STEPS + 50):
        backend.report_metrics("training", step, {"loss": 1.0})
    assert len(backend._reported["training"]) == _RECENT_STEPS
    backend.report_metrics("training", _RECENT_STEPS + 49, {"loss": 1.0})  # the same: fine
    with pytest.raises(AssayError, match="already reported training metric 'loss'"):
        backend.report_metrics("training", _RECENT_STEPS + 49, {"loss": 2.0})


def test_a_module_is_looked_up_only_where_the_trial_runs(tmp_path: Path) -> None:
    """`python3 -m models` beside a model.py: perhaps a typo, perhaps installed on the
    agents only; `experiment create` on another machine does not refuse it."""
    from assay._script import script_problem

    (tmp_path / "model.py").write_text("")
    argv = ["python3", "-m", "models"]
    assert script_problem(argv, tmp_path, runs_here=False) is None
    assert "did you mean 'model'" in str(script_problem(argv, tmp_path))
