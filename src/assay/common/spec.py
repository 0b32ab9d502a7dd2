"""The specs a trial's processes start from, and what a local run hands back: plain JSON,
read and written without importing torch.

- `ClusterSpec`: the JSON file the agent writes for every allocation and names in
  `ASSAY_TRIAL_SPEC` (config, hyperparameters, ids, the master's address and the
  allocation's token, where to restore from). The agent builds it with this class and
  `write`s it; the harness `load`s it: one definition of its keys.
- `LocalSpec`: what `assay trial run-local` gives a script entrypoint in
  `ASSAY_LOCAL_SPEC` (config, hyperparameters, where checkpoints and metrics go).
- `WorkerSpec`: what one slot's process of a Trial needs (`python -m assay._worker
  SPEC.json`, or `run_worker` in-process); `LocalResult`: what rank 0 hands back.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from assay.errors import AssayError

SPEC_ENV = "ASSAY_TRIAL_SPEC"
LOCAL_SPEC_ENV = "ASSAY_LOCAL_SPEC"


@dataclass(frozen=True)
class ClusterSpec:
    """The contents of ASSAY_TRIAL_SPEC."""

    config: dict[str, Any]
    hparams: dict[str, Any]
    trial_seed: int
    trial_id: int
    run_id: int
    experiment_id: int
    allocation_id: str
    checkpoint_root: str
    restore_from: str | None
    trial_api: str
    token: str
    # The sha256 of every file of `restore_from` (its metadata.json too) as the master
    # recorded them; None when it recorded none (a checkpoint reported by an older Assay).
    restore_sha256: dict[str, str] | None = None

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "the trial spec") -> ClusterSpec:
        if not isinstance(data, Mapping):
            raise AssayError(f"{source} must be a JSON object")
        problems: list[str] = []

        def get(key: str, kind: type | tuple[type, ...], *, nullable: bool = False) -> Any:
            if key not in data:
                problems.append(f"{key}: missing")
                return None
            value = data[key]
            if value is None and nullable:
                return None
            if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
                problems.append(f"{key}: expected {_kind_name(kind)}, got {value!r}")
            return value

        # Keyword arguments, not a dict: a field renamed, or added without a default, is a
        # type error here.
        spec = cls(
            config=get("config", dict),
            hparams=get("hparams", dict),
            trial_seed=get("trial_seed", int),
            trial_id=get("trial_id", int),
            run_id=get("run_id", int),
            experiment_id=get("experiment_id", int),
            allocation_id=get("allocation_id", str),
            checkpoint_root=get("checkpoint_root", str),
            restore_from=get("restore_from", str, nullable=True),
            trial_api=get("trial_api", str),
            token=get("token", str),
            restore_sha256=_sha256_map(data.get("restore_sha256"), problems),
        )
        if problems:
            raise AssayError(f"{source} is invalid: {'; '.join(problems)}")
        return spec

    def to_dict(self) -> dict[str, Any]:
        """The JSON object `from_dict` reads back."""
        return asdict(self)

    def write(self, path: Path) -> None:
        """Write the spec to `path`, readable by its owner only (it holds the token that
        authenticates the trial's processes to the master)."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(self.to_dict(), f, indent=2)

    @classmethod
    def load(cls, path: str | Path) -> ClusterSpec:
        try:
            data = json.loads(Path(path).read_text())
        except OSError as e:
            raise AssayError(f"cannot read trial spec {path}: {e.strerror or e}") from None
        except ValueError as e:
            raise AssayError(f"trial spec {path} is not valid JSON: {e}") from None
        return cls.from_dict(data, source=f"trial spec {path}")


def _sha256_map(value: Any, problems: list[str]) -> dict[str, str] | None:
    """`restore_sha256`: absent or null (no record), else file name -> sha256."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        problems.append(f"restore_sha256: expected an object of strings, got {value!r}")
        return None
    return dict(value)


def _kind_name(kind: type | tuple[type, ...]) -> str:
    names = {dict: "an object", int: "an integer", str: "a string"}
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(names.get(k, k.__name__) for k in kinds)


@dataclass(frozen=True)
class LocalSpec:
    """The contents of ASSAY_LOCAL_SPEC: a script's run under `assay trial run-local`."""

    config: dict[str, Any]
    hparams: dict[str, Any]
    trial_seed: int
    checkpoint_dir: str
    metrics_path: str
    latest_checkpoint: str | None = None
    # Where `latest_checkpoint` lives when it is not in `checkpoint_dir`.
    restore_dir: str | None = None
    trial_id: int = 0

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))

    @classmethod
    def load(cls, path: str | Path) -> LocalSpec:
        try:
            data = json.loads(Path(path).read_text())
            return cls(**data)
        except (OSError, ValueError, TypeError) as e:
            raise AssayError(f"cannot read the local run spec {path}: {e}") from None


@dataclass(frozen=True)
class WorkerSpec:
    """Everything one slot's process needs; serialised as JSON for launched workers."""

    config: dict[str, Any]
    model_dir: str | None
    checkpoint_dir: str
    resume_from: str | None = None
    # The master's record of `resume_from`'s files (name -> sha256), checked before loading.
    resume_sha256: dict[str, str] | None = None
    result_path: str | None = None
    trial_id: int = 0
    # Given by the master on a cluster; None samples them from `experiment_seed` (run_local).
    hparams: dict[str, Any] | None = None
    trial_seed: int | None = None


@dataclass(frozen=True)
class LocalResult:
    """What `run_local` returns (and `assay trial run-local --json` prints)."""

    total_batches: int
    validation_metrics: dict[str, float]
    checkpoint: str | None
    hparams: dict[str, Any] = field(default_factory=dict)
    training_history: list[dict[str, Any]] = field(default_factory=list)
    validation_history: list[dict[str, Any]] = field(default_factory=list)
    # The `system` group: each rank's peak memory and step time (see `assay._rank_metrics`).
    system_history: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "total_batches": self.total_batches,
            "validation_metrics": self.validation_metrics,
            "checkpoint": self.checkpoint,
            "hparams": self.hparams,
            "training_history": self.training_history,
            "validation_history": self.validation_history,
            "system_history": self.system_history,
        }


def spec_from_env(
    env: Mapping[str, str] | None = None,
) -> ClusterSpec | LocalSpec | None:
    """This process's spec: a cluster trial's, a run-local script's, or None (neither)."""
    env = os.environ if env is None else env
    if env.get(SPEC_ENV):
        return ClusterSpec.load(env[SPEC_ENV])
    if env.get(LOCAL_SPEC_ENV):
        return LocalSpec.load(env[LOCAL_SPEC_ENV])
    return None


__all__ = [
    "LOCAL_SPEC_ENV",
    "SPEC_ENV",
    "ClusterSpec",
    "LocalResult",
    "LocalSpec",
    "WorkerSpec",
    "spec_from_env",
]
