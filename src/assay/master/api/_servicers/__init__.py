"""The public API's gRPC handlers: parse, call the master, reply. Errors map to status
in `_status`.

One module per kind of RPC, each a group of handlers on the shared `ServicerBase`
(`_base`: the master, its store, roles, and who is calling):

- `_users`: login, logout, users, passwords, usage
- `_submissions`: CreateExperiment and CreateExperimentStream
- `_experiments`: reading, listing, steering, editing and deleting experiments
- `_searcher`: a custom searcher's events and operations
- `_trials`: trials, their metrics and streamed logs
- `_registry`: checkpoints, models and model versions
- `_workspaces`: workspaces, members, projects, templates
- `_cluster`: the master's info, agents, the queue, resource pools

The other two services have a module each: `_agent` (AgentService: the agents' streams)
and `_trial` (TrialService: the harness's calls from inside a trial).
"""

from __future__ import annotations

from assay.master.api._servicers._agent import AgentServicer
from assay.master.api._servicers._cluster import ClusterRpcs
from assay.master.api._servicers._experiments import ExperimentRpcs
from assay.master.api._servicers._registry import RegistryRpcs
from assay.master.api._servicers._searcher import SearcherRpcs
from assay.master.api._servicers._submissions import SubmissionRpcs
from assay.master.api._servicers._trial import TrialServicer
from assay.master.api._servicers._trials import TrialRpcs
from assay.master.api._servicers._users import UserRpcs
from assay.master.api._servicers._workspaces import WorkspaceRpcs


class ApiServicer(
    UserRpcs,
    SubmissionRpcs,
    ExperimentRpcs,
    SearcherRpcs,
    TrialRpcs,
    RegistryRpcs,
    WorkspaceRpcs,
    ClusterRpcs,
):
    """The public API; plain methods run on `pool` (see _aio.SyncAdapter)."""


__all__ = ["AgentServicer", "ApiServicer", "TrialServicer"]
