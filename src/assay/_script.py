"""Script entrypoints: the command a trial runs, and one process per slot for it.

`entrypoint: python3 train.py --epochs 1` (or the list form) runs the command in the
model directory, once per slot, with torchrun's variables (`RANK`, `WORLD_SIZE`,
`LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`). `python`/`python3` mean
the interpreter Assay runs in (the one that has `assay` and `torch`), and Determined's
launcher module `determined.launch.torch_distributed` means Assay's
`assay.launch.torch_distributed`, which on a slot process simply runs the command: the
agent has already started one process per slot.

On a cluster the agent's harness process (`python -m assay._cluster`) replaces itself
with the command (`exec`), so signals reach the script directly. `run_script_local` is
`assay trial run-local` for a script: it writes an `ASSAY_LOCAL_SPEC` for
`assay.core.init()`, starts the processes, and reads back what the script reported.
"""

from __future__ import annotations

import ast
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from assay._archive_check import ignored_import
from assay.errors import (
    INVALID_HP_EXIT_CODE,
    PREEMPTED_EXIT_CODE,
    AssayError,
    InvalidConfigError,
    TrainingError,
    collective_mismatch_hint,
    early_exit_hint,
)

LAUNCHER = "assay.launch.torch_distributed"
# Determined's launcher modules, and what they mean here.
_LAUNCHER_ALIASES = {"determined.launch.torch_distributed": LAUNCHER, LAUNCHER: LAUNCHER}
_UNSUPPORTED_LAUNCHERS = {
    "determined.launch.deepspeed": "DeepSpeed's launcher",
    "determined.launch.horovod": "Horovod",
}
log = logging.getLogger("assay")
_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")


def resolve_command(argv: Sequence[str], python: str | None = None) -> list[str]:
    """`argv` with `python`/`python3` as this interpreter and Determined's launcher as
    Assay's; an `AssayError` for a launcher Assay does not have."""
    if not argv:
        raise AssayError("the entrypoint command is empty")
    out = list(argv)
    if _PYTHON.match(out[0]):
        out[0] = python or sys.executable
    for i in range(1, len(out)):
        if out[i - 1] != "-m":
            continue
        module = out[i]
        if module in _UNSUPPORTED_LAUNCHERS:
            raise AssayError(
                f"{module} ({_UNSUPPORTED_LAUNCHERS[module]}) is not available in Assay: use "
                f"`python3 -m {LAUNCHER} python3 your_script.py`, which starts one process "
                "per slot with torch.distributed's variables"
            )
        out[i] = _LAUNCHER_ALIASES.get(module, module)
    return out


def _check_runnable(program: str, env: Mapping[str, str], cwd: str | Path | None) -> None:
    """Refuse a program the ranks could not exec, before any starts (they are started
    through a wrapper, so Popen itself no longer fails for them)."""
    if os.sep in program:
        path = Path(cwd or ".") / program
        found = path.is_file() and os.access(path, os.X_OK)
        why = "not an executable file" if path.exists() else "no such file"
    else:
        found = shutil.which(program, path=env.get("PATH", os.defpath)) is not None
        why = "not found on the PATH"
    if not found:
        raise AssayError(f"cannot run the entrypoint {program!r}: {why}")


def script_file(argv: Sequence[str]) -> str | None:
    """The Python file `argv` runs (`python3 [options] FILE.py ...`, behind Assay's or
    Determined's launcher too), relative to the model directory; None for other commands."""
    args = list(argv)
    while args and _PYTHON.match(Path(args[0]).name):
        rest = args[1:]
        while rest and rest[0].startswith("-") and rest[0] not in ("-m", "-c"):
            rest = rest[1:]
        if not rest or rest[0] == "-c":
            return None
        if rest[0] == "-m":
            if len(rest) < 2 or rest[1] not in _LAUNCHER_ALIASES:
                return None
            rest = rest[2:]  # the launcher's own options, then the command it runs
            while rest and rest[0].startswith("-"):
                if rest[0] == "--trial":
                    return None
                rest = rest[1:] if rest[0] == "--" or "=" in rest[0] else rest[2:]
            args = rest
            continue
        return rest[0] if rest[0].endswith(".py") else None
    return None


