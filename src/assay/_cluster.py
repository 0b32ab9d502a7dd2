"""One slot's process on a cluster: `python -m assay._cluster`, launched by an agent.

The agent sets the torch.distributed variables (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and ASSAY_TRIAL_SPEC, the path of a JSON file:

    {"config": {...}, "hparams": {...}, "trial_seed": 7, "trial_id": 12, "run_id": 2,
     "experiment_id": 3, "allocation_id": "...", "checkpoint_root": "/ckpts/3",
     "restore_from": "/ckpts/3/<uuid>" | null, "trial_api": "master:port", "token": "..."}

and starts it in the extracted model directory. The process builds the Trial with the
master's hyperparameters and seed, restores `restore_from` if set, and trains under a
`ClusterSession` (rank 0 only) that takes its targets from the master's TrialService and
reports metrics and checkpoints to it.

With `checkpoint_storage.type: s3`, checkpoints are written to a local temporary directory
(`checkpoint_root` is not used), uploaded to `s3://bucket/prefix/<uuid>` before they are
reported, and removed locally; an `s3://` `restore_from` is downloaded by every rank into a
temporary directory. Either way every file of `restore_from` is verified against the
sha256s the master recorded for it (`restore_sha256`) before anything is loaded. This
process does the transfers with its own credentials (the config's, or AWS_* variables).

Exit status: 0 once the searcher asks for no more and training finished; 78 with a last line
`error: <message>` for a `PermanentError` (an entrypoint that names no Trial or a script
that is missing or does not compile, a Trial whose construction fails on a programming
error, a validation without `searcher.metric`): the master ends the trial in ERROR without
a restart; 2 with one line `error: <message>` on stderr for another `AssayError` (a fenced
run, a refused token, an unreachable master); 1 with the traceback, then a line naming the
user's frame, for anything else (user code).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import sys
import tempfile
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path

from assay._checkpoint import check_writable, cluster_storage_fix
from assay._session import CheckpointReport, MetricsReport, log_metrics
from assay._trial_client import TrialClient, retry_budget_from_env
from assay.common.archive import format_bytes
from assay.common.spec import SPEC_ENV, ClusterSpec, WorkerSpec
from assay.common.storage import (
    TENSORBOARD,
    StorageError,
    StorageManager,
    checkpoint_uuid,
    is_remote,
    storage_at,
    storage_for,
    trial_storage,
)
from assay.config import CheckpointStorageConfig, ExperimentConfig, parse_config
from assay.errors import (
    INVALID_HP_EXIT_CODE,
    PERMANENT_ERROR_EXIT_CODE,
    PREEMPTED_EXIT_CODE,
    AssayError,
    EntrypointError,
    InvalidHP,
    PermanentError,
    TrialPreempted,
)

log = logging.getLogger("assay")


def worker_spec(
    spec: ClusterSpec,
    model_dir: str | Path,
    *,
    checkpoint_dir: str | None = None,
    resume_from: str | None = None,
) -> WorkerSpec:
    """The `WorkerSpec` of this slot of `spec`'s trial run."""
    return WorkerSpec(
        config=spec.config,
        model_dir=str(Path(model_dir).resolve()),
        checkpoint_dir=checkpoint_dir or spec.checkpoint_root,
        resume_from=resume_from or spec.restore_from,
        resume_sha256=spec.restore_sha256,
        trial_id=spec.trial_id,
        hparams=spec.hparams,
        trial_seed=spec.trial_seed,
    )


