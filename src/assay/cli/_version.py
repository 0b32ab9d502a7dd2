"""`assay version`: this client's version, and the master's when it answers."""

from __future__ import annotations

from typing import Any

import click

from assay import __version__
from assay.client import Client, MasterError

from ._common import echo_json, settings, user_errors

# A version check should not hang on a master that does not answer.
VERSION_TIMEOUT_S = 10.0


def _master_version(address: str) -> tuple[str | None, str | None]:
    """The master's version, or why it is not known."""
    api = Client(address, timeout=VERSION_TIMEOUT_S)
    try:
        return api.get_master_info().version, None
    except MasterError as e:
        if e.code == "UNAUTHENTICATED":
            return None, f"it answers; log in (assay user login) to see its version ({e})"
        return None, str(e)
    finally:
        api.close()


@click.command("version")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@user_errors
def version_command(as_json: bool) -> None:
    """Print this client's version, and that of the master it talks to (--master) when
    the master answers; say when the two differ. Exits 0 either way."""
    address = settings().master
    master, why = _master_version(address)
    if as_json:
        found: dict[str, Any] = {"client": __version__, "master_address": address}
        echo_json({**found, "master": master, "master_error": why})
        return
    click.echo(f"client: {__version__}")
    if master is None:
        click.echo(f"master: unknown at {address}: {why}")
        return
    click.echo(f"master: {master} at {address}")
    if master != __version__:
        click.echo(
            f"warning: this client is {__version__} and the master {master}: install the "
            "master's version of Assay here (pip install assay=={master}) if a command "
            "misbehaves",
            err=True,
        )
