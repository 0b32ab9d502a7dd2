"""`assay agent` (`a`), `assay slot` (`s`), `assay resource-pool` (`rp`) and `assay master`:
the cluster's machines."""

from __future__ import annotations

import sys

import click

from assay.client import percent

from . import _format as fmt
from ._common import AliasedGroup, client, echo_json, settings, user_errors


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
            a["resource_pool"] or None,
            a["agent_label"],
            "yes" if a["connected"] else "no",
            _enabled(a),
            percent(a["cpu_utilization"]),
            percent(a["memory_used_fraction"]),
            a["last_heartbeat"],
        ]
        for a in agents
    ]
    headers = ["ID", "ADDRESS", "TYPE", "USED", "POOL", "LABEL", "CONNECTED", "ENABLED"]
    click.echo(fmt.table([*headers, "CPU", "MEM", "HEARTBEAT"], rows))


def _enabled(a: dict[str, object]) -> str:
    """yes, no, or draining (disabled with --drain, trials still running on it)."""
    if a["enabled"]:
        return "yes"
    return "draining" if a["draining"] and a["used_slots"] else "no"


def _set_enabled(agent_id: str, enabled: bool, drain: bool = False) -> None:
    result = client().set_agent_enabled(agent_id, enabled, drain)
    word = "enabled" if result.enabled else "disabled"
    if result.draining:
        busy = sum(1 for s in result.slots if fmt.slot_busy(s))
        word = f"draining ({busy} slot{'s' if busy != 1 else ''} busy)" if busy else "drained"
    click.echo(f"agent {result.id or agent_id} {word}")


@agent.command("enable")
@click.argument("agent_id", metavar="ID")
@user_errors
def agent_enable_command(agent_id: str) -> None:
    """Let the scheduler place trials on an agent again."""
    _set_enabled(agent_id, True)


@agent.command("disable")
@click.argument("agent_id", metavar="ID")
@click.option(
    "--drain",
    is_flag=True,
    help="Let its running trials finish (the agent shows as draining in `agent list` "
    "until they have) instead of stopping them at a checkpoint.",
)
@user_errors
def agent_disable_command(agent_id: str, drain: bool) -> None:
    """Stop placing trials on an agent; its running trials stop at a checkpoint and
    requeue, to go on elsewhere (with --drain they finish there instead)."""
    _set_enabled(agent_id, False, drain)


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
    slots = [
        {**fmt.slot_dict(s), "resource_pool": a.resource_pool}
        for a in client().list_agents()
        for s in a.slots
    ]
    if as_json:
        echo_json(slots)
        return
    rows = [
        [
            s["agent_id"],
            s["resource_pool"],
            s["index"],
            s["type"],
            "yes" if s["enabled"] else "no",
            "busy" if s["busy"] else "free",
            s["trial_id"],
            s["allocation_id"],
        ]
        for s in slots
    ]
    headers = ["AGENT", "POOL", "SLOT", "TYPE", "ENABLED", "STATE", "TRIAL", "ALLOCATION"]
    click.echo(fmt.table(headers, rows))


@click.group("resource-pool", cls=AliasedGroup)
def resource_pool() -> None:
    """The resource pools agents join and experiments choose (resources.resource_pool)."""


@resource_pool.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@user_errors
def resource_pool_list_command(as_json: bool) -> None:
    """List the pools: scheduler, connected agents, slots by type, queued trials."""
    pools = [fmt.pool_dict(p) for p in client().list_resource_pools()]
    if as_json:
        echo_json(pools)
        return
    rows = []
    for p in pools:
        kinds = p["slots"] or [{"type": None, "total": 0, "used": 0, "free": 0}]
        for i, s in enumerate(kinds):
            first = i == 0
            rows.append(
                [
                    (p["name"] + (" (default)" if p["default"] else "")) if first else "",
                    p["scheduler"] if first else "",
                    len(p["agents"]) if first else "",
                    s["type"],
                    s["total"],
                    s["used"],
                    s["free"],
                    p["queued_trials"] if first else "",
                    _workspaces(p["workspaces"]) if first else "",
                    (p["description"] or None) if first else "",
                ]
            )
    headers = ["NAME", "SCHEDULER", "AGENTS", "TYPE", "SLOTS", "USED", "FREE", "QUEUED"]
    click.echo(fmt.table([*headers, "WORKSPACES", "DESCRIPTION"], rows))