_SHELLS = frozenset({"sh", "bash", "zsh", "dash"})


def _other_file(argv: Sequence[str]) -> str | None:
    """The model directory's file a non-Python command runs: `./run.sh ...`, or
    `bash run.sh ...` (a relative path); None for anything else."""
    if not argv:
        return None
    if argv[0].startswith("./"):
        return argv[0][2:]
    if Path(argv[0]).name in _SHELLS and len(argv) > 1:
        first = argv[1]
        if not first.startswith(("-", "/", "$", "~")):
            return first
    return None


def _missing_module(argv: Sequence[str], model_dir: Path) -> str | None:
    """`python3 -m NAME` where NAME is neither in the model directory nor importable
    here, while a module of a close name is in the model directory (a typo)."""
    import difflib
    import importlib.util

    if len(argv) < 3 or not _PYTHON.match(Path(argv[0]).name) or argv[1] != "-m":
        return None
    top = argv[2].split(".")[0]
    if top in _LAUNCHER_ALIASES or (model_dir / f"{top}.py").is_file():
        return None
    if (model_dir / top).is_dir():
        return None
    try:
        if importlib.util.find_spec(top) is not None:
            return None
    except (ImportError, ValueError):
        pass
    mine = sorted(
        {p.stem for p in model_dir.glob("*.py")}
        | {p.parent.name for p in model_dir.glob("*/__init__.py")}
    )
    close = difflib.get_close_matches(top, mine, n=1)
    if not close:
        return None  # perhaps installed where the trials run
    return (
        f"the entrypoint runs module {argv[2]!r}, which is neither in the model directory "
        f"{model_dir} nor installed here; did you mean {close[0]!r}?"
    )


def missing_script(
    argv: Sequence[str], model_dir: str | Path, *, runs_here: bool = True
) -> str | None:
    """What is wrong when `argv` runs a file the model directory lacks (a Python file, a
    shell script, and, where it runs (`runs_here`: this machine's packages are the
    trial's), a module whose name is a typo of one there), else None."""
    other = _other_file(argv)
    if other is not None and not (Path(model_dir) / other).is_file():
        return f"the entrypoint runs {other}, which is not in the model directory {model_dir}"
    script = script_file(argv)
    if script is None:
        return _missing_module(argv, Path(model_dir)) if runs_here else None
    if (Path(model_dir) / script).is_file():
        return None
    found = sorted(p.name for p in Path(model_dir).glob("*.py"))
    return (
        f"the entrypoint runs {script}, which is not in the model directory "
        f"{model_dir} (Python files there: {', '.join(found) or 'none'})"
    )


_MAX_COMPILED_BYTES = 2 * 2**20


def script_problem(
    argv: Sequence[str], model_dir: str | Path, *, runs_here: bool = True
) -> str | None:
    """`missing_script`, or the syntax error that stops the script `argv` runs from
    compiling (a failure every run would repeat), else None."""
    problem = missing_script(argv, model_dir, runs_here=runs_here)
    script = script_file(argv)
    if problem is not None or script is None:
        return problem
    path = Path(model_dir) / script
    try:
        if path.stat().st_size > _MAX_COMPILED_BYTES:
            return None  # not worth compiling twice: Python says so when it runs
        with warnings.catch_warnings():  # an invalid escape is Python's to warn of, later
            warnings.simplefilter("ignore")
            tree = ast.parse(path.read_bytes(), filename=str(path))
            compile(tree, str(path), "exec", dont_inherit=True)
        return ignored_import(tree, Path(script), Path(model_dir))
    except SyntaxError as e:
        return (
            f"the entrypoint's {script} does not compile: SyntaxError: {e.msg} "
            f"({script}, line {e.lineno})"
        )
    except (OSError, ValueError, RecursionError, MemoryError):
        # Unreadable here, NUL bytes, or too deep for the compiler: Python says so when
        # it runs (the check only spares a run for what it can tell for sure).
        return None
    return None