class ClusterSession:
    """The `Session` of rank 0 on a cluster. Its calls to the master go through
    `assay.core`'s `ClusterBackend`, the one client of the TrialService that Core API
    scripts use too; this adds what the Trial harness needs (uploads, the validation of
    a checkpoint's own weights, TensorBoard files)."""

    def __init__(
        self,
        client: TrialClient,
        spec: ClusterSpec,
        storage: StorageManager | None = None,
        local_root: Path | None = None,
    ) -> None:
        """`storage`: where checkpoints are uploaded before they are reported (None: they
        were written in place, on shared_fs). `local_root`: where they are written first
        then; its TensorBoard event files are uploaded with every checkpoint and at the
        end (`tensorboard/trial-<id>` in the storage)."""
        from assay._backend import ClusterBackend

        self.backend = ClusterBackend(spec, client=client, unit="batch", echo=False)
        self.storage = storage
        self.tensorboard = (
            None if storage is None or local_root is None else Path(local_root) / TENSORBOARD
        )
        self.storage_config = parse_config(spec.config).checkpoint_storage
        self.checkpoint_root = spec.checkpoint_root
        if storage is None:  # shared_fs: checkpoints are written in place
            fix = cluster_storage_fix(self.storage_config.host_path)
            check_writable(Path(spec.checkpoint_root), fix)
        self.last_validation: dict[str, float] = {}
        self.last_validation_batches = -1

    def next_target(self, total_batches: int) -> int | None:
        target = self.backend.next_target(total_batches)
        if target is None:
            log.info("batch %d: done training (the searcher asks for no more)", total_batches)
        else:
            log.info("batch %d: train to batch %d", total_batches, target)
        return target

    def report_training_metrics(self, report: MetricsReport) -> None:
        log_metrics("training", report)  # the logs show what run-local prints
        self.backend.report_metrics("training", report.total_batches, report.metrics)

    def report_metrics(self, group: str, report: MetricsReport) -> None:
        self.backend.report_metrics(group, report.total_batches, report.metrics)

    def report_validation_metrics(self, report: MetricsReport) -> None:
        log_metrics("validation", report)
        self.backend.report_metrics("validation", report.total_batches, report.metrics)
        self.last_validation = dict(report.metrics)
        self.last_validation_batches = report.total_batches

    def report_checkpoint(self, report: CheckpointReport) -> None:
        metadata = report.metadata
        # The master derives the location by the same rule and refuses any other.
        location = trial_storage(self.storage_config, self.checkpoint_root).location(
            checkpoint_uuid(metadata.uuid)
        )
        if self.storage is not None:
            self.storage.upload(report.path, metadata.uuid)
            shutil.rmtree(report.path, ignore_errors=True)  # stored: the local copy is spare
        # Only a validation of these very weights describes the checkpoint (garbage
        # collection ranks checkpoints by it); one taken at another batch does not.
        same = self.last_validation_batches == metadata.total_batches
        self.backend.report_checkpoint(
            metadata, location, validation_metrics=self.last_validation if same else {}
        )
        log.info(
            "batch %d checkpoint: %s (%s)",
            metadata.total_batches,
            location,
            format_bytes(metadata.size_bytes),
        )
        self.sync_tensorboard()

    def complete_target(
        self, total_batches: int, searcher_metric: float, *, stop_requested: bool = False
    ) -> None:
        self.backend.complete_target(total_batches, searcher_metric, stop_requested=stop_requested)

    def preempt_requested(self) -> bool:
        return self.backend.preempt_requested()

    def sync_tensorboard(self) -> None:
        """Upload this trial's TensorBoard event files (object storage only)."""
        upload_part = getattr(self.storage, "upload_part", None)
        if self.tensorboard is None or upload_part is None or not self.tensorboard.is_dir():
            return
        try:
            upload_part(self.tensorboard, TENSORBOARD)
        except StorageError as e:
            log.warning("TensorBoard files were not uploaded: %s", e)

    def close(self) -> None:
        self.sync_tensorboard()
        self.backend.close()


