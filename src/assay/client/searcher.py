"""Custom searchers: a search whose decisions are your Python code (`searcher.name: custom`).

Subclass `SearchMethod` (Determined's custom searcher interface) and give it to a
`RemoteSearchRunner`, which creates the experiment (or attaches to one) and drives it until
the search shuts down and the experiment ends:

    from assay.client import searcher

    class MySearch(searcher.SearchMethod):
        def initial_operations(self, state): ...            # the first trials
        def on_validation_completed(self, state, request_id, metric, train_length): ...
        def on_trial_exited_early(self, state, request_id, exited_reason): ...
        def progress(self, state): ...                      # 0..1

    searcher.RemoteSearchRunner(MySearch()).run("custom.yaml", "./model_dir")

Your code runs here, in your process, with your session (`assay.client.login`): never in
the master. The master queues the events of the experiment (a trial was created,
validated, closed, exited early) and the runner answers each batch of them with
operations (`Create`, `ValidateAfter`, `Close`, `Shutdown`), checked by the master and
applied whole or refused whole. With each batch the runner hands the master the state
`save_method_state` writes (at most 1 MiB), which the master persists with the
operations: if the master restarts, the runner reconnects and goes on; if the runner
stops, `run(experiment_id=...)` in a new process loads that state
(`load_method_state`) and answers the events from where the last batch left off. While
no runner is attached the experiment waits: its trials train the lengths they were
given, then pause.
"""

from __future__ import annotations

import base64
import json
import os
import tempfile
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from assay.errors import AssayError

from ._errors import MasterError

if TYPE_CHECKING:
    from ._session import ConfigSource, Session

MAX_METHOD_STATE = 1 << 20
"""The most bytes of saved state the master keeps for a runner (files and searcher state)."""
EXITED_REASONS = ("invalid_hp", "errored", "user_canceled")
_TERMINAL = ("COMPLETED", "CANCELED", "ERROR")
_RETRIED = ("UNAVAILABLE", "DEADLINE_EXCEEDED")


def _new_request_id() -> str:
    return str(uuid.uuid4())


@dataclass(frozen=True)
class Create:
    """Create a trial with `hparams` (a point of the config's hyperparameters; constants
    may be left out). Give it its first `ValidateAfter` in the same list. `seed`: the
    trial's seed (default: derived from the experiment seed)."""

    request_id: str | uuid.UUID = field(default_factory=_new_request_id)
    hparams: Mapping[str, Any] = field(default_factory=dict)
    seed: int | None = None


@dataclass(frozen=True)
class ValidateAfter:
    """Train the trial until it has trained `length` batches in all, then validate it
    (`on_validation_completed`). A trial that validated and has no new `ValidateAfter`
    pauses, checkpointed, and frees its slots until one comes."""

    request_id: str | uuid.UUID
    length: int


@dataclass(frozen=True)
class Close:
    """The trial is done: it stops for good (at its next validation if it is training)."""

    request_id: str | uuid.UUID


@dataclass(frozen=True)
class Shutdown:
    """The search is over: every trial still open is closed, and the experiment completes
    once they have stopped."""


Operation: TypeAlias = Create | ValidateAfter | Close | Shutdown


@dataclass
class SearcherState:
    """What the runner has seen of the search, passed to every `SearchMethod` call and
    saved with its state: the trials created and closed, those that exited early, and
    the length each trial last validated at."""

    trials_created: set[str] = field(default_factory=set)
    trials_closed: set[str] = field(default_factory=set)
    failures: set[str] = field(default_factory=set)
    trial_progress: dict[str, int] = field(default_factory=dict)
    last_event_id: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "trials_created": sorted(self.trials_created),
            "trials_closed": sorted(self.trials_closed),
            "failures": sorted(self.failures),
            "trial_progress": dict(self.trial_progress),
            "last_event_id": self.last_event_id,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SearcherState:
        return cls(
            set(data["trials_created"]),
            set(data["trials_closed"]),
            set(data["failures"]),
            {str(k): int(v) for k, v in data["trial_progress"].items()},
            int(data["last_event_id"]),
        )


