"""`assay usage`: slot-hours used in a window, by user, experiment, pool, agent or day."""

from __future__ import annotations

import csv
import datetime as dt
import io
from typing import Any

import click

from assay.client import percent

from . import _format as fmt
from ._common import client, echo_json, user_errors

_BY = ("user", "experiment", "pool", "agent", "day")
_HEADER = {"user": "USER", "experiment": "EXPERIMENT", "pool": "POOL", "agent": "AGENT"}


def _when(ctx: click.Context, param: click.Parameter, value: str | None) -> str:
    """Refuse what the master would refuse, before calling it (the master checks too)."""
    if value is None:
        return ""
    text = value.strip()
    try:
        if len(text) == 10:
            dt.date.fromisoformat(text)
        else:
            dt.datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is not a date: give a day as YYYY-MM-DD (midnight UTC) or a time as "
            "YYYY-MM-DDTHH:MM[:SS][+HH:MM|Z]"
        ) from None
    return text


@click.command("usage")
@click.option(
    "--by",
    type=click.Choice(_BY),
    default="user",
    show_default=True,
    help="What to group the slot-hours by (day: UTC days).",
)
@click.option(
    "--since",
    callback=_when,
    metavar="DATE",
    help="Start of the window: YYYY-MM-DD (midnight UTC) or an ISO 8601 time "
    "[default: 30 days before --until].",
)
@click.option(
    "--until",
    callback=_when,
    metavar="DATE",
    help="End of the window, not included (same forms) [default: now].",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--csv", "as_csv", is_flag=True, help="Print CSV: one row per group.")
@user_errors
def usage_command(by: str, since: str, until: str, as_json: bool, as_csv: bool) -> None:
    """Slot-hours used in [--since, --until), one row per group. An admin sees everyone's
    usage and how busy each resource pool was; a user sees their own usage only."""
    if as_json and as_csv:
        raise click.UsageError("give --json or --csv, not both")
    response = client().get_usage(by=by, since=since, until=until)
    report = _report(response)
    if as_json:
        echo_json(report)
        return
    if as_csv:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        columns = ["key", "name", "slot_hours", "slot_seconds"]
        writer.writerow([by if c == "key" else c for c in columns])
        for group in report["groups"]:
            writer.writerow([group[c] for c in columns])
        click.echo(out.getvalue(), nl=False)
        return
    click.echo(f"slot-hours from {report['since']} to {report['until']}" + _whose(report))
    total = sum(g["slot_hours"] for g in report["groups"])
    if by == "experiment":
        headers = ["ID", "NAME", "SLOT-HOURS", "SHARE"]
    else:
        headers = [_HEADER.get(by, "DAY (UTC)"), "SLOT-HOURS", "SHARE"]
    rows = []
    for g in report["groups"]:
        share = percent(g["slot_hours"] / total) if total else None
        lead = [g["key"], g["name"]] if by == "experiment" else [g["key"]]
        rows.append([*lead, f"{g['slot_hours']:.2f}", share])
    click.echo(fmt.table(headers, rows) if rows else "(no usage in this window)")
    for p in report["pools"]:
        click.echo(
            f"pool {p['pool']}: {p['used_slot_hours']:.2f} of {p['capacity_slot_hours']:.2f} "
            f"slot-hours used ({percent(p['used_ratio'])} used, "
            f"{percent(p['idle_ratio'])} idle; "
            "capacity: its connected agents since they joined)"
        )


def _whose(report: dict[str, Any]) -> str:
    return "" if report["all_users"] else " (your own usage)"


def _report(response: Any) -> dict[str, Any]:
    return {
        "since": fmt.timestamp(response, "since"),
        "until": fmt.timestamp(response, "until"),
        "by": response.by,
        "all_users": response.all_users,
        "groups": [
            {
                "key": g.key,
                "name": g.name,
                "slot_hours": round(g.slot_hours, 6),
                "slot_seconds": round(g.slot_seconds, 3),
            }
            for g in response.groups
        ],
        "pools": [
            {
                "pool": p.pool,
                "used_slot_hours": p.used_slot_seconds / 3600,
                "capacity_slot_hours": p.capacity_slot_seconds / 3600,
                "used_ratio": p.used_ratio,
                "idle_ratio": p.idle_ratio,
            }
            for p in response.pools
        ],
    }


__all__ = ["usage_command"]
