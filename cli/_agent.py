"""`assay agent` (`a`), `assay slot` (`s`) and `assay master`: the cluster's machines."""

from __future__ import annotations

import click

from . import _format as fmt
from ._client import client
from ._common import AliasedGroup, echo_json, settings, user_errors


@click.group("agent", cls=AliasedGroup)
def agent() -> None:
    """List agents; take them out of (or back into) scheduling; remove them."""


@agent.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@user_errors
def agent_list_command(as_json: bool) -> None:
    """List the agents the master knows, with their slots."""
    agents = [fmt.agent_dict(a) for a in client().list_agents()]
    if as_json:
        echo_json(agents)
        return
    rows = [
        [
            a["id"],
            a["address"] or None,
            a["slot_type"],
            f"{a['used_slots']}/{a['slots']}",
            "yes" if a["connected"] else "no",
            "yes" if a["enabled"] else "no",
            fmt.percent(a["cpu_utilization"]),
            fmt.percent(a["memory_used_fraction"]),
            a["last_heartbeat"],
        ]
        for a in agents
    ]
    headers = ["ID", "ADDRESS", "TYPE", "USED", "CONNECTED", "ENABLED", "CPU", "MEM", "HEARTBEAT"]
    click.echo(fmt.table(headers, rows))


def _set_enabled(agent_id: str, enabled: bool) -> None:
    result = client().set_agent_enabled(agent_id, enabled)
    word = "enabled" if result.enabled else "disabled"
    click.echo(f"agent {result.id or agent_id} {word}")


@agent.command("enable")
@click.argument("agent_id", metavar="ID")
@user_errors
def agent_enable_command(agent_id: str) -> None:
    """Let the scheduler place trials on an agent again."""
    _set_enabled(agent_id, True)


@agent.command("disable")
@click.argument("agent_id", metavar="ID")
@user_errors
def agent_disable_command(agent_id: str) -> None:
    """Stop placing new trials on an agent (running ones continue)."""
    _set_enabled(agent_id, False)


@agent.command("remove")
@click.argument("agent_id", metavar="ID")
@user_errors
def agent_remove_command(agent_id: str) -> None:
    """Forget an agent's credential, so that its name can join again (admins only).

    Each agent is given a credential of its own at its first join, and its name accepts
    no other: remove an agent that lost its credential file, or a machine that left the
    cluster. A connected agent is disconnected and its trials are requeued; an agent
    that still has the join token can join again under the name and gets a new
    credential (change the master's join_token to keep a machine out for good).
    """
    disconnected = client().remove_agent(agent_id)
    how = " (it was connected: disconnected, its trials requeued)" if disconnected else ""
    click.echo(f"agent {agent_id} removed{how}; its name can join again with the join token")


@click.group("slot", cls=AliasedGroup)
def slot() -> None:
    """List the slots (one GPU or CPU each) of every agent."""


@slot.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@user_errors
def slot_list_command(as_json: bool) -> None:
    """List every slot and what runs on it."""
    slots = [fmt.slot_dict(s) for a in client().list_agents() for s in a.slots]
    if as_json:
        echo_json(slots)
        return
    rows = [
        [
            s["agent_id"],
            s["index"],
            s["type"],
            "yes" if s["enabled"] else "no",
            "busy" if s["allocation_id"] else "free",
            s["trial_id"],
            s["allocation_id"],
        ]
        for s in slots
    ]
    headers = ["AGENT", "SLOT", "TYPE", "ENABLED", "STATE", "TRIAL", "ALLOCATION"]
    click.echo(fmt.table(headers, rows))


@click.group("master", cls=AliasedGroup)
def master() -> None:
    """The master this CLI talks to (--master / ASSAY_MASTER)."""


@master.command("info")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@user_errors
def master_info_command(as_json: bool) -> None:
    """Show the master's version, store and cluster size."""
    info = client().get_master_info()
    data = {
        "address": settings().master,
        "version": info.version,
        "cluster_id": info.cluster_id,
        "store": info.store,
        "agents": info.agents,
        "slots": info.slots,
        "free_slots": info.free_slots,
        "queued_trials": info.queued_trials,
    }
    if as_json:
        echo_json(data)
        return
    for key, value in data.items():
        click.echo(f"{key.replace('_', ' ').capitalize() + ':':15}{value if value != '' else '-'}")
