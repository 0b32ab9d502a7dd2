"""Where the chief's reports go: the master (on a cluster) or a local file (off it).

The contexts (`train`, `checkpoint`, `searcher`, `preempt`) hold the rules; a backend
only carries their calls. Only the chief process has one.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from assay._checkpoint import MANIFEST, CheckpointMetadata
from assay._session import _fmt
from assay.common.archive import format_bytes, make_local_output_dir
from assay.common.spec import ClusterSpec
from assay.config import UNBOUNDED_LENGTH
from assay.errors import AssayError

if TYPE_CHECKING:
    from assay._trial_client import TrialClient

log = logging.getLogger("assay")


class Backend(Protocol):
    def report_metrics(self, group: str, steps: int, metrics: Mapping[str, float]) -> None: ...

    def next_target(self, units: int) -> int | None:
        """The length the searcher asks this trial to train to; None: stop here."""

    def complete_target(self, target: int, metric: float) -> None: ...

    def report_checkpoint(self, metadata: CheckpointMetadata, location: str) -> None: ...

    def preempt_requested(self) -> bool:
        """Whether the master asks this trial to stop (pause, cancel, preemption)."""

    def best_validation(self) -> float | None: ...

    def report_progress(self, progress: float) -> None: ...

    def delete_checkpoints(self, uuids: Sequence[str]) -> None: ...

    def close(self) -> None: ...


class ClusterBackend:
    """The chief's calls to the master's TrialService for one trial run."""

    def __init__(
        self,
        spec: ClusterSpec,
        retry_s: float | None = None,
        client: TrialClient | None = None,
        unit: str = "step",
        *,
        echo: bool = True,
    ) -> None:
        """`client`: an open `TrialClient` to use (and close); by default one to the
        spec's master, retrying for `retry_s` (`ASSAY_MASTER_RETRY_S`, else 15 min).
        `unit`: what the logs call a count ("step" for scripts, "batch" for Trials).
        `echo`: log each report's line (`step 10 training: loss=...`), as a run off the
        cluster prints it; the Trial harness logs its own and passes False."""
        from assay._trial_client import TrialClient, retry_budget_from_env

        self.spec = spec
        self.unit = unit
        self.echo = echo
        if client is None:
            budget = retry_budget_from_env() if retry_s is None else retry_s
            client = TrialClient(spec.trial_api, spec.token, retry_s=budget)
        self.client = client
        self._ids: dict[str, Any] = {"trial_id": spec.trial_id, "run_id": spec.run_id}

    def report_metrics(self, group: str, steps: int, metrics: Mapping[str, float]) -> None:
        from assay.proto import common_pb2, trial_pb2

        values = {k: float(v) for k, v in metrics.items()}
        report = common_pb2.MetricsReport(total_batches=steps, metrics=values)
        self.client.report_metrics(
            trial_pb2.ReportMetricsRequest(**self._ids, group=group, reports=[report])
        )
        if self.echo:
            report_line("%s %d %s: %s", self.unit, steps, group, _fmt(dict(metrics)))

    def next_target(self, units: int) -> int | None:
        from assay.proto import trial_pb2

        op = self.client.next_operation(
            trial_pb2.NextOperationRequest(**self._ids, total_batches=units)
        )
        return None if op.stop else int(op.total_batches)

    def complete_target(self, target: int, metric: float, *, stop_requested: bool = False) -> None:
        from assay.proto import trial_pb2

        self.client.complete_operation(
            trial_pb2.CompleteOperationRequest(
                **self._ids,
                total_batches=target,
                searcher_metric=metric,
                stop_requested=stop_requested,
            )
        )

    def report_checkpoint(
        self,
        metadata: CheckpointMetadata,
        location: str,
        validation_metrics: Mapping[str, float] | None = None,
    ) -> None:
        """`validation_metrics`: those of these very weights, if they were validated.

        Every file is reported with its sha256, the manifest too: the master's record is
        what a restore verifies the checkpoint against, whatever the storage holds then."""
        from assay.proto import common_pb2, trial_pb2

        entries = {**metadata.files, MANIFEST: metadata.manifest_entry()}
        checkpoint = common_pb2.Checkpoint(
            uuid=metadata.uuid,
            trial_id=self.spec.trial_id,
            experiment_id=self.spec.experiment_id,
            run_id=self.spec.run_id,
            total_batches=metadata.total_batches,
            state=common_pb2.CHECKPOINT_STATE_COMPLETED,
            location=location,
            files=[
                common_pb2.CheckpointFile(name=name, size_bytes=entry.size, sha256=entry.sha256)
                for name, entry in sorted(entries.items())
            ],
            validation_metrics=dict(validation_metrics or {}),
        )
        user = json.loads(json.dumps(metadata.user_metadata, default=str))
        if user:
            checkpoint.user_metadata.update(user)
        self.client.report_checkpoint(
            trial_pb2.ReportCheckpointRequest(**self._ids, checkpoint=checkpoint)
        )
        if self.echo:
            _log_checkpoint(metadata, location, self.unit)

    def preempt_requested(self) -> bool:
        from assay.proto import trial_pb2

        answer = self.client.should_preempt(trial_pb2.ShouldPreemptRequest(**self._ids))
        return bool(answer.preempt)

    def best_validation(self) -> float | None:
        from assay.proto import trial_pb2

        answer = self.client.get_best_validation(trial_pb2.GetBestValidationRequest(**self._ids))
        return float(answer.value) if answer.found else None

    def report_progress(self, progress: float) -> None:
        from assay.proto import trial_pb2

        self.client.report_progress(trial_pb2.ReportProgressRequest(**self._ids, progress=progress))

    def delete_checkpoints(self, uuids: Sequence[str]) -> None:
        from assay.proto import trial_pb2

        answer = self.client.delete_checkpoints(
            trial_pb2.DeleteTrialCheckpointsRequest(**self._ids, uuids=list(uuids))
        )
        if answer.failed:
            from assay._checkpoint import CheckpointError

            reasons = "; ".join(f"{k}: {v}" for k, v in sorted(answer.failed.items()))
            raise CheckpointError(f"cannot delete checkpoints: {reasons}")

    def close(self) -> None:
        self.client.close()


_RECENT_STEPS = 1000  # the steps whose values a local run remembers, to refuse changes


class LocalBackend:
    """Off the cluster: print every report and append it to `metrics_path` (JSON lines).

    `max_length`, when known (run-local gives the config), is the one target; otherwise
    the target is never reached and a script trains as long as it likes.
    """

    def __init__(
        self,
        metrics_path: Path,
        max_length: int | None,
        metric: str | None = None,
        smaller_is_better: bool = True,
        *,
        mark_dir: bool = False,
    ) -> None:
        """`mark_dir`: `metrics_path`'s directory is a plain run's default
        `./assay-metrics`, created at the first report marked as a local run's output."""
        self.metrics_path = metrics_path
        self._mark_dir = mark_dir
        self.max_length = max_length
        self.metric = metric
        self.smaller_is_better = smaller_is_better
        self._best: float | None = None
        self._done = False
        # group -> step -> name -> value, for the latest _RECENT_STEPS steps of each group
        self._reported: dict[str, dict[int, dict[str, float]]] = {}
        # Every record names its run, so the runs that append to one file stay apart.
        self._run = dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")

    def _append(self, record: dict[str, Any]) -> None:
        if self._mark_dir:  # once: the first report makes the directory
            make_local_output_dir(self.metrics_path.parent)
            self._mark_dir = False
        self.metrics_path.parent.mkdir(parents=True, exist_ok=True)
        with self.metrics_path.open("a") as f:
            line = {**record, "run": self._run, "time": time.time()}
            f.write(json.dumps(line, allow_nan=True) + "\n")

    def report_metrics(self, group: str, steps: int, metrics: Mapping[str, float]) -> None:
        self._check_unchanged(group, steps, metrics)
        self._append({"group": group, "steps_completed": steps, "metrics": dict(metrics)})
        report_line("step %d %s: %s", steps, group, _fmt(dict(metrics)))
        value = metrics.get(self.metric) if self.metric and group == "validation" else None
        if value is not None and not math.isnan(value):
            better = self._best is None or (
                value < self._best if self.smaller_is_better else value > self._best
            )
            if better:
                self._best = value

    def _check_unchanged(self, group: str, steps: int, metrics: Mapping[str, float]) -> None:
        """Refuse what the master refuses: a metric reported again at the same step with
        another value (the same value again is a no-op there too)."""
        recent = self._reported.setdefault(group, {})
        at = recent.setdefault(steps, {})
        if len(recent) > _RECENT_STEPS:  # a long run: keep the latest steps' values only
            del recent[next(iter(recent))]  # the step reported first
        for name, value in metrics.items():
            stored = at.setdefault(name, value)
            if stored != value and not (math.isnan(stored) and math.isnan(value)):
                raise AssayError(
                    f"already reported {group} metric {name!r} at step {steps} as {stored!r}; "
                    f"a different value ({value!r}) is refused (on a cluster too): report "
                    "each step once, or at a new step"
                )

    def next_target(self, units: int) -> int | None:
        if self._done:
            return None
        return UNBOUNDED_LENGTH if self.max_length is None else self.max_length

    def complete_target(self, target: int, metric: float) -> None:
        self._done = True

    def report_checkpoint(self, metadata: CheckpointMetadata, location: str) -> None:
        self._append(
            {
                "checkpoint": metadata.uuid,
                "location": location,
                "steps_completed": metadata.total_batches,
                "metadata": metadata.user_metadata,
            }
        )
        _log_checkpoint(metadata, location)

    def preempt_requested(self) -> bool:
        return False

    def best_validation(self) -> float | None:
        return self._best

    def report_progress(self, progress: float) -> None:
        self._append({"progress": progress})

    def delete_checkpoints(self, uuids: Sequence[str]) -> None:
        pass  # the checkpoint context deletes the local files itself

    def close(self) -> None:
        pass


