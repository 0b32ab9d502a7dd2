"""`assay-agent`: offer this machine's GPUs (or CPUs) to an Assay master.

    assay-agent --master master.example:8090
    assay-agent --master 10.0.0.5:8090 --slot-type cpu --slots 4

Every option may also come from the environment (ASSAY_MASTER, ASSAY_SLOTS, ...).
SIGTERM or SIGINT stops the running trials (SIGTERM, then SIGKILL after the grace) and
exits 0; a second signal kills them at once.
"""

from __future__ import annotations

import logging
import shlex
import signal
import socket
import sys
from pathlib import Path
from types import FrameType

import click

from assay.agent._agent import DEFAULT_GRACE, HARNESS_COMMAND, Agent, AgentConfig
from assay.agent._devices import NoGPUError

log = logging.getLogger("assay.agent")


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--master",
    envvar="ASSAY_MASTER",
    required=True,
    metavar="HOST:PORT",
    help="The master's agent endpoint.",
)
@click.option(
    "--slots",
    envvar="ASSAY_SLOTS",
    type=click.IntRange(min=1),
    default=None,
    help="Slots to offer (default: every GPU, or one per CPU).",
)
@click.option(
    "--slot-type",
    envvar="ASSAY_SLOT_TYPE",
    type=click.Choice(["cpu", "cuda"]),
    default=None,
    help="Offer GPUs (cuda: fail without one) or CPUs (default: GPUs if NVML finds any).",
)
@click.option(
    "--agent-id",
    envvar="ASSAY_AGENT_ID",
    default=socket.gethostname(),
    show_default=True,
    help="This agent's name in the cluster.",
)
@click.option(
    "--work-dir",
    envvar="ASSAY_WORK_DIR",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where allocations are unpacked (default: <tmp>/assay-agent-<id>).",
)
@click.option(
    "--address",
    envvar="ASSAY_AGENT_ADDRESS",
    default=None,
    help="Address other agents' trial processes reach this one at (default: the one on "
    "the route to the master).",
)
@click.option(
    "--heartbeat-timeout",
    envvar="ASSAY_HEARTBEAT_TIMEOUT",
    type=click.FloatRange(min=0, min_open=True),
    default=30.0,
    show_default=True,
    help="Seconds to wait for the master's reply to Register before trying again.",
)
@click.option(
    "--grace",
    envvar="ASSAY_GRACE",
    type=click.FloatRange(min=0),
    default=DEFAULT_GRACE,
    show_default=True,
    help="Seconds between SIGTERM and SIGKILL when stopping trials.",
)
@click.option(
    "--keep-work-dirs",
    envvar="ASSAY_KEEP_WORK_DIRS",
    is_flag=True,
    help="Keep each allocation's directory after it exits (debugging).",
)
@click.option(
    "--harness-command",
    envvar="ASSAY_HARNESS_COMMAND",
    default=None,
    hidden=True,
    help="Replace `python -m assay._cluster` (debugging, tests).",
)
@click.option(
    "--log-level",
    envvar="ASSAY_LOG_LEVEL",
    default="INFO",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
)
def main(
    master: str,
    slots: int | None,
    slot_type: str | None,
    agent_id: str,
    work_dir: Path | None,
    address: str | None,
    heartbeat_timeout: float,
    grace: float,
    keep_work_dirs: bool,
    harness_command: str | None,
    log_level: str,
) -> None:
    """Run the Assay agent: register this machine's slots and run the trials it is given."""
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        config = AgentConfig(
            master=master,
            agent_id=agent_id,
            slot_type="cuda" if slot_type == "cuda" else "cpu" if slot_type == "cpu" else None,
            slots=slots,
            work_dir=work_dir,
            address=address,
            heartbeat_timeout=heartbeat_timeout,
            keep_work_dirs=keep_work_dirs,
            harness_command=shlex.split(harness_command) if harness_command else HARNESS_COMMAND,
            grace=grace,
        )
        agent = Agent(config)
    except (ValueError, NoGPUError) as e:
        click.echo(f"assay-agent: error: {e}", err=True)
        sys.exit(1)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        agent.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    agent.run()


if __name__ == "__main__":
    main()
