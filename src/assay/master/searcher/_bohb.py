"""BOHB's sampler (Falkner et al., ICML 2018) inside ASHA: a density model per rung.

ASHA's rungs are the budgets. Every trial's hyperparameters are a point `x` of the unit
cube (a double and an int scaled to [0, 1], a log type in its exponent, an int as the
centre of its cell, a categorical as the index of its value; constants and one-value
ranges are not searched, so `d` counts only what is). The rule for a new trial:

1. With probability `random_fraction` (default 1/3), or when no rung qualifies, the trial
   gets the random sampler's draw for its index (the same point `sampler: random` gives).
2. Otherwise the model is fitted on the HIGHEST rung whose best 15% hold at least `d + 1`
   results, i.e. with at least `ceil((d + 1) / 0.15)` results (34 for 4 searched
   hyperparameters, 74 for 10): its results sorted (a result that is not finite is worst;
   ties by trial index), the good set is the best `floor(0.15 * n)`, the bad set the next
   `max(d + 1, floor(0.85 * n))` of the rest. `l` and `g` are products of one kernel per
   dimension over the good and bad sets: Gaussian for a scaled value, Aitchison-Aitken
   for a categorical (the same value has weight `1 - bw`, each other `bw / (c - 1)`).
   The bandwidth is the normal-reference rule `1.06 * std * n ** (-1 / (4 + d))` of the
   set, floored at 1e-3 (a categorical's also capped at `(c - 1) / c`).
3. 64 candidates are drawn from `l` with the bandwidths widened 3 times (a scaled value
   from a Gaussian truncated to [0, 1], a categorical kept with probability `1 - bw`,
   else uniform), and the one with the largest `l(x) / g(x)` is proposed.

These are HpBandSter's defaults (top_n_percent 15, min_points_in_model d + 1, num_samples
64, bandwidth_factor 3, min_bandwidth 1e-3, random_fraction 1/3) but for one: HpBandSter
models a budget from `2 * (d + 1)` results, padding the good set to `d + 1` points. In
Hyperband every budget is also sampled directly, so its results span the space; in ASHA
a rung above the bottom holds only promoted trials, already the best `1 / divisor ** k`,
and a padded good set there (the best 5 of 10 for d = 4) is the better half of a chosen
few, ranked by noise. Requiring a true top 15% makes such a rung wait until it is
populated, and the bottom rungs, which hold every trial, are modelled meanwhile.

Proposals are pure functions of the history and the experiment seed: trial `i` draws from
`derive_seed(seed, "bohb", i)`, and the history (each trial's point and its result at
every length) is plain JSON in the snapshot. The fitted model of a rung is cached until
that rung gets a new result, so a proposal costs one fit per new result at the rung in
use plus a candidate evaluation over its results, not a refit on the whole history.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from assay.config import (
    Categorical,
    Const,
    Double,
    HParam,
    Int,
    Log,
    assemble,
    leaves,
    sample_hparams,
)

from ._samplers import derive_seed

TOP_N_PERCENT = 15
CANDIDATES = 64
BANDWIDTH_FACTOR = 3.0
MIN_BANDWIDTH = 1e-3

_Leaf = Const | Int | Double | Log | Categorical
_Array = NDArray[np.float64]


@dataclass(frozen=True)
class _Dim:
    path: tuple[str, ...]
    hp: Int | Double | Log | Categorical
    choices: int  # 0 for a scaled value, the number of values for a categorical


def _searched(hp: _Leaf) -> bool:
    if isinstance(hp, Const):
        return False
    if isinstance(hp, Categorical):
        return len(hp.vals) > 1
    return hp.maxval > hp.minval


def _encode(dim: _Dim, value: Any) -> float:
    hp = dim.hp
    if isinstance(hp, Categorical):
        return float(next(i for i, v in enumerate(hp.vals) if v == value))
    if isinstance(hp, Int):
        return (int(value) - hp.minval + 0.5) / (hp.maxval - hp.minval + 1)
    v = math.log(value, hp.base) if isinstance(hp, Log) else float(value)
    return min(max((v - hp.minval) / (hp.maxval - hp.minval), 0.0), 1.0)


def _decode(dim: _Dim, x: float) -> Any:
    hp = dim.hp
    if isinstance(hp, Categorical):
        return hp.vals[int(x)]
    if isinstance(hp, Int):
        cell = math.floor(x * (hp.maxval - hp.minval + 1))
        return hp.minval + min(max(cell, 0), hp.maxval - hp.minval)
    value = hp.minval + x * (hp.maxval - hp.minval)
    return hp.base**value if isinstance(hp, Log) else value


class _Density:
    """A product-kernel density over one set of points (rows of `data`)."""

    def __init__(self, data: _Array, choices: NDArray[np.int64]) -> None:
        n, d = data.shape
        self.data = data
        self.cat = choices > 0
        self.choices = choices
        bw = 1.06 * data.std(axis=0) * n ** (-1.0 / (4 + d))
        cap = np.where(self.cat, (choices - 1) / np.maximum(choices, 1), np.inf)
        self.bw = np.minimum(np.maximum(bw, MIN_BANDWIDTH), cap)

    def log_pdf(self, points: _Array) -> _Array:
        """log l(x) for each row of `points` (a Gaussian KDE is not truncated, as BOHB's)."""
        n = len(self.data)
        total = np.zeros((len(points), n))
        cont = ~self.cat
        if cont.any():
            bw = self.bw[cont]
            a, b = points[:, cont] / bw, self.data[:, cont] / bw
            sq = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * a @ b.T
            total -= 0.5 * np.maximum(sq, 0.0)
            total -= np.log(bw).sum() + 0.5 * math.log(2 * math.pi) * int(cont.sum())
        for j in np.flatnonzero(self.cat):
            lam, c = self.bw[j], self.choices[j]
            same = points[:, j][:, None] == self.data[:, j][None, :]
            total += np.where(same, math.log1p(-lam), math.log(lam / (c - 1)))
        peak = total.max(axis=1, keepdims=True)
        log_pdf: _Array = peak[:, 0] + np.log(np.exp(total - peak).sum(axis=1)) - math.log(n)
        return log_pdf

    def sample(self, rng: np.random.Generator, count: int) -> _Array:
        """`count` draws near the set's points, bandwidths widened BANDWIDTH_FACTOR times."""
        centres = self.data[rng.integers(0, len(self.data), size=count)]
        out = centres.copy()
        for j in range(self.data.shape[1]):
            m = centres[:, j]
            if self.cat[j]:
                keep = rng.random(count) < 1 - self.bw[j]
                out[:, j] = np.where(keep, m, rng.integers(0, self.choices[j], size=count))
            else:
                out[:, j] = _truncated_normal(rng, m, BANDWIDTH_FACTOR * self.bw[j])
        return out


def _truncated_normal(rng: np.random.Generator, mean: _Array, scale: float) -> _Array:
    """Draws of N(mean, scale) truncated to [0, 1], by rejection: each mean lies in
    [0, 1], so at least 1/4 of the draws are kept even for a wide scale."""
    out = rng.normal(mean, scale)
    for _ in range(100):
        outside = (out < 0.0) | (out > 1.0)
        if not outside.any():
            break
        out[outside] = rng.normal(mean[outside], scale)
    result: _Array = np.clip(out, 0.0, 1.0)
    return result


class _Model:
    """The good (`l`) and bad (`g`) densities of one rung."""

    def __init__(self, ranked: _Array, choices: NDArray[np.int64]) -> None:
        n, d = ranked.shape
        n_good = max(d + 1, n * TOP_N_PERCENT // 100)
        n_bad = max(d + 1, n * (100 - TOP_N_PERCENT) // 100)
        self.good = _Density(ranked[:n_good], choices)
        self.bad = _Density(ranked[n_good : n_good + n_bad], choices)

    def propose(self, rng: np.random.Generator) -> _Array:
        candidates = self.good.sample(rng, CANDIDATES)
        floor = math.log(1e-32)
        score = np.maximum(self.good.log_pdf(candidates), floor) - np.maximum(
            self.bad.log_pdf(candidates), floor
        )
        return candidates[int(np.argmax(score))]  # type: ignore[no-any-return]


class BOHBSampler:
    """Proposals from a density model of the highest rung with enough results (module doc)."""

    def __init__(self, space: Mapping[str, HParam], seed: int, random_fraction: float) -> None:
        self._space = space
        self._seed = seed
        self.random_fraction = random_fraction
        self._consts = {path: hp.val for path, hp in leaves(space) if isinstance(hp, Const)}
        self._dims = [
            _Dim(path, hp, len(hp.vals) if isinstance(hp, Categorical) else 0)
            for path, hp in leaves(space)
            if _searched(hp) and not isinstance(hp, Const)
        ]
        self._fixed = {
            path: _decode(_Dim(path, hp, 0), 0.0)
            for path, hp in leaves(space)
            if not _searched(hp) and not isinstance(hp, Const)
        }
        self._choices = np.array([d.choices for d in self._dims], dtype=np.int64)
        # request_id -> {"index", "x" (the point), "results" {length: value}, "model" (the
        # rung length whose model proposed it, None for a random draw)}
        self.history: dict[str, dict[str, Any]] = {}
        self._rungs: dict[int, dict[str, float | None]] = {}
        self._models: dict[int, _Model] = {}

    @property
    def min_points(self) -> int:
        """Results a rung needs before it is modelled: d + 1 in its best 15%."""
        return -(-100 * (len(self._dims) + 1) // TOP_N_PERCENT)

    def propose(self, index: int, request_id: str) -> dict[str, Any]:
        rng = np.random.default_rng(derive_seed(self._seed, "bohb", index))
        length = None
        if self._dims and rng.random() >= self.random_fraction:
            length = self.model_rung()
        if length is None:
            hparams = sample_hparams(
                self._space, random.Random(derive_seed(self._seed, "hparams", index))
            )
            x = [_encode(d, _get(hparams, d.path)) for d in self._dims]
        else:
            point = self._model(length).propose(rng)
            x = [float(v) for v in point]
            values = {d.path: _decode(d, v) for d, v in zip(self._dims, x, strict=True)}
            hparams = assemble(self._space, {**self._consts, **self._fixed, **values})
        self.history[request_id] = {"index": index, "x": x, "results": {}, "model": length}
        return hparams

    def model_rung(self) -> int | None:
        """The length of the highest rung with at least `min_points` results, if any."""
        for length in sorted(self._rungs, reverse=True):
            if len(self._rungs[length]) >= self.min_points:
                return length
        return None

    def _model(self, length: int) -> _Model:
        model = self._models.get(length)
        if model is None:
            rung = self._rungs[length]
            order = sorted(
                rung,
                key=lambda rid: (
                    math.inf if rung[rid] is None else rung[rid],
                    self.history[rid]["index"],
                ),
            )
            ranked = np.array([self.history[rid]["x"] for rid in order], dtype=np.float64)
            model = self._models[length] = _Model(ranked, self._choices)
        return model

    def observe(self, request_id: str, length: int, value: float | None) -> None:
        entry = self.history.get(request_id)
        if entry is None:
            return
        entry["results"][length] = value
        self._rungs.setdefault(length, {})[request_id] = value
        self._models.pop(length, None)

    def forget(self, request_id: str) -> None:
        entry = self.history.pop(request_id, None)
        if entry is None:
            return
        for length in entry["results"]:
            self._rungs[length].pop(request_id, None)
            self._models.pop(length, None)

    def snapshot(self) -> dict[str, Any]:
        return {
            "history": {
                rid: [
                    e["index"],
                    list(e["x"]),
                    [[k, v] for k, v in e["results"].items()],
                    e["model"],
                ]
                for rid, e in self.history.items()
            },
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        self.history, self._rungs, self._models = {}, {}, {}
        for rid, (index, x, results, model) in state["history"].items():
            if len(x) != len(self._dims):
                raise ValueError(
                    f"the snapshot's bohb points have {len(x)} dimensions; the "
                    f"hyperparameters search {len(self._dims)}"
                )
            self.history[rid] = {
                "index": int(index),
                "x": [float(v) for v in x],
                "results": {},
                "model": None if model is None else int(model),
            }
            for length, value in results:
                self.observe(rid, int(length), None if value is None else float(value))


def _get(hparams: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = hparams
    for name in path:
        value = value[name]
    return value