class ClosedBackend:
    """What the contexts talk to once `assay.core.init()`'s block has ended (or
    `close()`): every call says so, on a cluster (the master's channel is closed) as
    under run-local (its file is closed) and in a plain run."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy, pickle and hasattr probes
            raise AttributeError(name)
        raise AssayError(
            f"the Core API context is closed (a call that needs {name}): report metrics, "
            "store checkpoints and ask the searcher inside `with assay.core.init() as "
            "core:`, before it ends"
        )


def report_line(message: str, *args: object) -> None:
    """Log one of the lines a report prints (`step 10 validation: ...`) at INFO, or print
    it when the script has configured no logging at all: Python would show only warnings,
    so a plain `python3 train.py` printed nothing. A script that configured logging gets
    the line as it configured (its root at WARNING hides it)."""
    if log.isEnabledFor(logging.INFO):
        log.info(message, *args)
    elif not logging.getLogger().handlers:
        print(message % args, flush=True)


def _log_checkpoint(metadata: CheckpointMetadata, location: str, unit: str = "step") -> None:
    report_line(
        "%s %d checkpoint: %s (%s)",
        unit,
        metadata.total_batches,
        location,
        format_bytes(metadata.size_bytes),
    )


def read_local_records(metrics_path: Path) -> list[dict[str, Any]]:
    """The records a `LocalBackend` wrote, in order (none if it wrote nothing)."""
    if not metrics_path.exists():
        return []
    return [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]


__all__ = ["Backend", "ClusterBackend", "LocalBackend", "read_local_records"]