class SearchMethod(ABC):
    """Your searcher: events in, operations out (Determined's `SearchMethod`).

    Each method gets the `SearcherState` and returns a list of operations (possibly
    empty). Request ids are strings (a `uuid.UUID` is taken as its string). Keep what
    you decide from in attributes and write it in `save_method_state`: a runner that
    restarts calls `load_method_state` and goes on from the last batch it handed in.
    """

    @abstractmethod
    def initial_operations(self, searcher_state: SearcherState) -> list[Operation]:
        """The first operations, once, when the search starts."""

    def on_trial_created(self, searcher_state: SearcherState, request_id: str) -> list[Operation]:
        """The master created the trial of a `Create`."""
        return []

    @abstractmethod
    def on_validation_completed(
        self, searcher_state: SearcherState, request_id: str, metric: float, train_length: int
    ) -> list[Operation]:
        """The trial reached the length of its `ValidateAfter` and validated: `metric` is
        the config's searcher metric (as reported; the direction is yours to apply)."""

    def on_trial_closed(self, searcher_state: SearcherState, request_id: str) -> list[Operation]:
        """A trial you closed has stopped."""
        return []

    @abstractmethod
    def on_trial_exited_early(
        self, searcher_state: SearcherState, request_id: str, exited_reason: str
    ) -> list[Operation]:
        """The trial stopped on its own: `exited_reason` is invalid_hp, errored or
        user_canceled."""

    @abstractmethod
    def progress(self, searcher_state: SearcherState) -> float:
        """How far the search is, 0 to 1 (shown as the experiment's progress)."""

    def save_method_state(self, path: Path) -> None:
        """Write your state as files in the directory `path` (at most 1 MiB in all);
        by default nothing is saved, and a restarted runner starts from a fresh object."""
        return None

    def load_method_state(self, path: Path) -> None:
        """Read the files `save_method_state` wrote in `path`."""
        return None


class RemoteSearchRunner:
    """Drives a `SearchMethod` against the master until its search ends.

    `session`: whose calls these are (default: the session of `assay.client.login`); the
    user needs the editor role in the experiment's workspace. `poll_seconds`: how often
    the master is asked for new events. `reconnect_timeout`: how long an unreachable
    master (a restart) is waited for before the runner gives up.
    """

    def __init__(
        self,
        search_method: SearchMethod,
        *,
        session: Session | None = None,
        poll_seconds: float = 0.5,
        reconnect_timeout: float = 600.0,
    ) -> None:
        self.search_method = search_method
        self._session = session
        self.poll_seconds = poll_seconds
        self.reconnect_timeout = reconnect_timeout
        self.state = SearcherState()
        self.experiment_id: int | None = None

    def run(
        self,
        config: ConfigSource | None = None,
        model_dir: str | os.PathLike[str] | None = None,
        *,
        experiment_id: int | None = None,
    ) -> int:
        """Create the experiment from `config` (whose searcher is `name: custom`) and
        `model_dir`, or attach to `experiment_id`, and answer its events until it ends;
        return its id. A batch the master refuses raises `InvalidRequestError` with the
        reason (the experiment waits for a runner that answers correctly)."""
        session = self._session or _default_session()
        if experiment_id is None:
            if config is None or model_dir is None:
                raise AssayError("give a config and a model directory, or experiment_id=")
            _check_custom(config)
            experiment_id = session.create_experiment(config, model_dir).id
        self.experiment_id = experiment_id
        view = self._retry(lambda: self._events(session, experiment_id, 0))
        self.state = SearcherState()
        if view.method_state:
            self._load(view.method_state)
        self.state.last_event_id = view.acknowledged_event_id
        while True:
            view = self._retry(
                lambda: self._events(session, experiment_id, self.state.last_event_id)
            )
            if view.experiment_state in _TERMINAL:
                return experiment_id
            if not view.events or view.experiment_state.startswith("STOPPING"):
                # Nothing new; or canceled or killed, its trials stopping: wait for the end.
                time.sleep(self.poll_seconds)
                continue
            ops: list[Operation] = []
            for event in view.events:
                ops += self._dispatch(event)
            last = view.events[-1].id
            self.state.last_event_id = last
            blob = self._save()
            progress = float(self.search_method.progress(self.state))
            self._post(session, experiment_id, last, ops, blob, progress)

    # --- one batch -----------------------------------------------------------------------

    def _dispatch(self, event: Any) -> list[Operation]:
        method, state, rid = self.search_method, self.state, event.request_id
        if event.kind == "initial_operations":
            ops = method.initial_operations(state)
        elif event.kind == "trial_created":
            state.trials_created.add(rid)
            ops = method.on_trial_created(state, rid)
        elif event.kind == "validation_completed":
            state.trial_progress[rid] = int(event.length)
            ops = method.on_validation_completed(state, rid, event.metric, int(event.length))
        elif event.kind == "trial_closed":
            state.trials_closed.add(rid)
            ops = method.on_trial_closed(state, rid)
        elif event.kind == "trial_exited_early":
            state.failures.add(rid)
            state.trials_closed.add(rid)
            ops = method.on_trial_exited_early(state, rid, event.exited_reason)
        else:
            raise AssayError(f"the master sent an event of unknown kind {event.kind!r}")
        if not isinstance(ops, list):
            raise AssayError(
                f"{type(method).__name__} answered {event.kind} with {ops!r}: return a list "
                "of operations (possibly empty)"
            )
        return ops

    def _post(
        self,
        session: Session,
        experiment_id: int,
        triggered_by: int,
        ops: list[Operation],
        blob: bytes,
        progress: float,
    ) -> None:
        from assay.proto import api_pb2

        request = api_pb2.PostSearcherOperationsRequest(
            experiment_id=experiment_id,
            triggered_by_event_id=triggered_by,
            operations=[_to_proto(op) for op in ops],
            method_state=blob,
            progress=min(max(progress, 0.0), 1.0),
        )

        attempted = False

        def post() -> None:
            nonlocal attempted
            if attempted:
                # The master may have applied the batch before it went away: ask it first.
                view = self._events(session, experiment_id, triggered_by)
                if view.acknowledged_event_id >= triggered_by:
                    return
            attempted = True
            session.api._unary("PostSearcherOperations", request)

        self._retry(post)

    def _events(self, session: Session, experiment_id: int, after: int) -> Any:
        from assay.proto import api_pb2

        request = api_pb2.GetSearcherEventsRequest(
            experiment_id=experiment_id, after_event_id=after
        )
        return session.api._unary("GetSearcherEvents", request)

    def _retry(self, call: Any) -> Any:
        """`call()`, again while the master cannot be reached (it restarts), up to
        `reconnect_timeout` seconds."""
        deadline = time.monotonic() + self.reconnect_timeout
        while True:
            try:
                return call()
            except MasterError as e:
                if e.code not in _RETRIED or time.monotonic() >= deadline:
                    raise
            time.sleep(self.poll_seconds)

    # --- the saved state -----------------------------------------------------------------

    def _save(self) -> bytes:
        with tempfile.TemporaryDirectory(prefix="assay-search-") as tmp:
            directory = Path(tmp)
            self.search_method.save_method_state(directory)
            files = {}
            for path in sorted(directory.rglob("*")):
                if path.is_file():
                    name = path.relative_to(directory).as_posix()
                    files[name] = base64.b64encode(path.read_bytes()).decode()
        blob = json.dumps({"searcher_state": self.state.to_json(), "files": files}).encode()
        if len(blob) > MAX_METHOD_STATE:
            raise AssayError(
                f"save_method_state wrote {len(blob):,} bytes (encoded), more than the "
                f"{MAX_METHOD_STATE:,} the master keeps; keep large state elsewhere and "
                "save where to find it"
            )
        return blob

    def _load(self, blob: bytes) -> None:
        saved = json.loads(blob)
        self.state = SearcherState.from_json(saved["searcher_state"])
        with tempfile.TemporaryDirectory(prefix="assay-search-") as tmp:
            directory = Path(tmp)
            for name, data in saved["files"].items():
                path = directory / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(base64.b64decode(data))
            self.search_method.load_method_state(directory)


