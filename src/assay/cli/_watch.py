"""Watching an experiment until it ends: `experiment create --follow` and `experiment wait`.

Both print a progress line (trials done / running / queued, the best metric so far) at
most every few seconds, and end with one summary line: the final state, the best
validation metric and the checkpoint that holds it. `--follow` also prints every trial's
state changes and log lines; the logs of a trial are printed before its final state, and
the logs of every trial before the experiment's.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from assay.client import (
    TERMINAL_EXPERIMENT_STATES,
    TERMINAL_TRIAL_STATES,
    best_trial,
    checkpoint_state,
    experiment_state,
    metric_name,
    poll_seconds,
    progress_line,
    searcher_objective,
    struct,
    trial_state,
)
from assay.client import (
    metric as metric_text,
)
from assay.errors import AssayError

if TYPE_CHECKING:
    from assay.client import Client
    from assay.proto import api_pb2, common_pb2

# A trial's logs are asked for once more after it ends: its last lines can reach the
# master a moment after its state does.
_DRAIN_POLLS = 2


def progress_seconds() -> float:
    """The least time between two progress lines (ASSAY_PROGRESS_SECONDS, default 5)."""
    try:
        return max(0.0, float(os.environ.get("ASSAY_PROGRESS_SECONDS", "5")))
    except ValueError:
        return 5.0


@dataclass
class Summary:
    """How an experiment ended, for the last line (and `--json`)."""

    experiment_id: int
    state: str
    metric: str
    best_validation: float | None = None
    best_trial: int | None = None
    best_checkpoint: str | None = None
    # The searcher metric's value in `best_checkpoint` (None: it holds none): it differs
    # from `best_validation` when no checkpoint was taken at that validation.
    best_checkpoint_validation: float | None = None
    # trial id -> last_error, of the trials that ended in ERROR
    errors: dict[int, str] = field(default_factory=dict)

    def line(self) -> str:
        text = f"experiment {self.experiment_id} {self.state}"
        if self.best_validation is None:
            text += f": no validation {self.metric} reported"
        else:
            text += (
                f": best {self.metric} {metric_text(self.best_validation)} "
                f"(trial {self.best_trial}), checkpoint {self.best_checkpoint or '-'}"
            )
            held = self.best_checkpoint_validation
            if self.best_checkpoint and held != self.best_validation:
                text += (
                    f" (its {self.metric} {metric_text(held)}: no checkpoint was taken at the "
                    "best validation)"
                    if held is not None
                    else " (the trial's latest: no checkpoint holds a validation)"
                )
        if self.errors and self.state != "COMPLETED":
            trial_id, error = next(iter(sorted(self.errors.items())))
            first = error.strip().splitlines()[-1] if error.strip() else "no message"
            text += f"; trial {trial_id} failed: {first}"
        return text

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.experiment_id,
            "state": self.state,
            "metric": self.metric,
            "best_validation": self.best_validation,
            "best_trial": self.best_trial,
            "best_checkpoint": self.best_checkpoint,
            "best_checkpoint_validation": self.best_checkpoint_validation,
            "errors": {str(k): v for k, v in sorted(self.errors.items())},
        }


def _trial_end(t: common_pb2.Trial, metric: str) -> str:
    """`trial 3: COMPLETED at batch 40 (best val_loss 0.2)`: how a trial ended."""
    state = trial_state(t.state)
    text = f"trial {t.id}: {state} at batch {t.total_batches}"
    if t.HasField("best_validation"):
        text += f" (best {metric} {metric_text(t.best_validation)})"
    if state == "ERROR":
        restarts = f" after {t.restarts} restarts" if t.restarts else ""
        error = (t.last_error or "").strip()
        text += restarts + (f": {error.splitlines()[-1]}" if error else "")
    return text


class Watcher:
    """Polls one experiment until it ends, printing through `out`.

    `logs`: print trial state changes and log lines (`--follow`); `quiet`: print
    nothing but what the caller prints at the end.
    """

    def __init__(
        self,
        api: Client,
        experiment_id: int,
        out: Callable[[str], None],
        *,
        logs: bool,
        quiet: bool,
    ) -> None:
        self.api = api
        self.experiment_id = experiment_id
        self.out = out
        self.logs = logs and not quiet
        self.quiet = quiet
        self.state = ""
        self.trial_states: dict[int, str] = {}
        self.last_log: dict[int, int] = {}
        self.ended_polls: dict[int, int] = {}  # trial id -> polls seen ended
        self.last_progress = ""
        self.progress_at = -float("inf")

    def run(self, timeout: float | None = None) -> api_pb2.GetExperimentResponse:
        """Poll until the experiment is COMPLETED, CANCELED or ERROR; its last answer."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            response = self.api.get_experiment(self.experiment_id)
            state = experiment_state(response.experiment.state)
            finished = state in TERMINAL_EXPERIMENT_STATES
            if state != self.state and not finished and self.logs:
                self.out(f"experiment {self.experiment_id}: {state}")
            self.state = state
            self._trials(response.trials, metric_name(struct(response.experiment.config)))
            if finished:
                if self.logs:
                    self._drain(response.trials)
                return response
            self._progress(response)
            if deadline is not None and time.monotonic() >= deadline:
                raise AssayError(
                    f"experiment {self.experiment_id} is still {state} after {timeout:g} s"
                )
            pause = poll_seconds()
            if deadline is not None:
                pause = min(pause, deadline - time.monotonic())
            time.sleep(max(0.0, pause))

    def _trials(self, trials: Sequence[common_pb2.Trial], metric: str) -> None:
        for t in sorted(trials, key=lambda t: t.id):
            state = trial_state(t.state)
            changed = self.trial_states.get(t.id) != state
            self.trial_states[t.id] = state
            ended = state in TERMINAL_TRIAL_STATES
            if not self.logs:
                continue
            if changed and not ended:
                self.out(f"trial {t.id}: {state}")
            if self.ended_polls.get(t.id, 0) < _DRAIN_POLLS:
                self._print_logs(t.id)
            if ended:
                self.ended_polls[t.id] = self.ended_polls.get(t.id, 0) + 1
                if changed:
                    self.out(_trial_end(t, metric))

    def _drain(self, trials: Sequence[common_pb2.Trial]) -> None:
        """Once more for every trial: lines that arrived after its state did."""
        for t in sorted(trials, key=lambda t: t.id):
            self._print_logs(t.id)

    def _print_logs(self, trial_id: int) -> None:
        for line in self.api.stream_trial_logs(trial_id, after_id=self.last_log.get(trial_id, 0)):
            self.out(f"[trial {trial_id} rank {line.rank}] {line.message.rstrip(chr(10))}")
            self.last_log[trial_id] = max(self.last_log.get(trial_id, 0), line.id)

    def _progress(self, response: api_pb2.GetExperimentResponse) -> None:
        if self.quiet:
            return
        text = progress_line(response)
        now = time.monotonic()
        if text != self.last_progress and now - self.progress_at >= progress_seconds():
            self.out(f"experiment {self.experiment_id}: {text}")
            self.last_progress, self.progress_at = text, now


