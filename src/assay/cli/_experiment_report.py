"""How `assay experiment describe` shows an experiment: its summary, its trials (with
lineage, what they wait for and why they failed) and, for a multi-objective search, its
Pareto front; as text, or as the one JSON object of `--json`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from assay.client import best_trial, experiment_seed, metric, struct, trial_state

from . import _format as fmt

if TYPE_CHECKING:
    from assay.proto import api_pb2, common_pb2


def as_dict(response: api_pb2.GetExperimentResponse) -> dict[str, Any]:
    """`describe --json`: the experiment, its config and trials, and its Pareto front."""
    return {**fmt.experiment_detail(response), **_pareto_dict(response)}


def as_text(response: api_pb2.GetExperimentResponse) -> str:
    """`describe`: the summary's fields, the trials' table, then a line for each trial
    that started from another's checkpoint, waits, or failed; the Pareto front last."""
    e = fmt.experiment_summary(response.experiment)
    config = struct(response.experiment.config)
    best = best_trial(response.trials, config)
    fields = [
        ("ID", e["id"]),
        ("Name", e["name"]),
        ("State", e["state"] + (" (archived)" if e["archived"] else "")),
        ("Searcher", e["searcher"] or None),
        ("Seed", seed_text(response.experiment)),
        ("Progress", fmt.progress(e["state"], e["progress"])),
        ("Best validation", metric(e["best_validation"])),
        ("Best trial", best["id"] if best else None),
        ("Owner", e["owner"] or None),
        ("Project", filed(response.experiment)),
        ("Labels", ", ".join(e["labels"]) or None),
        ("Started", e["start_time"]),
        ("Ended", e["end_time"]),
        ("Slot-hours", f"{response.slot_seconds / 3600:.2f}"),
    ]
    lines = [f"{key + ':':17}{'-' if value is None else value}" for key, value in fields]
    lines += ["", fmt.trial_rows(list(response.trials), config)]
    lines += [
        f"trial {t.id} copies trial {t.parent_trial_id} (round {t.search_round}): its latest "
        "checkpoint, when it left one (the trial's log says), and its hyperparameters, explored"
        for t in response.trials
        if t.HasField("parent_trial_id")
    ]
    lines += [f"trial {t.id} cannot start: {t.waiting}" for t in response.trials if t.waiting]
    lines += _failure_lines(response.trials)
    if response.objectives:
        lines += ["", _pareto_table(response)]
    return "\n".join(lines)


def seed_text(e: common_pb2.Experiment) -> str:
    """`reproducibility.experiment_seed`, and whether the master drew it (its config as
    submitted sets none)."""
    import yaml

    from assay.config import seed_is_set

    seed = str(experiment_seed(struct(e.config)))
    written = yaml.safe_load(e.config_yaml) if e.config_yaml else None
    if isinstance(written, dict) and not seed_is_set(written):
        return f"{seed} (drawn by the master; `experiment fork --reproduce` keeps it)"
    return seed


def filed(found: Any) -> str | None:
    """WORKSPACE/PROJECT, or None from a master that files nothing."""
    return f"{found.workspace}/{found.project}" if found.project else None


def _failure_lines(trials: Sequence[common_pb2.Trial]) -> list[str]:
    """Why trials ended in ERROR, one line per cause: `trials 3, 4 failed: run 1: ...`
    (a traceback by its last line), so that a search whose trials all fail the same way
    says it once."""
    causes: dict[str, list[int]] = {}
    for t in trials:
        if trial_state(t.state) != "ERROR":
            continue
        error = t.last_error.strip()
        causes.setdefault(error.splitlines()[-1].strip() if error else "", []).append(t.id)
    lines = []
    for cause, ids in causes.items():
        which = f"trial {ids[0]}" if len(ids) == 1 else f"trials {', '.join(map(str, ids[:5]))}"
        if len(ids) > 5:
            which += f" and {len(ids) - 5} more"
        if cause:
            lines.append(f"{which} failed: {cause} (see assay trial logs {ids[0]})")
        else:
            lines.append(f"{which} failed with no error recorded (see assay trial logs {ids[0]})")
    return lines


def _pareto_dict(response: api_pb2.GetExperimentResponse) -> dict[str, Any]:
    """A multi-objective experiment's metrics and points (NaN as null); {} otherwise."""
    if not response.objectives:
        return {}
    return {
        "objectives": [
            {"name": o.name, "smaller_is_better": o.smaller_is_better} for o in response.objectives
        ],
        "pareto_front": [p.trial_id for p in response.pareto_points if p.on_front],
        "pareto_points": [
            {
                "trial_id": p.trial_id,
                "total_batches": p.total_batches,
                "values": [v if math.isfinite(v) else None for v in p.values],
                "rank": p.rank,
                "on_front": p.on_front,
            }
            for p in response.pareto_points
        ],
    }


def _pareto_table(response: api_pb2.GetExperimentResponse) -> str:
    """The trials' final validation vectors, the Pareto front (*) first."""
    arrows = ", ".join(
        f"{o.name} {'lower' if o.smaller_is_better else 'higher'} is better"
        for o in response.objectives
    )
    front = [p.trial_id for p in response.pareto_points if p.on_front]
    head = f"Pareto front ({arrows}): " + (
        ", ".join(f"trial {t}" for t in front) if front else "no trial has validated yet"
    )
    points = sorted(response.pareto_points, key=lambda p: (p.rank, p.trial_id))
    headers = ["", "TRIAL", *[o.name.upper() for o in response.objectives], "RANK", "BATCHES"]
    rows = [
        [
            "*" if p.on_front else "",
            str(p.trial_id),
            *[metric(v) if math.isfinite(v) else "-" for v in p.values],
            str(p.rank),
            str(p.total_batches),
        ]
        for p in points
    ]
    return head + ("\n" + fmt.table(headers, rows) if rows else "")
