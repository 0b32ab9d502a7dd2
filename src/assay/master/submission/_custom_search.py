"""The master's side of a custom search (`searcher.name: custom`): the two calls of its
runner, under the master's lock.

`searcher_events` reads the events queued for the runner after an event id, with the
state the runner saved with its last batch; `post_operations` checks a batch of
operations whole (`CustomSearcher.apply`), carries it out as any searcher's operations
are (`Interpreter.search`, which records the searcher's snapshot with them) and returns
once that is committed. The roles are the servicer's question.

A custom search creates trials when its runner says so, as many as it says: the master's
`custom_search_trials` caps them (`check_trial_cap`, `check_config_cap`), whatever the
config's `searcher.max_trials`, so that one call cannot queue 30,000 trials.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from assay.master.errors import ConflictError, InvalidArgumentError, ResourceExhaustedError
from assay.master.lifecycle import ExperimentStatus
from assay.master.lifecycle import effects as fx
from assay.master.searcher import (
    Close,
    Create,
    CustomSearcher,
    Operation,
    OperationsError,
    Shutdown,
    ValidateAfter,
)
from assay.proto import api_pb2

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from assay.config import ExperimentConfig
    from assay.master.lifecycle import ExperimentState
    from assay.master.store import Store


class _Commit(Protocol):
    def flush(self, timeout: float | None = None) -> None: ...


class _Interpreter(Protocol):
    def search(self, experiment: ExperimentState, ops: Sequence[Operation]) -> None: ...

    def do(self, effects: Iterable[fx.Effect]) -> None: ...

    def schedule(self) -> None: ...


class Shell(Protocol):
    """What a custom search's calls use of the master (`Master`): its lock, memory and
    interpreter, the store, and the group commit."""

    @property
    def lock(self) -> AbstractContextManager[Any]: ...

    @property
    def experiments(self) -> Mapping[int, ExperimentState]: ...

    @property
    def store(self) -> Store: ...

    @property
    def commit(self) -> _Commit: ...

    @property
    def interpreter(self) -> _Interpreter: ...

    def commit_and_wait(self) -> None: ...


CAP_SETTING = "custom_search_trials"


@dataclass(frozen=True)
class SearcherView:
    """What a runner reads: the events after the one it asked from, and where the
    search stands."""

    experiment_state: str
    events: list[dict[str, Any]] = field(default_factory=list)
    acknowledged: int = 0
    method_state: bytes = b""
    shutdown: bool = False


def _custom(searcher: Any, experiment_id: int) -> CustomSearcher:
    if not isinstance(searcher, CustomSearcher):
        raise InvalidArgumentError(
            f"experiment {experiment_id} does not use the custom searcher (searcher.name: "
            "custom): its searcher takes no operations from user code"
        )
    return searcher


def searcher_events(master: Shell, experiment_id: int, after: int) -> SearcherView:
    with master.lock:
        experiment = master.experiments.get(experiment_id)
        if experiment is not None:
            searcher = _custom(experiment.searcher, experiment_id)
            return SearcherView(
                experiment_state=str(experiment.state),
                events=searcher.events_after(after),
                acknowledged=searcher.acknowledged,
                method_state=searcher.method_state,
                shutdown=searcher.shutdown,
            )
    # Ended (or none): the stored snapshot says how far it went; nothing is left to answer.
    master.commit.flush()
    record = master.store.get_experiment(experiment_id)  # NotFoundError: none
    saved: Mapping[str, Any] = (record.searcher_state or {}).get("searcher") or {}
    if saved.get("searcher") != "custom":
        _custom(None, experiment_id)
    return SearcherView(
        experiment_state=str(record.state),
        acknowledged=int(saved.get("acknowledged", 0)),
        method_state=base64.b64decode(saved.get("method_state", "")),
        shutdown=bool(saved.get("shutdown", False)),
    )


def post_operations(
    master: Shell,
    experiment_id: int,
    triggered_by: int,
    ops: Sequence[Operation],
    *,
    method_state: bytes,
    progress: float | None,
    cap: int,
) -> int:
    """Apply a runner's batch; return the last event it answered."""
    with master.lock:
        experiment = master.experiments.get(experiment_id)
        if experiment is None:
            master.store.get_experiment(experiment_id)  # NotFoundError: none
            raise ConflictError(
                f"experiment {experiment_id} has ended: its search takes no more operations"
            )
        searcher = _custom(experiment.searcher, experiment_id)
        if experiment.state not in (ExperimentStatus.ACTIVE, ExperimentStatus.PAUSED):
            raise ConflictError(
                f"experiment {experiment_id} is {experiment.state.lower()}: its search takes "
                "no more operations"
            )
        check_trial_cap(experiment_id, len(searcher.trials), ops, cap)
        try:
            carried = searcher.apply(
                triggered_by, ops, method_state=method_state, progress=progress
            )
        except OperationsError as e:
            raise InvalidArgumentError(f"experiment {experiment_id}: {e}") from None
        master.interpreter.search(experiment, carried)
        # A Shutdown after the last trial ended ends the experiment now.
        master.interpreter.do([fx.Settle(experiment_id)])
        master.interpreter.schedule()
        master.commit_and_wait()
        return searcher.acknowledged


