"""What the lines of a run that matched the experiment's `log_policies` do when the run
ends (`run.finish_run` reads them). The master's `LogWatch` finds the matches as the
lines arrive (`Run.log_matches`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from assay.config import LogPolicy
from assay.master.lifecycle._model import Run


@dataclass(frozen=True)
class Matched:
    """What a run's matching lines do: the policy that cancels its retries (with the
    line), and the agents its trial's next runs avoid (each with why)."""

    cancel: str | None = None
    exclude: tuple[tuple[str, str], ...] = ()


def matched(run: Run, policies: Sequence[LogPolicy]) -> Matched:
    """The effect of `run.log_matches` under `policies` (the experiment's, in order)."""
    cancel: str | None = None
    exclude: dict[str, str] = {}
    for (index, agent_id), line in sorted(run.log_matches.items()):
        if index >= len(policies):
            continue
        policy = policies[index]
        said = f"{policy.label} matched a line from {agent_id}: {line}"
        if "cancel_retries" in policy.actions and cancel is None:
            cancel = said
        if "exclude_node" in policy.actions:
            exclude.setdefault(agent_id, said)
    return Matched(cancel, tuple(sorted(exclude.items())))


__all__ = ["Matched", "matched"]
