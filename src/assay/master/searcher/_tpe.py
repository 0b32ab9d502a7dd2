"""Hyperparameters proposed by Optuna's TPE sampler, used as a library.

No Optuna object outlives a proposal: the history (each trial's parameters and its result
at the longest length it validated at) is plain JSON in the snapshot, and every proposal
rebuilds an in-memory study from it with `TPESampler(seed=derive(seed, index))`. So the
same history gives the same proposal, also after a restore. Optuna is imported on the
first proposal only.

Parameters live in Optuna's space: nested names are joined with dots, an int is an
`IntDistribution`, a double a `FloatDistribution`, a log type a `FloatDistribution` over
its exponent, and a categorical a `CategoricalDistribution` over the indices of its
values (so any YAML value works as a choice). Constants are not searched.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from assay.config import Categorical, Const, Double, HParam, Int, Log, assemble, leaves

from ._samplers import derive_seed

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution

_Leaf = Const | Int | Double | Log | Categorical


def _optuna() -> Any:
    """Import Optuna, quietly: no INFO line per trial, no experimental warnings."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


class TPESampler:
    """Tree-structured Parzen estimator proposals over the experiment's results so far."""

    def __init__(self, space: Mapping[str, HParam], seed: int) -> None:
        self._space = space
        self._seed = seed
        self._leaves: dict[str, tuple[tuple[str, ...], _Leaf]] = {}
        for path, hp in leaves(space):
            name = ".".join(path)
            if name in self._leaves:
                raise ValueError(f"hyperparameters: two entries are both named {name!r}")
            self._leaves[name] = (path, hp)
        # request_id -> {"params": {name: value}, "length": int, "value": float | None}
        self.history: dict[str, dict[str, Any]] = {}

    def propose(self, index: int, request_id: str) -> dict[str, Any]:
        searched = {n: hp for n, (_, hp) in self._leaves.items() if not isinstance(hp, Const)}
        params: dict[str, Any] = {}
        if searched:
            params = self._ask(index, searched)
        self.history[request_id] = {"params": params, "length": 0, "value": None}
        return self._hparams(params)

    def _ask(self, index: int, searched: Mapping[str, _Leaf]) -> dict[str, Any]:
        optuna = _optuna()
        distributions = {name: _distribution(optuna, hp) for name, hp in searched.items()}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            sampler = optuna.samplers.TPESampler(
                seed=derive_seed(self._seed, "tpe", index), multivariate=True
            )
            study = optuna.create_study(direction="minimize", sampler=sampler)
            for entry in self.history.values():
                if entry["value"] is not None:
                    study.add_trial(
                        optuna.trial.create_trial(
                            params=entry["params"],
                            distributions=distributions,
                            value=entry["value"],
                        )
                    )
            trial = study.ask(distributions)
        return {name: trial.params[name] for name in distributions}

    def _hparams(self, params: Mapping[str, Any]) -> dict[str, Any]:
        values = {path: _value(hp, params.get(name)) for name, (path, hp) in self._leaves.items()}
        return assemble(self._space, values)

    def observe(self, request_id: str, length: int, value: float | None) -> None:
        entry = self.history.get(request_id)
        if entry is not None and length >= entry["length"]:
            entry["length"], entry["value"] = length, value

    def forget(self, request_id: str) -> None:
        self.history.pop(request_id, None)

    def snapshot(self) -> dict[str, Any]:
        return {
            "history": {rid: dict(e, params=dict(e["params"])) for rid, e in self.history.items()}
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        self.history = {
            rid: {"params": dict(e["params"]), "length": int(e["length"]), "value": e["value"]}
            for rid, e in state["history"].items()
        }


def _distribution(optuna: Any, hp: _Leaf) -> BaseDistribution:
    dists = optuna.distributions
    if isinstance(hp, Int):
        return dists.IntDistribution(hp.minval, hp.maxval)  # type: ignore[no-any-return]
    if isinstance(hp, Double | Log):
        return dists.FloatDistribution(hp.minval, hp.maxval)  # type: ignore[no-any-return]
    if isinstance(hp, Categorical):
        return dists.CategoricalDistribution(list(range(len(hp.vals))))  # type: ignore[no-any-return]
    raise TypeError(f"no distribution for {hp!r}")


def _value(hp: _Leaf, param: Any) -> Any:
    """The user-facing value of an Optuna parameter (the constant's value for a Const)."""
    if isinstance(hp, Const):
        return hp.val
    if isinstance(hp, Int):
        return int(param)
    if isinstance(hp, Log):
        return hp.base ** float(param)
    if isinstance(hp, Double):
        return float(param)
    return hp.vals[int(param)]