def check_trial_cap(experiment_id: int, created: int, ops: Sequence[Operation], cap: int) -> None:
    """`ResourceExhaustedError` if the batch's Creates would take the search past `cap`
    trials (0: no cap); `created`: how many it has created so far."""
    adding = sum(1 for op in ops if isinstance(op, Create))
    if cap and created + adding > cap:
        raise ResourceExhaustedError(
            f"experiment {experiment_id}: {adding} more trials would make "
            f"{created + adding}, past the master's limit of {cap} trials per custom search "
            f"({CAP_SETTING}); create at most {max(0, cap - created)} more, or ask an "
            f"administrator to raise {CAP_SETTING}"
        )


def check_config_cap(config: ExperimentConfig, cap: int) -> None:
    """`ResourceExhaustedError` for a custom search whose `searcher.max_trials` is past
    the master's cap (0: no cap): it would be refused trials it was promised."""
    searcher = config.searcher
    if searcher.name != "custom" or not cap:
        return
    if searcher.max_trials is not None and searcher.max_trials > cap:
        raise ResourceExhaustedError(
            f"searcher.max_trials: {searcher.max_trials} is past the master's limit of {cap} "
            f"trials per custom search ({CAP_SETTING}); give at most {cap}, or ask an "
            f"administrator to raise {CAP_SETTING}"
        )


# --- the wire ------------------------------------------------------------------------------


def events_response(view: SearcherView) -> api_pb2.GetSearcherEventsResponse:
    return api_pb2.GetSearcherEventsResponse(
        events=[
            api_pb2.SearcherEvent(
                id=int(e["id"]),
                kind=str(e["kind"]),
                request_id=str(e.get("request_id", "")),
                metric=float(e.get("metric", 0.0)),  # "nan", "inf" and "-inf" as floats
                length=int(e.get("length", 0)),
                exited_reason=str(e.get("reason", "")),
            )
            for e in view.events
        ],
        acknowledged_event_id=view.acknowledged,
        method_state=view.method_state,
        shutdown=view.shutdown,
        experiment_state=view.experiment_state,
    )


def operations_of(request: api_pb2.PostSearcherOperationsRequest) -> list[Operation]:
    """The request's operations; `InvalidArgumentError` for one that cannot be read."""
    ops: list[Operation] = []
    for i, op in enumerate(request.operations):
        kind = op.WhichOneof("operation")
        where = f"operation {i + 1}"
        if kind == "create":
            try:
                hparams = json.loads(op.create.hparams_json or "{}")
            except json.JSONDecodeError as e:
                raise InvalidArgumentError(
                    f"{where} (Create): hparams_json is not JSON ({e})"
                ) from None
            if not isinstance(hparams, dict):
                raise InvalidArgumentError(
                    f"{where} (Create): hparams_json must be a JSON object of hyperparameters"
                )
            seed = op.create.seed if op.create.HasField("seed") else -1
            if op.create.HasField("seed") and not 0 <= seed < 2**31:
                raise InvalidArgumentError(
                    f"{where} (Create): seed must be from 0 to 2**31 - 1, got {seed}"
                )
            ops.append(Create(op.create.request_id, hparams, seed))
        elif kind == "validate_after":
            ops.append(ValidateAfter(op.validate_after.request_id, op.validate_after.length))
        elif kind == "close":
            ops.append(Close(op.close.request_id))
        elif kind == "shutdown":
            ops.append(Shutdown())
        else:
            raise InvalidArgumentError(f"{where}: names no operation")
    return ops
