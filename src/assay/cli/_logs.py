"""A trial's logs for `assay trial logs` and `assay experiment logs`: Determined's filters
(the master applies them), and a follow that Ctrl-C ends without touching the trial."""

from __future__ import annotations

import datetime as dt
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from . import _format as fmt
from ._common import client, echo_json

F = TypeVar("F", bound=Callable[..., Any])

# The levels the master filters on, lowest first (it checks them too).
LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def since_time(text: str, now: dt.datetime | None = None) -> dt.datetime:
    """`--since`: a duration back from now (`90s`, `10m`, `1h30m`, `2d`) or a time
    (`2026-01-02T15:04:05Z`, `2026-01-02 15:04`: this machine's zone without an offset);
    ValueError saying how to write one."""
    now = now or dt.datetime.now(dt.UTC)
    spans = _DURATION.findall(text)
    if spans and "".join(n + u for n, u in spans) == text:
        return now - dt.timedelta(seconds=sum(float(n) * _UNITS[u] for n, u in spans))
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"{text!r} is neither a duration (90s, 10m, 1h30m, 2d) nor a time "
            "(2026-01-02T15:04:05Z, or 2026-01-02 15:04 in this machine's zone)"
        ) from None
    return when.astimezone(dt.UTC)  # a naive time is local, as astimezone reads it


def _since(ctx: click.Context, param: click.Parameter, value: str | None) -> str:
    if value is None:
        return ""
    try:
        return since_time(value).isoformat().replace("+00:00", "Z")
    except ValueError as e:
        raise click.BadParameter(str(e), ctx=ctx, param=param) from None


@dataclass(frozen=True)
class LogQuery:
    """Which lines to print, as the options say."""

    follow: bool = False
    tail: int | None = None
    head: int | None = None
    ranks: tuple[int, ...] = ()
    level: str | None = None
    since: str = ""
    grep: str | None = None


def log_options(command: F) -> F:
    """`-f/--follow`, `--tail N`, `--head N`, `--rank R`, `--level L`, `--since T`,
    `--grep TEXT` and `--json`, as `trial logs` and `experiment logs` take them
    (Determined's `--rank-id` and `--timestamp-after` are accepted too)."""
    for option in reversed(
        [
            click.option(
                "-f", "--follow", is_flag=True, help="Keep printing new lines until the trial ends."
            ),
            click.option(
                "--tail", type=click.IntRange(min=1), help="Only the last N lines (then follow)."
            ),
            click.option(
                "--head",
                type=click.IntRange(min=1),
                help="Only the first N lines (not with --tail or --follow).",
            ),
            click.option(
                "--rank",
                "--rank-id",
                "ranks",
                type=click.IntRange(min=0),
                multiple=True,
                help="Only this rank's lines (repeat for several).",
            ),
            click.option(
                "--level",
                type=click.Choice(LEVELS, case_sensitive=False),
                help="Only lines of this level or higher (a line without one counts as INFO).",
            ),
            click.option(
                "--since",
                "--timestamp-after",
                "since",
                metavar="TIME",
                callback=_since,
                help="Only lines from this time on: a duration back from now (10m, 1h30m, "
                "2d) or a time (2026-01-02T15:04:05Z; without an offset, this machine's).",
            ),
            click.option(
                "--grep",
                metavar="TEXT",
                help="Only lines containing TEXT (case-sensitive, as `grep -F`).",
            ),
            click.option(
                "--json",
                "as_json",
                is_flag=True,
                help="One JSON object per line (JSON Lines), as they come.",
            ),
        ]
    ):
        command = option(command)
    return command


def log_query(
    follow: bool,
    tail: int | None,
    head: int | None,
    ranks: tuple[int, ...],
    level: str | None,
    since: str,
    grep: str | None,
) -> LogQuery:
    """The options as one query; a usage error for --head with --tail or --follow."""
    if head is not None and (tail is not None or follow):
        raise click.UsageError("--head cannot be combined with --tail or --follow")
    return LogQuery(follow, tail, head, ranks, level.upper() if level else None, since, grep)


def print_logs(trial_id: int, query: LogQuery, *, as_json: bool) -> None:
    """Print the trial's lines as `[rank R] message` (or JSON Lines). Ctrl-C while
    following ends the command, not the trial: it says so, and exits 130."""
    lines = client().stream_trial_logs(
        trial_id,
        follow=query.follow,
        tail=query.tail or 0,
        head=query.head or 0,
        ranks=query.ranks,
        min_level=query.level or "",
        since=query.since,
        search_text=query.grep or "",
    )
    try:
        for line in lines:
            if as_json:
                echo_json(fmt.log_line_dict(line))
            else:
                click.echo(f"[rank {line.rank}] {line.message.rstrip(chr(10))}")
    except KeyboardInterrupt:
        if not query.follow:
            raise
        click.echo(
            f"\nstopped following trial {trial_id}'s logs; the trial goes on running "
            f"(`assay trial logs {trial_id} -f` follows it again, `assay trial kill "
            f"{trial_id}` stops it)",
            err=True,
        )
        sys.exit(130)


__all__ = ["LEVELS", "LogQuery", "log_options", "log_query", "print_logs", "since_time"]
