"""`assay-master`: the master daemon."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

import click

from assay.errors import AssayError


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="master.yaml (settings; ASSAY_* variables override it, flags override both)",
)
@click.option("--db-url", help="sqlite:///path or postgresql+psycopg://user@host/db")
@click.option("--grpc-port", type=int, help="port for agents, harness and CLI (default 8090)")
@click.option("--http-port", type=int, help="port for the web UI (default 8080)")
@click.option("--host", help="address to listen on (default 0.0.0.0)")
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="where the SQLite store and checkpoints live (default ~/.assay/master)",
)
@click.option("--advertised-address", help="host:port agents' processes use to reach the master")
@click.option("--heartbeat-interval-s", type=float, help="agent heartbeat interval")
@click.version_option(package_name="assay", prog_name="assay-master")
def command(config_file: Path | None, **flags: object) -> None:
    """Run the Assay master."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from assay.master._config import load_master_config
    from assay.master._server import MasterServer

    try:
        config = load_master_config(config_file, flags)
        server = MasterServer(config)
    except (AssayError, OSError) as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    server.start()
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


def main() -> None:
    command(prog_name="assay-master")


if __name__ == "__main__":
    main()
