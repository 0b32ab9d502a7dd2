"""What the simulated users submit: a tiny model archive, and random small experiments."""

from __future__ import annotations

import functools
import io
import random
import tarfile
from typing import Any


@functools.cache
def model_archive() -> bytes:
    """A tiny valid model directory (the master only stores and forwards it)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        data = b"# the Trial lives here\n"
        info = tarfile.TarInfo("model_def.py")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def experiment_config(rng: random.Random) -> dict[str, Any]:
    """A small experiment: one of the searchers, a short length, 1-2 slots per trial."""
    name = rng.choice(["single", "random", "grid", "asha", "adaptive_asha"])
    length = rng.choice([4, 8, 16])
    searcher: dict[str, Any] = {
        "name": name,
        "metric": "loss",
        "smaller_is_better": rng.random() < 0.8,
        "max_length": {"batches": length},
    }
    if name != "single":
        searcher["max_concurrent_trials"] = rng.choice([0, 1, 2])
    if name == "random":
        searcher["max_trials"] = rng.randint(1, 4)
    elif name in ("asha", "adaptive_asha"):
        searcher["max_trials"] = rng.randint(2, 5)
        searcher["max_length"] = {"batches": 16}
        searcher["num_rungs" if name == "asha" else "max_rungs"] = 2
    # A Trial class, or now and then a script (exiting 0 before its target ends it).
    script = rng.random() < 0.2
    return {
        "name": f"sim-{name}",
        "entrypoint": "python3 model_def.py" if script else "model_def:T",
        "hyperparameters": {
            "global_batch_size": 8,
            "lr": {"type": "double", "minval": 0.001, "maxval": 0.1, "count": 2},
            "opt": {"type": "categorical", "vals": ["sgd", "adam"]},
        },
        "searcher": searcher,
        "resources": {
            "slots_per_trial": rng.choice([1, 1, 2]),
            "priority": rng.choice([10, 42, 80]),
        },
        "max_restarts": rng.randint(0, 2),
        "reproducibility": {"experiment_seed": rng.randrange(1000)},
    }
