"""`LogWatch`: an experiment's `log_policies` searched for in every line its runs write.

Lines are searched as they arrive (secrets masked, as stored), and the first line from
each agent that a policy matches is kept on the run (`Run.log_matches`); what the
matches do is decided when the run ends (`lifecycle.log_policy.matched`). Patterns are
the user's, so each search runs with the `regex` module under a time limit
(`LINE_TIMEOUT_S`): a pattern that backtracks without end costs a line, not the master.
A line that takes longer is not matched, and the master's log says so once per policy.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from assay.config import LogPolicy
from assay.master.lifecycle import ExperimentState, Run
from assay.master.store import LogLine

log = logging.getLogger("assay.master")

LINE_TIMEOUT_S = 0.05
# A matching line is kept (for the trial's log and last_error) up to this many characters.
SHOWN_CHARS = 300


class LogWatch:
    """The compiled policies of one experiment."""

    def __init__(self, experiment_id: int, policies: Sequence[LogPolicy]) -> None:
        import regex

        self.experiment_id = experiment_id
        self.policies = tuple(policies)
        self._compiled: list[Any] = [regex.compile(p.pattern) for p in self.policies]
        self._slow: set[int] = set()  # policies whose slowness the log has told

    def scan(self, run: Run, agent_id: str, lines: Iterable[str]) -> None:
        """Record in `run.log_matches` the first line from `agent_id` each policy matches."""
        for i, pattern in enumerate(self._compiled):
            if (i, agent_id) in run.log_matches:
                continue
            for line in lines:
                if self._search(i, pattern, line):
                    run.log_matches[(i, agent_id)] = line[:SHOWN_CHARS]
                    break

    def _search(self, i: int, pattern: Any, line: str) -> bool:
        try:
            return pattern.search(line, timeout=LINE_TIMEOUT_S, concurrent=True) is not None
        except TimeoutError:
            if i not in self._slow:
                self._slow.add(i)
                log.warning(
                    "experiment %d: %s took over %g s on a log line; lines that slow are "
                    "not matched",
                    self.experiment_id,
                    self.policies[i].label,
                    LINE_TIMEOUT_S,
                )
            return False


class LogWatches:
    """The `LogWatch` of each live experiment with log policies, made when the first
    lines of one of its runs arrive (read without the master's lock: a policy compiled
    twice by two threads at once is only compiled twice)."""

    def __init__(self, experiments: Mapping[int, ExperimentState]) -> None:
        self._experiments = experiments
        self._watches: dict[int, LogWatch] = {}

    def scan(self, run: Run, agent_id: str, lines: Sequence[LogLine]) -> None:
        experiment = self._experiments.get(run.experiment_id)
        if experiment is None or not experiment.config.log_policies:
            return
        policies = experiment.config.log_policies
        watch = self._watches.get(experiment.id)
        if watch is None or watch.policies != policies:
            for gone in [e for e in self._watches if e not in self._experiments]:
                self._watches.pop(gone, None)
            watch = self._watches[experiment.id] = LogWatch(experiment.id, policies)
        watch.scan(run, agent_id, [line.message for line in lines])


__all__ = ["LINE_TIMEOUT_S", "LogWatch", "LogWatches"]