def _plain_value(value: Any) -> Any:
    """A hyperparameter JSON cannot write as it is: a numpy or torch scalar (what a
    sampler built on numpy returns) as its Python number; anything else is refused with
    its name and type."""
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", 0) == 0:
        return item()
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(
        f"a hyperparameter of type {type(value).__name__} ({value!r}) cannot be sent: give "
        "numbers, strings, booleans, lists or dicts of them"
    )


def _to_proto(op: Operation) -> Any:
    from assay.proto import api_pb2

    if isinstance(op, Create):
        create = api_pb2.CreateTrialOperation(
            request_id=str(op.request_id),
            hparams_json=json.dumps(dict(op.hparams), default=_plain_value),
        )
        if op.seed is not None:
            create.seed = op.seed
        return api_pb2.SearcherOperation(create=create)
    if isinstance(op, ValidateAfter):
        return api_pb2.SearcherOperation(
            validate_after=api_pb2.ValidateAfterOperation(
                request_id=str(op.request_id), length=op.length
            )
        )
    if isinstance(op, Close):
        return api_pb2.SearcherOperation(
            close=api_pb2.CloseTrialOperation(request_id=str(op.request_id))
        )
    if isinstance(op, Shutdown):
        return api_pb2.SearcherOperation(shutdown=api_pb2.ShutdownOperation())
    raise AssayError(
        f"{op!r} is not an operation: return Create, ValidateAfter, Close or Shutdown "
        "(from assay.client.searcher)"
    )


def _check_custom(config: ConfigSource) -> None:
    import yaml

    if isinstance(config, Mapping):
        data: Any = config
    elif Path(config).is_file():
        data = yaml.safe_load(Path(config).read_text())
    else:
        return  # create_experiment says the file is missing
    name = (data or {}).get("searcher", {}).get("name") if isinstance(data, Mapping) else None
    if name != "custom":
        raise AssayError(
            f"searcher.name is {name!r}: a RemoteSearchRunner drives a custom search; set "
            "searcher.name: custom"
        )


def _default_session() -> Session:
    from ._session import _session

    return _session()


__all__ = [
    "EXITED_REASONS",
    "MAX_METHOD_STATE",
    "Close",
    "Create",
    "Operation",
    "RemoteSearchRunner",
    "SearchMethod",
    "SearcherState",
    "Shutdown",
    "ValidateAfter",
]
