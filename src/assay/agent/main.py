"""`assay-agent`: offer this machine's GPUs (or CPUs) to an Assay master.

    assay-agent --master master.example:8090
    assay-agent --master 10.0.0.5:8090 --slot-type cpu --slots 4
    assay-agent --config /etc/assay/agent.yaml

Every setting can come from a flag, an ASSAY_* variable (ASSAY_MASTER, ASSAY_SLOTS, ...)
or the YAML file given with --config, in that order; `assay-agent --help-config` lists
them with their defaults. SIGTERM or SIGINT stops the running trials (SIGTERM, then
SIGKILL after the grace) and exits 0; a second signal kills them at once.

Exit status: 0 after a signal, 1 when the settings are invalid or the slots cannot be
offered, 3 when the master refuses this agent for good (its version): a service manager
should not restart it (deploy/systemd's unit says RestartPreventExitStatus=3).
"""

from __future__ import annotations

import logging
import shlex
import signal
import sys
from pathlib import Path
from types import FrameType

import click

import assay
from assay.agent._agent import HARNESS_COMMAND, Agent
from assay.agent._config import DEFAULT_PATH, AgentSettings, help_config, load_agent_settings
from assay.agent._devices import NoGPUError
from assay.common.settings import SettingsError, click_options, effective

EXIT_REFUSED = 3


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help=f"The settings file ({DEFAULT_PATH} when installed); see --help-config.",
)
@click_options(AgentSettings)
@click.option(
    "--check-config",
    is_flag=True,
    help="Validate the settings, print them (secrets hidden) and exit.",
)
@click.option(
    "--harness-command",
    envvar="ASSAY_HARNESS_COMMAND",
    default=None,
    hidden=True,
    help="Replace `python -m assay._cluster` (debugging, tests).",
)
@click.option(
    "--reported-version",
    default=None,
    hidden=True,
    help="Report this version to the master instead of the installed one (only for "
    "testing the master's version check).",
)
@help_config
def main(
    config_file: Path | None,
    check_config: bool,
    harness_command: str | None,
    reported_version: str | None,
    **flags: object,
) -> None:
    """Run the Assay agent: register this machine's slots and run the trials it is given."""
    try:
        settings = load_agent_settings(config_file, flags)
    except (SettingsError, ValueError) as e:
        click.echo(f"assay-agent: error: {e}", err=True)
        sys.exit(1)
    if check_config:
        click.echo(effective(settings), nl=False)
        return
    logging.basicConfig(
        level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        agent = Agent(
            settings,
            harness_command=shlex.split(harness_command) if harness_command else HARNESS_COMMAND,
            version=reported_version or assay.__version__,
        )
    except (ValueError, NoGPUError) as e:
        click.echo(f"assay-agent: error: {e}", err=True)
        sys.exit(1)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        agent.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    agent.run()
    if agent.connection.refused is not None:
        click.echo(f"assay-agent: error: {agent.connection.refused}", err=True)
        sys.exit(EXIT_REFUSED)


if __name__ == "__main__":
    main()
