"""Tables for people, plain dicts for `--json`: every message the CLI shows goes through here.

Protobuf is imported inside the functions, so importing this module stays cheap.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from assay.client import (
    best_trial,
    checkpoint_state,
    experiment_seed,
    experiment_state,
    metric,
    percent,
    slot_type,
    struct,
    trial_state,
)

if TYPE_CHECKING:
    from google.protobuf.message import Message
    from google.protobuf.timestamp_pb2 import Timestamp

    from assay.proto import api_pb2, common_pb2


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Aligned columns, two spaces apart; `None` shows as `-`."""
    cells = [[("-" if v is None else str(v)) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    for row in cells:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)


def timestamp(message: Message, field: str) -> str | None:
    if not message.HasField(field):
        return None
    ts: Timestamp = getattr(message, field)
    return ts.ToDatetime().isoformat(timespec="seconds") + "Z"


def optional_float(message: Message, field: str) -> float | None:
    if not message.HasField(field):
        return None
    value: float = getattr(message, field)
    return value


def trial_dict(t: common_pb2.Trial) -> dict[str, Any]:
    return {
        "id": t.id,
        "state": trial_state(t.state),
        "hparams": struct(t.hparams),
        "total_batches": t.total_batches,
        "best_validation": optional_float(t, "best_validation"),
        "latest_checkpoint": t.latest_checkpoint or None,
        "restarts": t.restarts,
        "last_error": t.last_error or None,
        "waiting": t.waiting or None,
        # Lineage (pbt): the trial whose checkpoint it started from, and in which round.
        "parent_trial_id": t.parent_trial_id if t.HasField("parent_trial_id") else None,
        "search_round": t.search_round if t.HasField("search_round") else None,
    }


def trial_detail_dict(t: common_pb2.Trial) -> dict[str, Any]:
    return {
        **trial_dict(t),
        "experiment_id": t.experiment_id,
        "seed": t.seed,
        "run_id": t.run_id,
        "start_time": timestamp(t, "start_time"),
        "end_time": timestamp(t, "end_time"),
    }


def log_line_dict(line: common_pb2.LogLine) -> dict[str, Any]:
    return {
        "id": line.id,
        "trial_id": line.trial_id,
        "run_id": line.run_id,
        "rank": line.rank,
        "stream": line.stream,
        "level": line.level or None,
        "timestamp": timestamp(line, "timestamp"),
        "message": line.message.rstrip("\n"),
    }


def experiment_summary(e: common_pb2.Experiment) -> dict[str, Any]:
    return {
        "id": e.id,
        "name": e.name,
        "state": experiment_state(e.state),
        "owner": e.owner,
        "labels": list(e.labels),
        "searcher": e.searcher,
        "progress": e.progress,
        "num_trials": e.num_trials,
        "best_validation": optional_float(e, "best_validation"),
        "priority": e.priority,
        "archived": e.archived,
        "start_time": timestamp(e, "start_time"),
        "end_time": timestamp(e, "end_time"),
    }


def experiment_detail(response: api_pb2.GetExperimentResponse) -> dict[str, Any]:
    e = response.experiment
    config = struct(e.config)
    return {
        "id": e.id,
        "name": e.name,
        "state": experiment_state(e.state),
        "searcher": e.searcher,
        "progress": e.progress,
        "seed": experiment_seed(config),
        "config": config,
        "best_trial": best_trial(response.trials, config),
        "slot_hours": response.slot_seconds / 3600,
        "trials": [trial_dict(t) for t in response.trials],
    }


def searched_names(config: Mapping[str, Any]) -> set[str] | None:
    """The dotted names of the hyperparameters a search varies (not its constants);
    None when the config says nothing (then every hyperparameter is shown)."""
    space = config.get("hyperparameters")
    if not isinstance(space, Mapping):
        return None
    names: set[str] = set()

    def walk(prefix: str, node: Mapping[str, Any]) -> None:
        for key, value in node.items():
            name = f"{prefix}{key}"
            if isinstance(value, Mapping) and "type" in value:
                if value["type"] != "const":
                    names.add(name)
            elif isinstance(value, Mapping):
                walk(name + ".", value)

    walk("", space)
    return names


def _flat(hparams: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in hparams.items():
        if isinstance(value, Mapping):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def hparam_value(value: Any) -> str:
    """Numbers with 4 significant digits (`0.0003162`, `1.235e+05`); the rest as is."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def hparams_text(
    hparams: Mapping[str, Any], searched: set[str] | None = None, limit: int = 60
) -> str:
    """`lr=0.003162 n_filters=32`: the searched hyperparameters only, when known."""
    flat = _flat(hparams)
    shown = sorted(k for k in flat if searched is None or k in searched)
    text = " ".join(f"{k}={hparam_value(flat[k])}" for k in shown)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def trial_rows(trials: Sequence[common_pb2.Trial], config: Mapping[str, Any] | None = None) -> str:
    """The trials as a table; HPARAMS shows what the search varies (all of them when
    `config` is not given)."""
    searched = searched_names(config) if config is not None else None
    rows = []
    for t in trials:
        d = trial_dict(t)
        rows.append(
            [
                d["id"],
                d["state"],
                d["total_batches"],
                metric(d["best_validation"]),
                d["restarts"],
                d["latest_checkpoint"],
                hparams_text(d["hparams"], searched) or None,
            ]
        )
    headers = ["ID", "STATE", "BATCHES", "BEST", "RESTARTS", "CHECKPOINT", "HPARAMS"]
    return table(headers, rows)


def checkpoint_dict(c: common_pb2.Checkpoint) -> dict[str, Any]:
    return {
        "uuid": c.uuid,
        "experiment_id": c.experiment_id,
        "trial_id": c.trial_id,
        "run_id": c.run_id,
        "total_batches": c.total_batches,
        "state": checkpoint_state(c.state),
        "location": c.location,
        "size_bytes": sum(f.size_bytes for f in c.files),
        "files": [
            {"name": f.name, "size_bytes": f.size_bytes, "sha256": f.sha256} for f in c.files
        ],
        "validation_metrics": dict(sorted(c.validation_metrics.items())),
        "user_metadata": struct(c.user_metadata),
    }


def slot_dict(s: common_pb2.Slot) -> dict[str, Any]:
    busy = slot_busy(s)
    return {
        "agent_id": s.agent_id,
        "index": s.index,
        "type": slot_type(s.type),
        "enabled": s.enabled,
        "busy": busy,
        "allocation_id": s.allocation_id or None,
        "trial_id": s.trial_id if busy and s.trial_id else None,
    }


def pool_dict(p: api_pb2.ResourcePool) -> dict[str, Any]:
    return {
        "name": p.name,
        "description": p.description,
        "scheduler": p.scheduler,
        "default": p.default,
        "agents": list(p.agents),
        "slots": [
            {"type": slot_type(s.slot_type), "total": s.total, "used": s.used, "free": s.free}
            for s in p.slots
        ],
        "queued_trials": p.queued_trials,
        "workspaces": [binding_dict(b) for b in p.bindings],
    }


def binding_dict(b: api_pb2.PoolBinding) -> dict[str, Any]:
    return {"workspace": b.workspace, "from_settings": b.from_settings}


def slot_busy(s: common_pb2.Slot) -> bool:
    """Whether a trial holds the slot (its ids are shown only to who may see its trial)."""
    return s.busy or bool(s.allocation_id)


def agent_dict(a: common_pb2.Agent) -> dict[str, Any]:
    return {
        "id": a.id,
        "address": a.address,
        "slot_type": slot_type(a.slot_type),
        "connected": a.connected,
        "enabled": a.enabled,
        "draining": a.draining,
        "resource_pool": a.resource_pool,
        "agent_label": a.agent_label or None,
        "slots": len(a.slots),
        "used_slots": sum(1 for s in a.slots if slot_busy(s)),
        "devices": [
            {
                "index": d.index,
                "type": slot_type(d.type),
                "name": d.name,
                "uuid": d.uuid,
                "memory_bytes": d.memory_bytes,
                "utilization": d.utilization,
                "island": d.island,
            }
            for d in a.devices
        ],
        "memory_bytes": a.memory_bytes,
        "memory_used_fraction": a.memory_used_fraction,
        "cpu_utilization": a.cpu_utilization,
        "last_heartbeat": timestamp(a, "last_heartbeat"),
    }


def progress(state: str, fraction: float) -> str:
    """`45%`; only an experiment that COMPLETED shows 100%."""
    if state == "COMPLETED":
        return "100%"
    return percent(min(fraction, 0.99))
