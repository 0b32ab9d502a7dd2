"""The snapshot of agents and queue the read-only RPCs show, taken from the
interpreter's memory (the caller holds the master's lock)."""

from __future__ import annotations

from dataclasses import replace

from assay.master._interpreter import Interpreter
from assay.master.fleet import ClusterView
from assay.master.fleet import cluster_view as fleet_view


def cluster_view(cluster_id: str, it: Interpreter) -> ClusterView:
    """The agents, placements and queue, the queue in the order the last scheduling
    round considered it (trials queued since, after), each request with its pool's slot
    type."""
    order = {trial_id: i for i, trial_id in enumerate(it.waiting)}
    queue = sorted(it.queued.values(), key=lambda r: (order.get(int(r.id), len(order)), r.rank))
    waits = {t: (w.kind, w.message) for t, w in it.waiting.items()}
    scheduler, fleet = it.scheduler, it.fleet
    kinds = {name: fleet.slot_type(name) for name in scheduler.names}
    queue = [
        replace(r, slot_type=kinds.get(r.pool or scheduler.default, r.slot_type)) for r in queue
    ]
    return fleet_view(
        cluster_id,
        fleet.slot_type(),
        fleet.agents.values(),
        scheduler.allocations,
        it.run_of_trial,
        [(r, it.trials[int(r.id)]) for r in queue],
        {e.id: e.config.name for e in it.experiments.values()},
        it.unplaceable,
        [(s.name, s.description, s.scheduler) for s in scheduler.specs.values()],
        scheduler.default,
        waits,
    )