def launcher_trial(argv: Sequence[str]) -> str | None:
    """The `module:Class` of `python3 -m <launcher> --trial module:Class`, else None."""
    args = list(argv)
    for i in range(1, len(args) - 2):
        if args[i] == "-m" and args[i + 1] in _LAUNCHER_ALIASES and "--trial" in args[i + 2 :]:
            rest = args[i + 2 :]
            index = rest.index("--trial")
            if index + 1 < len(rest):
                return rest[index + 1]
    return None


def exec_command(argv: Sequence[str]) -> None:
    """Replace this process with `argv` (resolved); returns only if it cannot start."""
    command = resolve_command(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(command[0], command)
    except OSError as e:
        raise AssayError(f"cannot run the entrypoint {command[0]!r}: {e.strerror or e}") from None


def spawn_ranks(
    argv: Sequence[str],
    slots: int,
    *,
    env: Mapping[str, str],
    cwd: str | Path | None = None,
    tail: list[list[str]] | None = None,
    early: list[int] | None = None,
) -> tuple[int, int]:
    """Run `argv` as `slots` processes with torchrun's variables; wait for all of them.

    Returns (rank, exit code) of the first process that failed, or (0, 0). The first
    failure stops the others (SIGTERM, then SIGKILL after 10 s), as torchrun does.
    Output is passed through, prefixed `[rank N]` when there are several processes.
    `early` gets the ranks that had exited 0 when the first failure came.
    """
    from assay._rank_processes import free_port, pump_output, stop_all, wait_all
    from assay.common.spawn import dying_with, torchrun_env

    command = resolve_command(argv)
    _check_runnable(command[0], env, cwd)
    port = free_port()
    threads = max(1, (os.cpu_count() or 1) // slots)
    procs: list[subprocess.Popen[bytes]] = []
    tails = tail if tail is not None else []
    try:
        for rank in range(slots):
            rank_env = dict(env)
            rank_env.update(
                torchrun_env(
                    rank=rank,
                    world_size=slots,
                    local_rank=rank,
                    local_world_size=slots,
                    master_addr="127.0.0.1",
                    master_port=port,
                    run_id=f"local-{port}",
                ),
                PYTHONUNBUFFERED="1",
            )
            rank_env.setdefault("OMP_NUM_THREADS", str(threads))
            procs.append(
                subprocess.Popen(
                    dying_with(command, os.getpid()),
                    cwd=cwd,
                    env=rank_env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                )
            )
    except OSError as e:
        stop_all(procs)
        raise AssayError(f"cannot run the entrypoint {command[0]!r}: {e.strerror or e}") from None
    pumps = []
    for rank, proc in enumerate(procs):
        lines: list[str] = []
        tails.append(lines)
        assert proc.stdout is not None
        prefix = f"[rank {rank}] " if slots > 1 else ""
        pump = threading.Thread(
            target=pump_output, args=(proc.stdout, prefix, sys.stderr, lines), daemon=True
        )
        pump.start()
        pumps.append(pump)
    try:
        failed = wait_all(procs, early)
    finally:
        stop_all(procs)
    for pump in pumps:
        pump.join(timeout=5)
    return failed if failed is not None else (0, 0)


def run_script_local(
    raw: Mapping[str, Any],
    model_dir: str | Path,
    *,
    checkpoint_dir: Path,
    resume_from: str | Path | None = None,
) -> Any:
    """`assay trial run-local` for a script entrypoint; returns a `LocalResult`."""
    from assay._backend import read_local_records
    from assay._banner import local_hparams
    from assay.common.spec import LOCAL_SPEC_ENV, LocalResult, LocalSpec
    from assay.config import environment_of, parse_config, searcher_in_batches

    config = parse_config(raw)
    assert config.command is not None
    problem = missing_script(config.command, model_dir)
    if problem is not None:
        raise AssayError(problem)
    if config.searcher.max_length.bounded:
        # The master converts a script's lengths to batches (it cannot see the loader) and
        # refuses what it cannot convert; here the Trainer API counts epochs from its
        # loader, but a Core API script would read the raw number as batches: say so.
        try:
            searcher_in_batches(config)
        except InvalidConfigError as e:
            log.warning(
                "%s; a cluster refuses this config, and here a Core API script reads %d as "
                "its length in batches (the Trainer API counts epochs from its data loader)",
                "; ".join(e.problems),
                config.searcher.trial_length.value,
            )
    slots = config.resources.slots_per_trial
    hparams = local_hparams(config)  # what run-local's first line announced
    latest = restore_dir = None
    if resume_from is not None:
        resume = Path(resume_from).resolve()
        latest, restore_dir = resume.name, str(resume.parent)
    with tempfile.TemporaryDirectory(prefix="assay-local-") as tmp:
        metrics_path = Path(tmp) / "metrics.jsonl"
        spec = LocalSpec(
            config=dict(raw),
            hparams=hparams,
            trial_seed=config.experiment_seed,
            checkpoint_dir=str(checkpoint_dir),
            metrics_path=str(metrics_path),
            latest_checkpoint=latest,
            restore_dir=restore_dir,
        )
        spec_path = Path(tmp) / "spec.json"
        spec.write(spec_path)
        env = dict(os.environ)
        env.update(environment_of(raw, _device_kind()))
        env[LOCAL_SPEC_ENV] = str(spec_path)
        tails: list[list[str]] = []
        early: list[int] = []
        rank, code = spawn_ranks(
            config.command,
            slots,
            env=env,
            cwd=Path(model_dir).resolve(),
            tail=tails,
            early=early,
        )
        records = read_local_records(metrics_path)
    if code not in (0, PREEMPTED_EXIT_CODE):
        last = "\n".join(f"  {line}" for line in tails[rank][-15:]) or "  (none)"
        hint = collective_mismatch_hint(last) + early_exit_hint(early)
        if code == INVALID_HP_EXIT_CODE:
            hint += (
                " (assay.InvalidHP: on a cluster the searcher replaces the trial with "
                "another, without counting it toward max_trials)"
            )
        raise TrainingError(
            f"the entrypoint {config.entrypoint!r} (rank {rank}) exited with code {code}"
            f"{hint}; its last output:\n{last}"
        )
    return _result(records, hparams, LocalResult)


def _device_kind() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _result(records: list[dict[str, Any]], hparams: dict[str, Any], result_type: Any) -> Any:
    training: list[dict[str, Any]] = []
    validation: list[dict[str, Any]] = []
    checkpoint = None
    steps = 0
    for record in records:
        if "checkpoint" in record:
            checkpoint = record["location"]
        elif record.get("group") in ("training", "validation"):
            # Reports at one step are one entry, as the master merges them.
            history = validation if record["group"] == "validation" else training
            at = record["steps_completed"]
            if history and history[-1]["total_batches"] == at:
                history[-1]["metrics"] = {**history[-1]["metrics"], **record["metrics"]}
            else:
                history.append({"total_batches": at, "epoch": 0, "metrics": record["metrics"]})
        steps = max(steps, int(record.get("steps_completed", 0)))
    return result_type(
        total_batches=steps,
        validation_metrics=dict(validation[-1]["metrics"]) if validation else {},
        checkpoint=checkpoint,
        hparams=hparams,
        training_history=training,
        validation_history=validation,
    )


__all__ = [
    "LAUNCHER",
    "exec_command",
    "launcher_trial",
    "missing_script",
    "resolve_command",
    "script_file",
    "script_problem",
    "run_script_local",
    "spawn_ranks",
]