def run_cluster_slot(
    spec: ClusterSpec,
    *,
    model_dir: str | Path,
    env: Mapping[str, str] | None = None,
    retry_s: float | None = None,
) -> None:
    """Train this slot of `spec`'s trial run until the master says stop."""
    from assay._worker import run_worker

    budget = retry_budget_from_env(env) if retry_s is None else retry_s
    sessions: list[ClusterSession] = []
    storage_config = parse_config(spec.config).checkpoint_storage
    scratch = Path(tempfile.mkdtemp(prefix="assay-checkpoints-"))
    storage: StorageManager | None = None
    checkpoint_dir: str | None = None
    if storage_config.type != "shared_fs":
        storage = storage_for(storage_config)
        checkpoint_dir = str(scratch / "out")

    def make_session(config: ExperimentConfig) -> ClusterSession:
        log.info(
            "trial %d run %d (experiment %d, allocation %s): master at %s",
            spec.trial_id,
            spec.run_id,
            spec.experiment_id,
            spec.allocation_id,
            spec.trial_api,
        )
        client = TrialClient(spec.trial_api, spec.token, retry_s=budget)
        local_root = Path(checkpoint_dir) if checkpoint_dir is not None else None
        session = ClusterSession(client, spec, storage, local_root)
        sessions.append(session)
        return session

    try:
        resume_from = None
        if spec.restore_from and spec.restore_sha256 is None:
            log.warning(
                "checkpoint %s has no sha256s in the master's record (an older Assay reported "
                "it): it is verified against its own manifest only",
                spec.restore_from,
            )
        if spec.restore_from and is_remote(spec.restore_from):
            resume_from = str(
                fetch_checkpoint(spec.restore_from, storage_config, scratch, spec.restore_sha256)
            )
        worker = worker_spec(
            spec, model_dir, checkpoint_dir=checkpoint_dir, resume_from=resume_from
        )
        run_worker(worker, env=env, session_factory=make_session, storage=storage)
    finally:
        for session in sessions:
            session.close()
        shutil.rmtree(scratch, ignore_errors=True)


def fetch_checkpoint(
    location: str,
    config: CheckpointStorageConfig,
    scratch: Path,
    recorded: Mapping[str, str] | None = None,
) -> Path:
    """Download the checkpoint at `location` under `scratch` and verify it: against the
    master's `recorded` sha256s when given, else against its own manifest."""
    from assay._checkpoint import verify_checkpoint

    storage, uuid = storage_at(location, config)
    target = scratch / "restore" / uuid
    log.info("downloading checkpoint %s", location)
    storage.download(uuid, target)
    verify_checkpoint(target, recorded)
    return target


def check_script(command: Sequence[str], model_dir: Path) -> None:
    """Refuse, before it runs, a script that is missing or does not compile: every run
    would fail the same way (a script's later failures are its own to report)."""
    from assay._script import script_problem

    problem = script_problem(command, model_dir)
    if problem is not None:
        raise EntrypointError(problem)


def main(argv: list[str], *, entrypoint: str | None = None) -> int:
    """One slot: a Trial class trained here, or a script entrypoint exec'd in its place.

    `entrypoint`: a Trial's `module:Class` that replaces the config's (Determined's
    `python3 -m determined.launch.torch_distributed --trial module:Class`).
    """
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    try:
        path = argv[0] if argv else os.environ.get(SPEC_ENV)
        if not path:
            raise AssayError(f"{SPEC_ENV} is not set: it names the trial spec JSON file")
        spec = ClusterSpec.load(path)
        command = parse_config(spec.config).command
        if entrypoint is None and command is not None:
            from assay._script import exec_command, launcher_trial

            entrypoint = launcher_trial(command)
            if entrypoint is None:
                check_script(command, Path.cwd())
                exec_command(command)  # the script takes this process's place
        if entrypoint is not None:
            spec = dataclasses.replace(spec, config={**spec.config, "entrypoint": entrypoint})
        run_cluster_slot(spec, model_dir=Path.cwd())
    except TrialPreempted as e:
        print(e, flush=True)
        from assay._worker import leave_process_group

        leave_process_group(PREEMPTED_EXIT_CODE)
        return PREEMPTED_EXIT_CODE
    except InvalidHP as e:
        print(f"error: the trial's hyperparameters are unusable: {e}", file=sys.stderr)
        return INVALID_HP_EXIT_CODE
    except PermanentError as e:
        if e.__cause__ is not None:
            traceback.print_exception(e.__cause__)
        print(f"error: {e}", file=sys.stderr)
        return PERMANENT_ERROR_EXIT_CODE
    except AssayError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        from assay._user_frame import describe

        traceback.print_exc()
        # The last line is what the trial's last_error quotes: name the user's frame.
        print(f"error: {describe(e)}", file=sys.stderr)
        return 1
    from assay._worker import leave_process_group

    leave_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
