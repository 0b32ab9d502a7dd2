"""`Experiment` and `Trial`: handles on the master's records, read afresh when asked."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from assay.errors import AssayError

from . import _records as fmt
from ._address import poll_seconds
from ._checkpoint import Checkpoint, best_checkpoints

if TYPE_CHECKING:
    from assay.proto import common_pb2

    from ._api import Client


class Experiment:
    """An experiment on the master. `state` is read afresh at each access; `config`,
    `name` and the rest are as of the last `reload()`."""

    def __init__(self, api: Client, record: common_pb2.Experiment) -> None:
        self._api = api
        self._record = record

    def __repr__(self) -> str:
        return f"Experiment(id={self.id}, name={self.name!r})"

    @property
    def id(self) -> int:
        return int(self._record.id)

    @property
    def name(self) -> str:
        return str(self._record.name)

    @property
    def description(self) -> str:
        return str(self._record.description)

    @property
    def owner(self) -> str:
        return str(self._record.owner)

    @property
    def labels(self) -> list[str]:
        return list(self._record.labels)

    @property
    def config(self) -> dict[str, Any]:
        """The validated experiment config, as a dict."""
        return fmt.struct(self._record.config)

    @property
    def seed(self) -> int:
        """`reproducibility.experiment_seed`: the config's, or the one the master drew for
        an experiment whose config set none (its trials' hyperparameters and seeds derive
        from it; set it in a config to search the same points again)."""
        return fmt.experiment_seed(self.config)

    @property
    def state(self) -> str:
        """ACTIVE, PAUSED, STOPPING_CANCELED, STOPPING_KILLED, COMPLETED, CANCELED or ERROR."""
        self.reload()
        return fmt.experiment_state(self._record.state)

    @property
    def progress(self) -> float:
        """0..1, as of the last `reload()`."""
        return float(self._record.progress)

    def reload(self) -> Experiment:
        """Read the experiment again from the master."""
        self._record = self._api.get_experiment(self.id).experiment
        return self

    def wait(
        self, progress: bool = True, *, timeout: float | None = None, interval: float | None = None
    ) -> str:
        """Wait until the experiment ends and return its final state (COMPLETED, CANCELED
        or ERROR). With `progress`, a line on stderr whenever it changes (trials done,
        running, queued; the best metric). `timeout` seconds: `TimeoutError` after them;
        `interval`: seconds between polls (default ASSAY_POLL_SECONDS, else 1)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        every = poll_seconds() if interval is None else interval
        last = ""
        while True:
            response = self._api.get_experiment(self.id)
            self._record = response.experiment
            state = fmt.experiment_state(response.experiment.state)
            if progress:
                line = fmt.progress_line(response)
                if line != last:
                    print(f"experiment {self.id}: {line}", file=sys.stderr, flush=True)
                    last = line
            if state in fmt.TERMINAL_EXPERIMENT_STATES:
                return state
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"experiment {self.id} is still {state} after {timeout:g} s")
            time.sleep(every)

    def _act(self, action: str) -> None:
        from assay.proto import api_pb2

        kind = api_pb2.ExperimentActionKind.Value(f"EXPERIMENT_ACTION_{action.upper()}")
        self._record = self._api.experiment_action(self.id, kind)

    def pause(self) -> None:
        """Pause: its trials checkpoint and release their slots."""
        self._act("pause")

    def activate(self) -> None:
        """Resume (or start) a paused experiment."""
        self._act("activate")

    def cancel(self) -> None:
        """Stop gracefully: trials checkpoint, then stop."""
        self._act("cancel")

    def kill(self) -> None:
        """Stop now, without checkpointing."""
        self._act("kill")

    def archive(self) -> None:
        """Hide a finished experiment from the default listing."""
        self._act("archive")

    def unarchive(self) -> None:
        self._act("unarchive")

    def delete(self) -> list[str]:
        """Delete the ended experiment, its checkpoints (files and records), trials,
        metrics and logs, for good; return the uuids of the checkpoints deleted.
        Refused (`AssayError`, nothing deleted) while it is active, paused or stopping,
        or while a version of a model in its own workspace uses one of its checkpoints
        (versions of other workspaces' models are marked as having lost them). Raises
        `AssayError` too, after the deletion, naming checkpoints whose files could not
        be deleted from storage."""
        answer = self._api.delete_experiment(self.id)
        if answer.failed:
            named = "; ".join(f"{uuid}: {why}" for uuid, why in sorted(answer.failed.items()))
            raise AssayError(
                f"experiment {self.id} is deleted, but these checkpoints' files are left "
                f"in storage: {named}"
            )
        return list(answer.deleted_checkpoints)

    def continue_training(
        self, batches: int | None = None, *, config: Mapping[str, Any] | None = None
    ) -> None:
        """Continue this finished (COMPLETED, CANCELED or ERROR) single-trial experiment:
        its trial resumes from its latest checkpoint and trains on to `batches` in all
        (`searcher.max_length.batches`), with the changes of `config` (a partial config:
        searcher.max_length, max_restarts, min_validation_period, min_checkpoint_period).
        `AssayError` says why it cannot; `.wait()` follows it to its end."""
        import yaml

        changes: dict[str, Any] = dict(config or {})
        if batches is not None:
            searcher = dict(changes.get("searcher") or {})
            changes["searcher"] = {**searcher, "max_length": {"batches": batches}}
        text = yaml.safe_dump(changes, sort_keys=False) if changes else ""
        self._record = self._api.continue_experiment(self.id, text)

    def set_name(self, name: str) -> None:
        self._record = self._api.patch_experiment(self.id, name=name)

    def set_description(self, description: str) -> None:
        self._record = self._api.patch_experiment(self.id, description=description)

    def set_labels(self, labels: list[str]) -> None:
        """Replace its labels."""
        self._record = self._api.patch_experiment(self.id, labels=labels)

    def add_label(self, label: str) -> None:
        self._record = self._api.patch_experiment(self.id, add_labels=[label])

    def remove_label(self, label: str) -> None:
        self._record = self._api.patch_experiment(self.id, remove_labels=[label])

    def trials(self) -> list[Trial]:
        """Its trials, in the order they were created."""
        response = self._api.get_experiment(self.id)
        self._record = response.experiment
        return [Trial(self._api, t) for t in response.trials]

    def checkpoints(self) -> list[Checkpoint]:
        """Every checkpoint of its trials that still exists, oldest first per trial."""
        found = self._api.list_checkpoints(self.id)
        return [Checkpoint(self._api, c) for c in found if _completed(c)]

    def top_checkpoint(
        self, sort_by: str | None = None, smaller_is_better: bool | None = None
    ) -> Checkpoint:
        """The checkpoint with the best validation metric: `searcher.metric` and
        `searcher.smaller_is_better` of the config unless given."""
        return self.top_n_checkpoints(1, sort_by, smaller_is_better)[0]

    def top_n_checkpoints(
        self, n: int, sort_by: str | None = None, smaller_is_better: bool | None = None
    ) -> list[Checkpoint]:
        """The `n` best checkpoints (fewer if there are fewer), best first, among those
        with a value of the metric; `AssayError` if none has one."""
        metric, smaller = _ranking(self.config, sort_by, smaller_is_better)
        return best_checkpoints(self.checkpoints(), n, metric, smaller, f"experiment {self.id}")


