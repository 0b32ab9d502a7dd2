"""`assay-master`: the master daemon.

    assay-master --config /etc/assay/master.yaml
    assay-master --db-url postgresql+psycopg://assay:PASSWORD@db.example/assay

`assay-master --help-config` lists every setting with its default.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

import click

from assay.common.settings import click_options, effective
from assay.errors import AssayError
from assay.master._config import DEFAULT_PATH, MasterConfig, help_config, load_master_config


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help=f"The settings file ({DEFAULT_PATH} when installed); see --help-config.",
)
@click_options(MasterConfig)
@click.option(
    "--check-config",
    is_flag=True,
    help="Validate the settings, print them (secrets hidden) and exit.",
)
@help_config
@click.version_option(package_name="assay", prog_name="assay-master")
def command(config_file: Path | None, check_config: bool, **flags: object) -> None:
    """Run the Assay master."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # Alembic names each of its plugins and its SQL dialect at every start: not for people.
    # The store says which migrations it ran (store/migrations/env.py).
    logging.getLogger("alembic").setLevel(logging.WARNING)
    try:
        config = load_master_config(config_file, flags)
        if check_config:
            click.echo(effective(config), nl=False)
            return
        from assay.master._server import MasterServer

        # The store and the files the master writes hold secrets: readable by it alone.
        os.umask(0o077)
        server = MasterServer(config)
    except (AssayError, OSError) as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    server.start()
    _tune_gc()
    done = threading.Event()

    def stop(signum: int, frame: FrameType | None) -> None:
        done.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while not done.wait(0.5) and server.fatal is None:
        pass
    server.stop()
    if server.fatal is not None:
        click.echo(
            f"error: the master could not write to its database ({server.fatal}); start it "
            "again once the database is back, and it resumes from there",
            err=True,
        )
        sys.exit(1)


def _tune_gc() -> None:
    """Collect cycles less often than Python's default for a small script.

    A master holds its live experiments, agents and connections for days; with the
    default thresholds the cyclic collector walks all of them hundreds of times a second
    under load (about a tenth of the master's CPU in bench/scheduling.py). What is alive
    once the master is up is frozen out of collections, and young objects are collected
    after 20,000 allocations instead of 700: garbage cycles live a little longer, a few
    megabytes at most.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)


def main() -> None:
    command(prog_name="assay-master")


if __name__ == "__main__":
    main()
