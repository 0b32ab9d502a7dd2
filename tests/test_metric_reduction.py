"""The reduction of validation metrics, unit by unit: AVG weighs each batch by its number
of samples (exactly across ranks), BATCH_AVG counts each batch once, SUM/MIN/MAX take
every batch; what evaluate_batch may return; how a batch's samples are counted.
Through the training loop, on 1 to 3 slots: tests/test_validation_weights.py."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
import torch

import assay
from assay._metric_reduction import BatchMetrics, ReducerFactory, batch_samples, evaluation_output
from assay._trial import BuiltinReducer
from assay.errors import TrainingError

Reducer = assay.Reducer


class OneProcess:
    def allgather(self, obj: Any) -> list[Any]:
        return [obj]


class Ranks:
    """The summaries of several ranks, as `allgather` would give them to each."""

    def __init__(self) -> None:
        self.summaries: list[Any] = []

    def allgather(self, obj: Any) -> list[Any]:
        return [*self.summaries, obj]


def reduce(kind: Reducer, ranks: list[list[tuple[Any, Any]]]) -> float:
    """`kind` over ranks of (value, samples) batches."""
    reducers = [BuiltinReducer(kind) for _ in ranks]
    for reducer, batches in zip(reducers, ranks, strict=True):
        for value, samples in batches:
            reducer.update(value, samples)
    return reducers[0].cross_slot_reduce([r.per_slot_reduce() for r in reducers])


def test_avg_weighs_each_batch_by_its_samples_and_batch_avg_counts_batches() -> None:
    ranks = [[(0.5, 4), (1.0, 1)], [(0.0, 3)], []]  # the third rank had no batch
    assert reduce(Reducer.AVG, ranks) == pytest.approx((0.5 * 4 + 1.0 + 0.0) / 8)
    assert reduce(Reducer.BATCH_AVG, ranks) == pytest.approx(0.5)
    assert reduce(Reducer.SUM, ranks) == 1.5
    assert reduce(Reducer.MIN, ranks) == 0.0
    assert reduce(Reducer.MAX, ranks) == 1.0


def test_avg_of_batch_means_is_the_mean_of_the_samples_however_they_are_split() -> None:
    rng = random.Random(0)
    samples = [rng.random() for _ in range(50)]
    expected = sum(samples) / 50
    batch_means = set()
    for batch_size in (12, 6, 4, 7):
        for n_ranks in (1, 2, 3):
            batches = [samples[i : i + batch_size] for i in range(0, 50, batch_size)]
            ranks = [
                [(sum(b) / len(b), len(b)) for b in batches[r::n_ranks]] for r in range(n_ranks)
            ]
            assert reduce(Reducer.AVG, ranks) == pytest.approx(expected, abs=1e-12)
            batch_means.add(round(reduce(Reducer.BATCH_AVG, ranks), 12))
    assert len(batch_means) > 1  # the per-batch mean moves with the batch size


def test_values_and_weights_may_be_tensors() -> None:
    as_tensors = [[(torch.tensor(0.5), torch.tensor(4)), (torch.tensor([1.0]), torch.tensor(1.0))]]
    assert reduce(Reducer.AVG, as_tensors) == pytest.approx(3 / 5)


def test_an_average_with_no_samples_is_nan() -> None:
    assert math.isnan(reduce(Reducer.AVG, [[(1.0, 0)], []]))
    assert math.isnan(reduce(Reducer.AVG, [[], []]))
    assert math.isnan(reduce(Reducer.BATCH_AVG, [[]]))


@pytest.mark.parametrize("weight", [-1.0, float("inf"), float("nan")])
def test_a_bad_tensor_count_is_named_when_reduced_on_every_rank(weight: float) -> None:
    metrics = BatchMetrics(ReducerFactory(Reducer.AVG))
    metrics.add(({"acc": 1.0}, torch.tensor(weight)), None)  # no device sync per batch
    with pytest.raises(TrainingError, match="metric 'acc'.*samples must be finite and >= 0"):
        metrics.reduce(OneProcess())
    # Another rank's error is raised here too, after the collective.
    ranks = Ranks()
    ranks.summaries = [({}, "evaluate_batch for metric 'acc': bad")]
    with pytest.raises(TrainingError, match="metric 'acc': bad"):
        BatchMetrics(ReducerFactory(Reducer.AVG)).reduce(ranks)


def test_evaluate_batch_may_return_metrics_with_their_number_of_samples() -> None:
    metrics = {"loss": 1.0}
    assert evaluation_output(metrics) == (metrics, None)
    assert evaluation_output((metrics, 3)) == (metrics, 3.0)
    assert evaluation_output([metrics, 2.5]) == (metrics, 2.5)
    given, count = evaluation_output((metrics, torch.tensor([7])))
    assert given is metrics
    assert isinstance(count, torch.Tensor)
    assert float(count) == 7


@pytest.mark.parametrize(
    ("out", "message"),
    [
        (1.0, "got float"),
        (torch.tensor(1.0), "got a tensor of shape ()"),
        (({"loss": 1.0},), "got a tuple of 1"),
        (({"loss": 1.0}, 3, 4), "got a tuple of 3"),
        ((3, {"loss": 1.0}), "got a tuple of 2"),
        (({"loss": 1.0}, "3"), "num_samples must be a number or a one-element tensor, got str"),
        (({"loss": 1.0}, True), "num_samples must be a number.*got bool"),
        (({"loss": 1.0}, torch.ones(2)), "got a tensor of shape \\(2,\\)"),
        (({"loss": 1.0}, -1), "num_samples must be finite and >= 0, got -1"),
        (({"loss": 1.0}, float("nan")), "num_samples must be finite and >= 0, got nan"),
    ],
)
def test_anything_else_evaluate_batch_returns_is_refused(out: Any, message: str) -> None:
    with pytest.raises(TrainingError, match="evaluate_batch must return a dict of metrics, or"):
        evaluation_output(out)
    with pytest.raises(TrainingError, match=message):
        evaluation_output(out)


def test_a_batch_holds_as_many_samples_as_its_first_tensor_is_long() -> None:
    x, y = torch.zeros(5, 3), torch.zeros(5)
    assert batch_samples(x) == 5
    assert batch_samples((x, y)) == 5
    assert batch_samples({"ids": ["a", "b"], "x": torch.zeros(4, 2)}) == 4
    assert batch_samples([torch.tensor(1.0), [torch.zeros(6)]]) == 6  # a 0-dim one is skipped
    assert batch_samples(["a", "b"]) is None
    assert batch_samples({"n": 3}) is None
    assert batch_samples(torch.tensor(2.0)) is None


def test_the_count_evaluate_batch_returns_wins_over_the_samples_drawn() -> None:
    metrics = BatchMetrics(ReducerFactory({"loss": Reducer.AVG, "batches": Reducer.BATCH_AVG}))
    metrics.add(({"loss": 1.0, "batches": 1.0}, 9), 3)  # 9 tokens in 3 samples
    metrics.add({"loss": 0.0, "batches": 0.0}, 1)
    assert metrics.reduce(OneProcess()) == {"batches": 0.5, "loss": pytest.approx(0.9)}


def test_an_average_of_batches_of_unknown_size_says_how_to_give_it() -> None:
    metrics = BatchMetrics(ReducerFactory({"seen": Reducer.BATCH_AVG, "total": Reducer.SUM}))
    metrics.add({"seen": 1.0, "total": 2.0}, None)  # needs no count
    assert metrics.reduce(OneProcess()) == {"seen": 1.0, "total": 2.0}
    with pytest.raises(TrainingError) as raised:
        BatchMetrics(ReducerFactory(Reducer.AVG)).add({"acc": 1.0}, None)
    assert "metric 'acc'" in str(raised.value)
    assert "return (metrics, num_samples) from evaluate_batch" in str(raised.value)
    assert "Reducer.BATCH_AVG" in str(raised.value)