def summarize(api: Client, response: api_pb2.GetExperimentResponse) -> Summary:
    """The summary of an ended experiment: its best trial and that trial's checkpoint
    with the best validation of the searcher's metric."""
    config = struct(response.experiment.config)
    metric = metric_name(config)
    summary = Summary(
        experiment_id=response.experiment.id,
        state=experiment_state(response.experiment.state),
        metric=metric,
        errors={
            t.id: t.last_error
            for t in response.trials
            if trial_state(t.state) == "ERROR" and t.last_error
        },
    )
    best = best_trial(response.trials, config)
    if best is None:
        return summary
    summary.best_validation = best["best_validation"]
    summary.best_trial = best["id"]
    smaller = searcher_objective(config)[1]
    kept = [
        c
        for c in api.list_checkpoints(response.experiment.id, best["id"])
        if checkpoint_state(c.state) != "DELETED"
    ]
    scored = [c for c in kept if metric in c.validation_metrics]
    if scored:
        sign = 1.0 if smaller else -1.0
        chosen = min(scored, key=lambda c: sign * c.validation_metrics[metric])
        summary.best_checkpoint = chosen.uuid
        summary.best_checkpoint_validation = chosen.validation_metrics[metric]
    elif kept:
        summary.best_checkpoint = max(kept, key=lambda c: c.total_batches).uuid
    return summary
