"""`run_local`: train one trial on this machine exactly as a cluster slot would.

One slot runs in this process (breakpoints work); several slots are launched as one
process each with the torch.distributed environment, the way an agent launches them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from assay._banner import banner
from assay._checkpoint import check_writable
from assay._rank_processes import free_port, pump_output, stop_all, wait_all
from assay.common.archive import make_local_output_dir
from assay.common.spawn import dying_with
from assay.common.spec import LocalResult, WorkerSpec
from assay.config import ExperimentConfig, environment_of, load_config, parse_config
from assay.errors import InvalidConfigError, TrainingError, collective_mismatch_hint

if TYPE_CHECKING:
    from assay._trial import Trial

log = logging.getLogger("assay")


def _with_slots(raw: Mapping[str, Any], slots: int | None) -> dict[str, Any]:
    data = dict(raw)
    if slots is not None:
        resources = dict(data.get("resources") or {})
        resources["slots_per_trial"] = slots
        data["resources"] = resources
    return data


def _coerce_config(config: ExperimentConfig | Mapping[str, Any] | str | Path) -> dict[str, Any]:
    if isinstance(config, ExperimentConfig):
        return dict(config.raw)
    if isinstance(config, str | Path):
        return dict(load_config(config).raw)
    return dict(config)


def run_local(
    trial: type[Trial] | None = None,
    config: ExperimentConfig | Mapping[str, Any] | str | Path | None = None,
    *,
    model_dir: str | Path | None = None,
    slots: int | None = None,
    checkpoint_dir: str | Path | None = None,
    resume_from: str | Path | None = None,
) -> LocalResult:
    """Train one trial locally (searcher `single`) and return its final metrics.

    `trial` is a Trial class, or None to load `config`'s `entrypoint` from `model_dir`.
    `slots` overrides `resources.slots_per_trial`; with more than one slot, one process per
    slot is launched (gloo on CPU, NCCL on GPUs). `resume_from` is a checkpoint directory to
    continue from (counters, data position and RNG included).

    Progress (a first line saying what it trains, then metrics and checkpoints) is logged
    to the `assay` logger at INFO; when logging is not configured (a notebook), it goes to
    stderr for the duration of the call.
    """
    if config is None:
        raise InvalidConfigError(["<config>: run_local needs an experiment config"])
    raw = _with_slots(_coerce_config(config), slots)
    parsed = parse_config(raw)
    with progress_logging():
        log.info("%s", banner(parsed))  # before torch is imported: it takes seconds
        return _run(trial, raw, parsed, model_dir, checkpoint_dir, resume_from)


@contextlib.contextmanager
def progress_logging() -> Iterator[None]:
    """Show the `assay` logger's INFO lines on stderr while a local run lasts, unless
    logging is configured (a handler on it or the root logger): as Lightning does, so a
    notebook shows progress without `logging.basicConfig`."""
    if log.hasHandlers():
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    level = log.level
    log.addHandler(handler)
    if log.getEffectiveLevel() > logging.INFO:
        log.setLevel(logging.INFO)
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def _run(
    trial: type[Trial] | None,
    raw: dict[str, Any],
    parsed: ExperimentConfig,
    model_dir: str | Path | None,
    checkpoint_dir: str | Path | None,
    resume_from: str | Path | None,
) -> LocalResult:
    if trial is not None and model_dir is None and parsed.resources.slots_per_trial > 1:
        model_dir, entry = _entrypoint_of(trial)
        raw["entrypoint"] = entry
        trial = None
    if trial is None and model_dir is None:
        raise InvalidConfigError(["<config>: give run_local a Trial class or a model_dir"])
    chosen = checkpoint_dir or _storage_dir(parsed)
    ckpt_dir = Path(chosen or "checkpoints").resolve()
    if chosen is None:  # ./checkpoints: kept out of the model directory's archive
        with contextlib.suppress(OSError):  # _check_writable says what is wrong
            make_local_output_dir(ckpt_dir)
    _check_writable(ckpt_dir)
    if parsed.is_script:
        from assay._script import run_script_local

        if model_dir is None:
            raise InvalidConfigError(["<config>: a script entrypoint needs a model_dir"])
        scripted: LocalResult = run_script_local(
            raw, model_dir, checkpoint_dir=ckpt_dir, resume_from=resume_from
        )
        return scripted
    spec = WorkerSpec(
        config=raw,
        model_dir=str(Path(model_dir).resolve()) if model_dir is not None else None,
        checkpoint_dir=str(ckpt_dir),
        resume_from=str(Path(resume_from).resolve()) if resume_from is not None else None,
    )
    if parsed.resources.slots_per_trial == 1:
        from assay._worker import run_worker  # here, not at the top: it imports torch

        with _environment(_config_environment(raw)):
            result = run_worker(spec, trial_class=trial, env={})
        assert result is not None
        return result
    return _launch(spec, parsed.resources.slots_per_trial)


def _storage_dir(config: ExperimentConfig) -> Path | None:
    storage = config.checkpoint_storage
    if storage.type != "shared_fs":
        log.warning("run-local writes checkpoints to a local directory, not to %s", storage.type)
        return None
    if storage.host_directory is None:
        return Path(storage.storage_path) if storage.storage_path else None
    return storage.host_directory


def _check_writable(directory: Path) -> None:
    """Fail before training, not at the first checkpoint, if checkpoints cannot be written."""
    check_writable(directory, "pass a writable --checkpoint-dir (or checkpoint_storage.host_path)")


def _entrypoint_of(trial: type[Trial]) -> tuple[Path, str]:
    """The model directory and `module:Class` that re-import `trial` in a new process."""
    module = sys.modules.get(trial.__module__)
    file = getattr(module, "__file__", None)
    if file is None or "<locals>" in trial.__qualname__:
        raise TrainingError(
            f"{trial.__qualname__} must be defined at the top level of a Python file to run "
            "on several slots; or pass model_dir= and an entrypoint in the config"
        )
    path = Path(file).resolve()
    if trial.__module__ == "__main__":
        return path.parent, f"{path.stem}:{trial.__qualname__}"
    root = path.parent
    for _ in range(trial.__module__.count(".")):
        root = root.parent
    return root, f"{trial.__module__}:{trial.__qualname__}"


def _launch(spec: WorkerSpec, slots: int) -> LocalResult:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="assay-local-") as tmp:
        result_path = Path(tmp) / "result.json"
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps({**spec.__dict__, "result_path": str(result_path)}))
        threads_per_slot = max(1, (os.cpu_count() or 1) // slots)
        procs: list[subprocess.Popen[bytes]] = []
        tails: list[list[str]] = []
        pumps: list[threading.Thread] = []
        for rank in range(slots):
            env = {**os.environ, **_config_environment(spec.config)}
            env.update(
                RANK=str(rank),
                WORLD_SIZE=str(slots),
                LOCAL_RANK=str(rank),
                LOCAL_WORLD_SIZE=str(slots),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                PYTHONUNBUFFERED="1",
            )
            env.setdefault("OMP_NUM_THREADS", str(threads_per_slot))
            proc = subprocess.Popen(
                dying_with([sys.executable, "-m", "assay._worker", str(spec_path)], os.getpid()),
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            procs.append(proc)
        # Readers start once every child exists: no thread runs while a child forks.
        for rank, proc in enumerate(procs):
            tail: list[str] = []
            tails.append(tail)
            assert proc.stdout is not None
            pump = threading.Thread(
                target=pump_output,
                args=(proc.stdout, f"[rank {rank}] ", sys.stderr, tail),
                daemon=True,
            )
            pump.start()
            pumps.append(pump)
        try:
            failed = wait_all(procs)
        finally:
            stop_all(procs)  # on an interrupt too: no worker outlives its launcher
        for pump in pumps:
            pump.join(timeout=5)
        if failed is not None:
            rank, code = failed
            raise TrainingError(_failure_message(Path(tmp), rank, code, tails[rank]))
        if not result_path.exists():
            raise TrainingError("rank 0 exited without writing its result")
        data = json.loads(result_path.read_text())
        return LocalResult(**data)


def _config_environment(config: Mapping[str, Any]) -> dict[str, str]:
    """`environment.environment_variables` for this machine's slots (cuda when it has one)."""
    import torch

    return environment_of(config, "cuda" if torch.cuda.is_available() else "cpu")


@contextlib.contextmanager
def _environment(variables: Mapping[str, str]) -> Iterator[None]:
    """Set `variables` in this process (the in-process slot) while training; restore after."""
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _failure_message(tmp: Path, rank: int, code: int, tail: list[str]) -> str:
    error_file = tmp / f"error-{rank}.txt"
    if error_file.exists():
        return error_file.read_text().strip()
    last = "\n".join(f"  {line}" for line in tail[-15:])
    hint = collective_mismatch_hint(last)
    return f"rank {rank} exited with code {code}{hint}; its last output:\n{last}"


__all__ = ["run_local"]
