"""`assay`: the command line.

Heavy modules are imported inside commands only: torch by `trial run-local`, grpc and the
generated stubs by the commands that talk to the master (see `_client.py`).
"""

from __future__ import annotations

import click

from assay import __version__
from assay.client import DEFAULT_MASTER, default_master

from ._agent import agent, master, resource_pool, slot
from ._checkpoint import checkpoint
from ._common import RootGroup, Settings
from ._deploy import deploy
from ._experiment import experiment
from ._job import job
from ._model import model
from ._preview import preview_search
from ._template import template
from ._trial import run_local_command, trial
from ._usage import usage_command
from ._user import user
from ._version import version_command
from ._workspace import project, workspace

__all__ = ["cli", "main", "run_local_command"]


@click.group(cls=RootGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "-m",
    "--master",
    "master_address",
    envvar="ASSAY_MASTER",
    default=None,
    show_default=f"the master of `assay deploy local up` while it runs, else {DEFAULT_MASTER}",
    metavar="HOST:PORT",
    help="The master's gRPC address (or set ASSAY_MASTER).",
)
@click.version_option(__version__, prog_name="assay")
@click.pass_context
def cli(ctx: click.Context, master_address: str | None) -> None:
    """Train PyTorch models on your own machines."""
    ctx.obj = Settings(master=master_address or default_master())


assert isinstance(cli, RootGroup)
cli.add_aliased(experiment, "e")
cli.add_aliased(trial, "t")
cli.add_aliased(agent, "a")
cli.add_aliased(slot, "s")
cli.add_aliased(resource_pool, "rp")
cli.add_aliased(checkpoint, "c")
cli.add_aliased(master)
cli.add_aliased(deploy)
cli.add_aliased(preview_search)
cli.add_aliased(user, "u")
cli.add_aliased(job, "j")
cli.add_aliased(usage_command)
cli.add_aliased(model, "m")
cli.add_aliased(workspace, "w")
cli.add_aliased(project, "p")
cli.add_aliased(template)
cli.add_aliased(version_command)


def main() -> None:
    cli(prog_name="assay")


if __name__ == "__main__":
    main()
