"""Re-sharding of plain DataLoaders: ranks see exactly the samples of one big batch."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from assay._data import ShardedLoader
from assay.errors import TrainingError


def _dataset(n: int) -> TensorDataset:
    return TensorDataset(torch.arange(n))


def _ids(batches: object) -> list[list[int]]:
    return [batch[0].tolist() for batch in batches]  # type: ignore[attr-defined]


def _sharded(
    n: int,
    per_slot: int,
    rank: int,
    size: int,
    *,
    shuffle: bool,
    training: bool = True,
    drop_last: bool = False,
    seed: int = 5,
) -> ShardedLoader:
    loader = DataLoader(_dataset(n), batch_size=per_slot, shuffle=shuffle, drop_last=drop_last)
    return ShardedLoader(loader, rank=rank, size=size, seed=seed, training=training)


@pytest.mark.parametrize("shuffle", [False, True])
def test_two_ranks_split_each_global_batch_of_one_rank(shuffle: bool) -> None:
    # Prepare: 1 rank x batch 8 vs 2 ranks x batch 4 over 48 samples.
    one = _sharded(48, 8, 0, 1, shuffle=shuffle)
    r0 = _sharded(48, 4, 0, 2, shuffle=shuffle)
    r1 = _sharded(48, 4, 1, 2, shuffle=shuffle)
    for epoch in range(3):
        # Execute
        big = _ids(one.epoch(epoch))
        halves = zip(_ids(r0.epoch(epoch)), _ids(r1.epoch(epoch)), strict=True)
        # Assert: rank 0 holds the first half of each big batch, rank 1 the second.
        assert [a + b for a, b in halves] == big
    assert one.batches_per_epoch() == r0.batches_per_epoch() == 6


def test_shuffle_is_seeded_per_epoch_and_leaves_global_rng_alone() -> None:
    loader = _sharded(40, 4, 0, 1, shuffle=True)
    before = torch.get_rng_state()
    first, second = _ids(loader.epoch(0)), _ids(loader.epoch(1))
    assert torch.equal(before, torch.get_rng_state())
    assert first != second
    assert sorted(itertools.chain(*first)) == list(range(40))
    assert _ids(_sharded(40, 4, 0, 1, shuffle=True).epoch(0)) == first
    assert _ids(_sharded(40, 4, 0, 1, shuffle=True, seed=6).epoch(0)) != first


def test_resume_mid_epoch_skips_to_the_same_batches() -> None:
    loader = _sharded(64, 4, 1, 2, shuffle=True)
    full = _ids(loader.epoch(2))
    assert _ids(loader.epoch(2, start=3)) == full[3:]


def test_training_pads_the_last_global_batch_so_ranks_step_together() -> None:
    # 5 per-slot batches over 2 ranks: each rank runs 3, the last borrowed from the start.
    r0 = _sharded(20, 4, 0, 2, shuffle=False)
    r1 = _sharded(20, 4, 1, 2, shuffle=False)
    b0, b1 = _ids(r0.epoch(0)), _ids(r1.epoch(0))
    assert len(b0) == len(b1) == 3 == r0.batches_per_epoch()
    assert b0[2] == [16, 17, 18, 19]
    assert b1[2] == [0, 1, 2, 3]


def test_validation_is_not_padded_and_shards_are_uneven() -> None:
    r0 = _sharded(70, 10, 0, 2, shuffle=False, training=False)
    r1 = _sharded(70, 10, 1, 2, shuffle=False, training=False)
    b0, b1 = _ids(r0.epoch(0)), _ids(r1.epoch(0))
    assert len(b0) == 4
    assert len(b1) == 3
    assert sorted(itertools.chain(*b0, *b1)) == list(range(70))


@pytest.mark.parametrize("workers", [0, 2])
def test_validation_batches_come_with_the_number_of_samples_drawn(workers: int) -> None:
    # 50 samples in batches of 12 on 2 ranks: 12, 12, 2 on rank 0 and 12, 12 on rank 1.
    shards = []
    for rank in range(2):
        loader = DataLoader(_dataset(50), batch_size=12, num_workers=workers)
        sharded = ShardedLoader(loader, rank=rank, size=2, seed=0, training=False)
        shards.append([(batch[0].tolist(), n) for batch, n in sharded.counted(0)])
    assert [n for _, n in shards[0]] == [12, 12, 2]
    assert [n for _, n in shards[1]] == [12, 12]
    assert all(len(ids) == n for shard in shards for ids, n in shard)
    assert sorted(i for shard in shards for ids, _ in shard for i in ids) == list(range(50))


def test_the_samples_drawn_follow_a_custom_batch_sampler() -> None:
    # A batch sampler of uneven batches (a bucketing sampler, say): each batch's own size.
    sizes = [5, 1, 3, 7]
    starts = list(itertools.accumulate([0, *sizes]))
    batches = [list(range(a, a + n)) for a, n in zip(starts, sizes, strict=False)]
    loader = DataLoader(_dataset(16), batch_sampler=batches)
    sharded = ShardedLoader(loader, rank=1, size=2, seed=0, training=False)
    assert [(b[0].tolist(), n) for b, n in sharded.counted(0)] == [
        (batches[1], 1),
        (batches[3], 7),
    ]


def test_an_iterable_datasets_batches_have_no_count_drawn() -> None:
    loader = DataLoader(_Stream(), batch_size=5)
    sharded = ShardedLoader(loader, rank=0, size=1, seed=0, training=False)
    assert [(b.tolist(), n) for b, n in sharded.counted(0)] == [
        ([0, 1, 2, 3, 4], None),
        ([5, 6, 7, 8, 9], None),
        ([10, 11], None),
    ]


@pytest.mark.parametrize("training", [True, False])
def test_a_distributed_sampler_is_refused_it_would_shard_twice(training: bool) -> None:
    from torch.utils.data import DistributedSampler

    sampler: DistributedSampler[int] = DistributedSampler(
        _dataset(10), num_replicas=2, rank=0, shuffle=False
    )
    loader = DataLoader(_dataset(10), batch_size=2, sampler=sampler)
    which = "training" if training else "validation"
    with pytest.raises(TrainingError, match=f"build_{which}_data_loader.*DistributedSampler"):
        ShardedLoader(loader, rank=0, size=2, seed=0, training=training)
    # One replica shards nothing: accepted.
    alone: DistributedSampler[int] = DistributedSampler(
        _dataset(10), num_replicas=1, rank=0, shuffle=False
    )
    loader = DataLoader(_dataset(10), batch_size=4, sampler=alone)
    sharded = ShardedLoader(loader, rank=0, size=1, seed=0, training=training)
    assert _ids(sharded.epoch(0)) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_drop_last_is_kept() -> None:
    loader = _sharded(22, 4, 0, 1, shuffle=False, drop_last=True)
    assert _ids(loader.epoch(0))[-1] == [16, 17, 18, 19]
    assert loader.batches_per_epoch() == 5


class _Stream(IterableDataset[torch.Tensor]):
    def __iter__(self):  # type: ignore[no-untyped-def]
        yield from torch.arange(12)


def test_iterable_datasets_are_split_by_batch() -> None:
    loaders = [
        ShardedLoader(DataLoader(_Stream(), batch_size=2), rank=r, size=2, seed=0, training=True)
        for r in range(2)
    ]
    b0 = [b.tolist() for b in loaders[0].epoch(0)]
    b1 = [b.tolist() for b in loaders[1].epoch(0, start=1)]
    assert b0 == [[0, 1], [4, 5], [8, 9]]
    assert b1 == [[6, 7], [10, 11]]


def test_a_loader_that_is_not_a_dataloader_is_refused() -> None:
    with pytest.raises(TrainingError, match="must return a torch.utils.data.DataLoader"):
        ShardedLoader([1, 2, 3], rank=0, size=1, seed=0, training=True)  # type: ignore[arg-type]


def test_iterable_training_gives_each_rank_one_batch_of_each_group() -> None:
    # 4 batches of 3 over 2 ranks: groups of 2 consecutive batches.
    loaders = [
        ShardedLoader(DataLoader(_Stream(), batch_size=3), rank=r, size=2, seed=0, training=True)
        for r in range(2)
    ]
    b0 = [b.tolist() for b in loaders[0].epoch(0)]
    b1 = [b.tolist() for b in loaders[1].epoch(0)]
    assert b0 == [[0, 1, 2], [6, 7, 8]]
    assert b1 == [[3, 4, 5], [9, 10, 11]]


def test_iterable_training_with_an_odd_batch_count_keeps_ranks_in_step() -> None:
    loaders = [
        ShardedLoader(DataLoader(_Stream(), batch_size=4), rank=r, size=2, seed=0, training=True)
        for r in range(2)
    ]
    b0 = [b.tolist() for b in loaders[0].epoch(0)]
    b1 = [b.tolist() for b in loaders[1].epoch(0)]
    assert b0 == [[0, 1, 2, 3], [8, 9, 10, 11]]
    assert b1 == [[4, 5, 6, 7], [0, 1, 2, 3]]  # padded from the epoch's start
    validation = ShardedLoader(
        DataLoader(_Stream(), batch_size=4), rank=1, size=2, seed=0, training=False
    )
    assert [b.tolist() for b in validation.epoch(0)] == [[4, 5, 6, 7]]


def test_other_shuffling_samplers_are_seeded_per_epoch_too() -> None:
    from torch.utils.data import SubsetRandomSampler

    def make() -> ShardedLoader:
        sampler = SubsetRandomSampler(list(range(0, 40, 2)))
        loader = DataLoader(_dataset(40), batch_size=4, sampler=sampler)
        return ShardedLoader(loader, rank=0, size=1, seed=5, training=True)

    full = _ids(make().epoch(1))
    torch.manual_seed(1234)  # the global RNG must not matter
    assert _ids(make().epoch(1, start=2)) == full[2:]
    assert _ids(make().epoch(2)) != full
    assert sorted(itertools.chain(*full)) == list(range(0, 40, 2))
