"""The API handlers' shared state and helpers: who is calling, what they may do."""

from __future__ import annotations

from concurrent import futures
from typing import Any

from assay.config import FILLED_BY_MASTER
from assay.master import wire
from assay.master._core import Master
from assay.master.auth import (
    EDITOR,
    Guard,
    Principal,
    Roles,
    caller,
    masked_config_text,
    metadata_dict,
)
from assay.master.errors import PermissionDeniedError
from assay.master.telemetry import FollowerLimit, MasterLogBuffer, objectives_of
from assay.proto import api_pb2_grpc, common_pb2


class ServicerBase(api_pb2_grpc.ApiServicer):
    """What every group of API handlers shares: the master, its store, the caller's
    roles, and who is calling. `ApiServicer` joins the groups into the one servicer."""

    def __init__(
        self,
        master: Master,
        pool: futures.Executor,
        guard: Guard,
        master_logs: MasterLogBuffer | None = None,
    ) -> None:
        """`master_logs`: the master's recent log, for StreamMasterLogs (None: not kept)."""
        self.master = master
        self.master_logs = master_logs
        self.store = master.store
        self.pool = pool
        self.guard = guard
        self.auth = guard.auth
        self.log_followers = FollowerLimit(master.config.log_followers_per_user)
        self._uploads: dict[str, int] = {}  # user -> CreateExperimentStream calls in flight
        self.roles = Roles(self.store)

    # --- who is calling -------------------------------------------------------------

    def _who(self, context: Any) -> Principal:
        """The caller: as the guard found it when it let the call in (looked up again
        only for a call that did not pass the guard)."""
        found = caller()
        if found is not None:
            return found
        return self.guard.principal(metadata_dict(context.invocation_metadata()))

    async def _who_async(self, context: Any) -> Principal:
        """`_who` for a handler on the event loop. A call the guard did not let in (a test
        calling the servicer) is the token's user, and a miss reads the store: off the loop."""
        found = caller()
        if found is not None:
            return found
        metadata = metadata_dict(context.invocation_metadata())
        return await self.guard.principal_async(metadata, self.pool)

    def _admin(self, context: Any, what: str) -> Principal:
        who = self._who(context)
        if not who.admin:
            raise PermissionDeniedError(f"only an administrator may {what}; {who.username} is not")
        return who

    def _may_read(self, context: Any, experiment_id: int) -> Principal:
        """The caller, if they may read the experiment (a viewer of its workspace)."""
        who = self._who(context)
        self.roles.experiment(who, experiment_id)
        return who

    def _may_change(self, who: Principal, experiment_id: int) -> None:
        """Editors of the experiment's workspace steer any of its experiments (see _roles)."""
        self.roles.experiment(who, experiment_id, EDITOR)

    def _experiment(self, experiment_id: int, *, with_text: bool = False) -> common_pb2.Experiment:
        """`with_text`: and the config as submitted (secrets masked), for one experiment's page."""
        record = self.store.get_experiment(experiment_id)
        trials = self.store.list_trials(experiment_id)
        bests = [t.best_validation for t in trials if t.best_validation is not None]
        smaller = bool(record.config.get("searcher", {}).get("smaller_is_better", True))
        if objectives := objectives_of(record.config):  # searcher.metrics: the first one's
            smaller = objectives[0].smaller_is_better
        best = (min(bests) if smaller else max(bests)) if bests else None
        message = wire.experiment(record, num_trials=len(trials), best=best)
        message.workspace, message.project = record.workspace, record.project
        # The reason GetExperiment gives its queued trials (and the CLI's describe shows).
        waiting = self.master.unplaceable
        message.waiting = next(
            (waiting[t.id] for t in trials if t.state == "QUEUED" and t.id in waiting), ""
        )
        text = self.store.get_config_text(experiment_id) if with_text else None
        if text is not None:
            shown = masked_config_text(text, record.config, filled=FILLED_BY_MASTER)
            message.config_yaml = shown or ""
        return message