def _workspaces(bindings: list[dict[str, object]]) -> str:
    """A pool's bound workspaces, or "all" for a pool open to every workspace."""
    return ",".join(str(b["workspace"]) for b in bindings) or "all"


def _said(pool: str, bindings: list[object]) -> str:
    names = [str(getattr(b, "workspace", "")) for b in bindings]
    if not names:
        return f"pool {pool} is open to every workspace"
    return f"pool {pool} takes experiments of workspace{'s' if len(names) > 1 else ''} " + (
        ", ".join(names)
    )


@resource_pool.command("bind")
@click.argument("pool")
@click.argument("workspace")
@user_errors
def resource_pool_bind_command(pool: str, workspace: str) -> None:
    """Bind POOL to WORKSPACE (admins): a bound pool takes experiments of its bound
    workspaces only. Trials of other workspaces' experiments already in the pool wait;
    running ones go on."""
    click.echo(_said(pool, client().pool_workspaces("BindResourcePool", pool, workspace)))


@resource_pool.command("unbind")
@click.argument("pool")
@click.argument("workspace")
@user_errors
def resource_pool_unbind_command(pool: str, workspace: str) -> None:
    """Remove POOL's binding to WORKSPACE (admins); with none left, the pool is open to
    every workspace. Bindings of the master's settings stay."""
    click.echo(_said(pool, client().pool_workspaces("UnbindResourcePool", pool, workspace)))


@resource_pool.command("list-workspaces")
@click.argument("pool")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@user_errors
def resource_pool_list_workspaces_command(pool: str, as_json: bool) -> None:
    """List the workspaces POOL is bound to (none: it is open to every workspace)."""
    bindings = client().pool_workspaces("ListResourcePoolWorkspaces", pool)
    found = [fmt.binding_dict(b) for b in bindings]
    if as_json:
        echo_json(found)
        return
    if not found:
        click.echo(f"pool {pool} is bound to no workspace: it is open to every workspace")
        return
    rows = [[b["workspace"], "settings" if b["from_settings"] else "bind"] for b in found]
    click.echo(fmt.table(["WORKSPACE", "BOUND BY"], rows))


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
        "resource_pools": list(info.resource_pools),
        "default_resource_pool": info.default_resource_pool,
    }
    if as_json:
        echo_json(data)
        return
    for key, value in data.items():
        shown = ", ".join(value) if isinstance(value, list) else value
        click.echo(f"{key.replace('_', ' ').capitalize() + ':':15}{shown if shown != '' else '-'}")


@master.command("config")
@user_errors
def master_config_command() -> None:
    """Print the settings the master runs with, as YAML (administrators only): every
    setting, a secret's value as <hidden>, db_url without its password."""
    click.echo(client().get_master_config(), nl=False)


@master.command("logs")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines (Ctrl-C stops).")
@click.option("--tail", type=click.IntRange(min=1), help="Only the last N lines (then follow).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line (JSON Lines).")
@user_errors
def master_logs_command(follow: bool, tail: int | None, as_json: bool) -> None:
    """Print the master's own log (administrators only): the lines it keeps in memory
    (its last 10,000), as `TIME LEVEL LOGGER: MESSAGE`."""
    lines = client().stream_master_logs(tail=tail or 0, follow=follow)
    try:
        for line in lines:
            when = line.timestamp.ToDatetime().isoformat(timespec="milliseconds") + "Z"
            if as_json:
                shown = {"id": line.id, "timestamp": when, "level": line.level}
                echo_json({**shown, "logger": line.logger, "message": line.message})
            else:
                click.echo(f"{when} {line.level} {line.logger}: {line.message}")
    except KeyboardInterrupt:
        if not follow:
            raise
        sys.exit(130)
