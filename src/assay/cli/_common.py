"""What every command shares: the alias-aware group, settings, the client for `--master`,
error printing, JSON output."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import wraps
from typing import Any, TypeVar

import click

from assay.client import DEFAULT_MASTER, Client, master_address
from assay.errors import AssayError

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Settings:
    """Options of the root command that every subcommand needs."""

    master: str = DEFAULT_MASTER


def settings() -> Settings:
    ctx = click.get_current_context()
    found = ctx.find_object(Settings)
    if found is not None:
        return found
    return Settings(master_address())


def client() -> Client:
    """The client for this invocation's `--master`, closed when the command ends."""
    ctx = click.get_current_context()
    c = Client(settings().master)
    ctx.call_on_close(c.close)
    return c


def user_errors(func: F) -> F:
    """Print an AssayError as `error: ...` (no traceback) and exit 1; Ctrl-C exits 130."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except AssayError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)
        except BrokenPipeError:
            # `assay trial logs 3 | head`: the reader left; stop quietly, as `cat` does.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            sys.exit(141)

    return wrapper  # type: ignore[return-value]


def echo_json(value: Any) -> None:
    """One JSON document on one line: the last line of stdout for scripts to parse."""
    click.echo(json.dumps(value))


def usage_error_line(error: click.UsageError) -> str:
    """`Missing argument 'CONFIG'.` as one line that names the help to read."""
    message = error.format_message().strip().replace("\n", " ")
    message = (message[:1].lower() + message[1:]).rstrip(".")
    if error.ctx is not None:
        message += f" (see `{error.ctx.command_path} --help`)"
    return f"error: {message}"


class AliasedGroup(click.Group):
    """A group whose commands also answer to short aliases (`experiment` = `e`).

    Without a command it prints its help and exits 0 (`assay`, `assay e`).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.aliases: dict[str, str] = {}

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args and self.no_args_is_help and not ctx.resilient_parsing:
            click.echo(ctx.get_help(), color=ctx.color)
            ctx.exit(0)
        return super().parse_args(ctx, args)

    def add_aliased(self, cmd: click.Command, *aliases: str) -> None:
        self.add_command(cmd)
        assert cmd.name is not None
        for alias in aliases:
            self.aliases[alias] = cmd.name

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return super().get_command(ctx, self.aliases.get(cmd_name, cmd_name))

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        _, cmd, rest = super().resolve_command(ctx, args)
        return (cmd.name if cmd is not None else None), cmd, rest

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        shown: dict[str, list[str]] = {}
        for alias, name in self.aliases.items():
            shown.setdefault(name, []).append(alias)
        rows: list[tuple[str, str]] = []
        width = formatter.width - 6 - max((len(n) for n in self.list_commands(ctx)), default=0)
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is None or cmd.hidden:
                continue
            label = f"{name} ({', '.join(shown[name])})" if name in shown else name
            rows.append((label, cmd.get_short_help_str(limit=max(width, 30))))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


class RootGroup(AliasedGroup):
    """The `assay` command: a usage mistake is one `error:` line and exit 1, like every
    other error, instead of click's usage block and exit 2."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            code = super().main(args, prog_name, complete_var, False, **extra)
        except click.UsageError as e:
            click.echo(usage_error_line(e), err=True)
            sys.exit(1)
        except click.ClickException as e:
            click.echo(f"error: {e.format_message()}", err=True)
            sys.exit(1)
        except click.Abort:
            click.echo("aborted", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)
