"""`assay job` (`j`): the queue of trials waiting for slots, and why each waits."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from assay.client import slot_type

from . import _format as fmt
from ._common import AliasedGroup, client, echo_json, user_errors

if TYPE_CHECKING:
    from assay.proto import api_pb2


@click.group("job", cls=AliasedGroup)
def job() -> None:
    """The trials waiting for slots."""


def queued_dict(q: api_pb2.QueuedTrial) -> dict[str, Any]:
    return {
        "position": q.position,
        "trial_id": q.trial_id,
        "experiment_id": q.experiment_id,
        "experiment_name": q.experiment_name,
        "resource_pool": q.resource_pool,
        "priority": q.priority,
        "slots": q.slots,
        "slot_type": slot_type(q.slot_type),
        "wait_kind": q.wait_kind,
        "waiting": q.waiting or q.reason,
    }


@job.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@user_errors
def job_list_command(as_json: bool) -> None:
    """List queued trials in the order the scheduler places them (per resource pool),
    each with why it waits: quota, max_slots, fair share, priority, or slots."""
    jobs = [queued_dict(q) for q in client().get_queue()]
    if as_json:
        echo_json(jobs)
        return
    if not jobs:
        click.echo("no trials are waiting for slots")
        return
    rows = [
        [
            j["position"] or None,
            j["trial_id"],
            f"{j['experiment_id']} {j['experiment_name']}".strip(),
            j["resource_pool"] or None,
            j["priority"],
            f"{j['slots']} {j['slot_type']}",
            j["wait_kind"] or None,
            j["waiting"] or None,
        ]
        for j in jobs
    ]
    headers = ["#", "TRIAL", "EXPERIMENT", "POOL", "PRIORITY", "SLOTS", "WAITS FOR", "WHY"]
    click.echo(fmt.table(headers, rows))
