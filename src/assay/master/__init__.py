"""The Assay master daemon (`assay-master`): API servers, state machines, searchers, store.

The root holds the shell: the process (`main`, `_server`, `_aio`, `_store_owner`), its
settings (`_config`), the entry points under one lock with the group commit (`_core`,
`_commit`, `_cluster_view`), the memory and the interpreter that applies the lifecycles'
decisions to it (`_state`, `_interpreter`, `_changes`, `_followups`), and the domain
errors (`errors`). Everything else is a package that owns one part and exports it from
its `__init__`:

- `api`: the gRPC servicers, the HTTP routes, the OpenAPI document, the web UI's files;
- `wire`: store records and the agents' values as protobuf messages;
- `auth`: users, logins, the guard in front of every RPC, roles, secrets;
- `fleet`: the agents, the resource pools and which workspaces may use them;
- `sharing`: the scheduler's limits, fair-share and priority preemption;
- `submission`: a submission's checks, uploads, quotas, continue, custom search;
- `checkpoints`: garbage collection, deletion, the storage policy;
- `telemetry`: counters, Prometheus, usage, trial logs and reports;
- `lifecycle`: the decisions as pure code, and what they order agents to do;
- `scheduler`, `searcher`: the pure slot scheduler and the hyperparameter searchers;
- `store`: the database.

The API stands above the shell's entry points (`Master`), which stand above every
other package; a package never imports the shell.
"""