class Trial:
    """A trial on the master. `state` is read afresh at each access; `hparams` and the
    rest are as of the last `reload()`."""

    def __init__(self, api: Client, record: common_pb2.Trial) -> None:
        self._api = api
        self._record = record

    def __repr__(self) -> str:
        return f"Trial(id={self.id}, experiment_id={self.experiment_id})"

    @property
    def id(self) -> int:
        return int(self._record.id)

    @property
    def experiment_id(self) -> int:
        return int(self._record.experiment_id)

    @property
    def hparams(self) -> dict[str, Any]:
        return fmt.struct(self._record.hparams)

    @property
    def total_batches(self) -> int:
        """Batches trained, as of the last `reload()`."""
        return int(self._record.total_batches)

    @property
    def best_validation(self) -> float | None:
        """Its best value of the searcher's metric, as of the last `reload()`."""
        return self._record.best_validation if self._record.HasField("best_validation") else None

    @property
    def state(self) -> str:
        """QUEUED, RUNNING, PAUSED, STOPPING, COMPLETED, CANCELED or ERROR."""
        self.reload()
        return fmt.trial_state(self._record.state)

    def reload(self) -> Trial:
        """Read the trial again from the master."""
        self._record = self._api.get_trial(self.id)
        return self

    def kill(self) -> None:
        """Kill this trial now, without checkpointing: it ends CANCELED, its searcher sees
        it exit, and its experiment goes on with its other trials."""
        self._record = self._api.kill_trial(self.id)

    def metrics(self, group: str = "validation") -> Iterator[dict[str, Any]]:
        """Its reports of metrics `group` (training, validation or a custom group), in
        batch order: `{"total_batches": 40, "val_loss": 0.12, ...}` each."""
        response = self._api.get_trial_metrics(self.id, group)
        for report in response.reports:
            yield {"total_batches": int(report.total_batches), **dict(report.metrics)}

    def metrics_dataframe(self, group: str = "validation") -> Any:
        """`metrics(group)` as a pandas DataFrame, one row per report. Needs pandas."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError(
                "Trial.metrics_dataframe needs pandas: pip install pandas "
                "(or iterate over Trial.metrics)"
            ) from None
        rows = list(self.metrics(group))
        return pd.DataFrame(rows, columns=None if rows else ["total_batches"])

    def logs(self, follow: bool = False) -> Iterator[str]:
        """Its log lines, every rank's, in order; `follow`: keep yielding until it ends."""
        for line in self._api.stream_trial_logs(self.id, follow=follow):
            yield str(line.message)

    def checkpoints(self) -> list[Checkpoint]:
        """Its checkpoints that still exist, oldest first."""
        found = self._api.list_checkpoints(self.experiment_id, self.id)
        return [Checkpoint(self._api, c) for c in found if _completed(c)]

    def latest_checkpoint(self) -> Checkpoint:
        """The checkpoint of the most batches; `AssayError` if it has none."""
        found = self.checkpoints()
        if not found:
            raise AssayError(f"trial {self.id} has no checkpoint")
        return max(found, key=lambda c: c.total_batches)

    def top_checkpoint(
        self, sort_by: str | None = None, smaller_is_better: bool | None = None
    ) -> Checkpoint:
        """Its checkpoint with the best validation metric (the searcher's unless given)."""
        config = self._api.get_experiment(self.experiment_id).experiment.config
        metric, smaller = _ranking(fmt.struct(config), sort_by, smaller_is_better)
        return best_checkpoints(self.checkpoints(), 1, metric, smaller, f"trial {self.id}")[0]


def _completed(c: common_pb2.Checkpoint) -> bool:
    return fmt.checkpoint_state(c.state) == "COMPLETED"


def _ranking(
    config: dict[str, Any], sort_by: str | None, smaller_is_better: bool | None
) -> tuple[str, bool]:
    searched, smaller = fmt.searcher_objective(config)
    metric = sort_by or searched
    if not metric:
        raise AssayError("the experiment's searcher names no metric: pass sort_by=")
    if smaller_is_better is None:
        smaller_is_better = smaller
    return str(metric), smaller_is_better
