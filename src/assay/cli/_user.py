"""`assay user ...`: log in and out, and manage the master's user accounts."""

from __future__ import annotations

import os
import sys

import click

from ._common import AliasedGroup, client, echo_json, settings, user_errors


def _password(prompt: str, *, confirm: bool = False, stdin: bool = False) -> str:
    """A password from stdin (--password-stdin), ASSAY_PASSWORD, or a hidden prompt."""
    if stdin:
        value = sys.stdin.readline().rstrip("\r\n")
        if not value:
            raise click.UsageError("--password-stdin: the first line of stdin is empty")
        return value
    value = click.prompt(prompt, hide_input=True, confirmation_prompt=confirm, err=True)
    return str(value)


def _user_dict(user: object) -> dict[str, object]:
    return {
        "username": getattr(user, "username", ""),
        "admin": bool(getattr(user, "admin", False)),
        "active": bool(getattr(user, "active", False)),
    }


@click.group(cls=AliasedGroup)
def user() -> None:
    """Log in to the master and manage its users."""


@user.command("login")
@click.argument("username", required=False)
@click.option("--password-stdin", is_flag=True, help="Read the password from stdin's first line.")
@user_errors
def login_command(username: str | None, password_stdin: bool) -> None:
    """Log in and keep a session token for this master in ~/.assay/auth.json.

    Without USERNAME, ASSAY_USER (else `admin`). The password comes from --password-stdin,
    ASSAY_PASSWORD, or a prompt.
    """
    name = username or os.environ.get("ASSAY_USER") or "admin"
    env_password = os.environ.get("ASSAY_PASSWORD")
    if password_stdin or not env_password:
        password = _password(f"password for {name}", stdin=password_stdin)
    else:
        password = env_password
    session = client().login(name, password)
    expires = session.expires_at.strftime("%Y-%m-%d %H:%M UTC")
    click.echo(f"logged in to {settings().master} as {session.username} (until {expires})")


@user.command("logout")
@user_errors
def logout_command() -> None:
    """End this machine's session with the master and forget its token."""
    if client().logout():
        click.echo(f"logged out of {settings().master}")
    else:
        click.echo(f"not logged in to {settings().master}")


@user.command("whoami")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@user_errors
def whoami_command(as_json: bool) -> None:
    """The user this machine's session belongs to."""
    me = client().who_am_i()
    if as_json:
        echo_json(_user_dict(me))
        return
    click.echo(f"{me.username}{' (admin)' if me.admin else ''} on {settings().master}")


@user.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@user_errors
def list_command(as_json: bool) -> None:
    """The master's users."""
    users = [_user_dict(u) for u in client().list_users()]
    if as_json:
        echo_json(users)
        return
    click.echo(f"{'USERNAME':<24} {'ADMIN':<6} ACTIVE")
    for u in users:
        admin = "yes" if u["admin"] else "no"
        active = "yes" if u["active"] else "no"
        click.echo(f"{u['username']!s:<24} {admin:<6} {active}")


@user.command("create")
@click.argument("username")
@click.option("--admin", is_flag=True, help="An administrator: may act on every experiment.")
@click.option("--password-stdin", is_flag=True, help="Read the password from stdin's first line.")
@user_errors
def create_command(username: str, admin: bool, password_stdin: bool) -> None:
    """Create a user (admins only)."""
    password = _password(f"password for {username}", confirm=True, stdin=password_stdin)
    created = client().create_user(username, password, admin)
    click.echo(f"created user {created.username}{' (admin)' if created.admin else ''}")


@user.command("change-password")
@click.argument("username", required=False)
@click.option(
    "--password-stdin",
    is_flag=True,
    help="Read the current password and the new one from stdin's first two lines.",
)
@user_errors
def change_password_command(username: str | None, password_stdin: bool) -> None:
    """Change your password, or (admins) reset USERNAME's.

    Changing your own asks for the current one. Every other session of that user ends.
    """
    c = client()
    me = c.who_am_i()
    own = username in (None, me.username)
    old = ""
    if own:
        old = _password("current password", stdin=password_stdin)
    new = _password("new password", confirm=not password_stdin, stdin=password_stdin)
    changed = c.change_password("" if own else str(username), old, new)
    click.echo(f"changed the password of {changed.username}")


@user.command("deactivate")
@click.argument("username")
@user_errors
def deactivate_command(username: str) -> None:
    """Stop USERNAME from logging in and end their sessions (admins only)."""
    done = client().set_user_active(username, False)
    click.echo(f"deactivated {done.username}")


@user.command("activate")
@click.argument("username")
@user_errors
def activate_command(username: str) -> None:
    """Let a deactivated user log in again (admins only)."""
    done = client().set_user_active(username, True)
    click.echo(f"activated {done.username}")
