"""`python3 -m assay.launch.torch_distributed [--nproc_per_node N] python3 train.py ...`

torchrun's job for a script entrypoint: one process per slot with `RANK`, `WORLD_SIZE`,
`LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR` and `MASTER_PORT` set.

- On a cluster (and under `assay trial run-local`) each slot's process already has them:
  the launcher replaces itself with the command.
- Run by hand, it starts `--nproc_per_node` processes (default 1) on this machine, waits
  for them, stops the rest when one fails, and exits with the first failure's code.

`--trial module:Class` (Determined's legacy form) runs a Trial class instead of a command.
Determined's module name, `determined.launch.torch_distributed`, in an entrypoint means
this one.
"""

from __future__ import annotations

import argparse
import os
import sys

from assay.errors import AssayError


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python3 -m assay.launch.torch_distributed",
        description="Run a training script once per slot with torch.distributed's variables.",
    )
    parser.add_argument(
        "--nproc_per_node",
        "--nproc-per-node",
        type=int,
        default=None,
        help="Processes to start when not on a cluster (default 1).",
    )
    parser.add_argument("--trial", help="Run this Trial class (module:Class), not a command.")
    parser.add_argument(
        "command", nargs=argparse.REMAINDER, help="The command, e.g. python3 train.py"
    )
    args = parser.parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.command and not args.trial:
        parser.error("give the command to run, e.g. python3 train.py")
    return args


def main(argv: list[str]) -> int:
    args = _parse(argv)
    try:
        if args.trial:
            return _run_trial(args.trial)
        if "RANK" in os.environ:  # a slot's process already: just run the command
            from assay._script import exec_command

            exec_command(args.command)
            return 127  # unreachable: exec_command raises if it cannot run
        from assay._script import spawn_ranks

        slots = args.nproc_per_node or 1
        if slots < 1:
            raise AssayError(f"--nproc_per_node must be at least 1, got {slots}")
        _, code = spawn_ranks(args.command, slots, env=os.environ)
        return code
    except AssayError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _run_trial(entrypoint: str) -> int:
    """A Trial class on a cluster slot: the harness's own process, with this entrypoint."""
    from assay import _cluster

    return _cluster.main([], entrypoint=entrypoint)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
