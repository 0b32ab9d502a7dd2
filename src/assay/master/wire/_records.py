"""Store records -> proto messages (the one API definition, also behind the JSON API).

Configs and hyperparameters leave with their secrets masked (see `_secrets`): these
messages are what every user reads. A stored row is shown as far as it can be: a value
no client could read back (nested deeper than a new config may be, a number a double
cannot hold, NaN) is shown as text, so that one row never breaks a list.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from google.protobuf.struct_pb2 import Struct
from google.protobuf.timestamp_pb2 import Timestamp

from assay.config import MAX_CONFIG_DEPTH, ExperimentConfig
from assay.master.auth import masked
from assay.master.store import CheckpointRecord, ExperimentRecord, LogLine, TrialRecord
from assay.proto import common_pb2

log = logging.getLogger("assay.master")
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
# What a config accepted today may be; protobuf readers refuse messages nested 100 deep,
# and each level of a Struct is three of theirs, so deeper values are shown as `_CUT`.
_SHOWN_DEPTH = MAX_CONFIG_DEPTH
_CUT = "<nested too deep to show>"
_LARGEST_INT = 2**63  # beyond: shown as text (a double would round it, or overflow)


def timestamp(value: dt.datetime | None) -> Timestamp | None:
    """`value` (naive: UTC) as a Timestamp; what `Timestamp.FromDatetime` gives, without
    its time-tuple round trip (every record in every answer has two or three)."""
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    since = value - _EPOCH
    return Timestamp(seconds=since.days * 86_400 + since.seconds, nanos=since.microseconds * 1000)


def experiment(
    record: ExperimentRecord,
    *,
    num_trials: int = 0,
    best: float | None = None,
    parsed: ExperimentConfig | None = None,
) -> common_pb2.Experiment:
    """`parsed`: the config `record.config` was made from, when the caller has it (a
    submission just checked): its masked form is built once per parsed config."""
    message = common_pb2.Experiment(
        id=record.id,
        name=record.name,
        description=record.description,
        owner=record.owner,
        state=common_pb2.ExperimentState.Value(f"EXPERIMENT_STATE_{record.state}"),
        labels=list(record.labels),
        priority=record.priority,
        progress=_progress(record),
        archived=record.archived,
        searcher=str(record.config.get("searcher", {}).get("name", "")),
        num_trials=num_trials,
        start_time=timestamp(record.start_time),
        end_time=timestamp(record.end_time),
    )
    if parsed is None:
        _fill(message.config, record.config, f"experiment {record.id}'s config")
    else:
        message.config.MergeFrom(config_struct(parsed))
    if best is not None:
        message.best_validation = best
    return message


# Parsed configs are remembered by the submission checks (`_submission.check_submission`)
# and are frozen: the same object comes back for a config submitted again, so its masked
# Struct is kept beside it, for as many configs as those checks remember.
_STRUCTS: OrderedDict[int, tuple[ExperimentConfig, Struct]] = OrderedDict()
_STRUCTS_KEPT = 256


_STRUCTS_LOCK = threading.Lock()


def config_struct(config: ExperimentConfig) -> Struct:
    """The masked config of a submission, as answers carry it (kept for the next answer);
    raises what converting it raises: the submission checks build it before the commit."""
    with _STRUCTS_LOCK:
        kept = _STRUCTS.get(id(config))
        if kept is not None and kept[0] is config:
            _STRUCTS.move_to_end(id(config))
            return kept[1]
    struct = Struct()
    struct.update(masked(_jsonable(dict(config.raw))))
    with _STRUCTS_LOCK:
        _STRUCTS[id(config)] = (config, struct)  # the config is held: its id is not reused
        while len(_STRUCTS) > _STRUCTS_KEPT:
            _STRUCTS.popitem(last=False)
    return struct


def _progress(record: ExperimentRecord) -> float:
    """1.0 means the experiment COMPLETED. A search that ended early (every trial failed,
    or it was canceled) may have spent its budget on paper; it shows at most 0.99."""
    if record.state == "COMPLETED":
        return 1.0
    return min(record.progress, 0.99)


def trial(record: TrialRecord) -> common_pb2.Trial:
    message = common_pb2.Trial(
        id=record.id,
        experiment_id=record.experiment_id,
        state=common_pb2.TrialState.Value(f"TRIAL_STATE_{record.state}"),
        seed=record.seed,
        run_id=record.run_id,
        restarts=record.restarts,
        total_batches=record.total_batches,
        latest_checkpoint=record.latest_checkpoint or "",
        last_error=record.last_error or "",
        start_time=timestamp(record.start_time),
        end_time=timestamp(record.end_time),
    )
    _fill(message.hparams, record.hparams, f"trial {record.id}'s hyperparameters")
    if record.best_validation is not None:
        message.best_validation = record.best_validation
    if record.parent_trial_id is not None:
        message.parent_trial_id = record.parent_trial_id
    if record.search_round is not None:
        message.search_round = record.search_round
    return message


def checkpoint(record: CheckpointRecord, experiment_id: int) -> common_pb2.Checkpoint:
    sha = dict(record.user_metadata.get("sha256", {}))
    message = common_pb2.Checkpoint(
        uuid=record.uuid,
        trial_id=record.trial_id,
        experiment_id=experiment_id,
        run_id=record.run_id,
        total_batches=record.total_batches,
        state=common_pb2.CheckpointState.Value(f"CHECKPOINT_STATE_{record.state}"),
        location=record.location,
        files=[
            common_pb2.CheckpointFile(name=n, size_bytes=s, sha256=str(sha.get(n, "")))
            for n, s in sorted(record.files.items())
        ],
        validation_metrics={
            k: float(v) for k, v in dict(record.user_metadata.get("validation_metrics", {})).items()
        },
    )
    _fill(message.user_metadata, record.metadata, f"checkpoint {record.uuid}'s metadata")
    return message


def log_line(line: LogLine, trial_id: int) -> common_pb2.LogLine:
    return common_pb2.LogLine(
        id=line.id,
        trial_id=trial_id,
        run_id=line.run_id,
        rank=line.rank,
        stream=line.stream,
        level=line.level or "",
        timestamp=timestamp(line.timestamp),
        message=line.message,
    )


def _fill(struct: Struct, value: Mapping[str, Any], what: str) -> None:
    """`struct` holds `value`, masked, or (a stored row no conversion can show) nothing,
    with a line in the master's log: the rest of the message, and the list, still go."""
    try:
        struct.update(masked(_jsonable(value)))
    except Exception:
        log.exception("%s cannot be shown; it is left out of the answer", what)
        struct.Clear()


def _jsonable(value: Any, depth: int = 1) -> Any:
    """Struct holds JSON: tuples become lists; what a client could not read back (values
    nested deeper than `_SHOWN_DEPTH`, integers beyond 64 bits, NaN and infinities) is
    shown as text. Masking comes after: a value cut here is not looked into."""
    if isinstance(value, dict):
        if depth > _SHOWN_DEPTH:
            return _CUT
        return {str(k): _jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        if depth > _SHOWN_DEPTH:
            return _CUT
        return [_jsonable(v, depth + 1) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, int) and not -_LARGEST_INT <= value < _LARGEST_INT:
        return str(value)
    return value
