"""Re-sharding of plain `torch.utils.data.DataLoader`s across ranks, resumable mid-epoch.

The user builds an ordinary DataLoader whose batch size is the per-slot batch size. Per
epoch, its batch sampler yields index batches in one order shared by every rank (random
samplers are re-seeded from the trial seed and the epoch, so no rank and no restart
draws from the global RNG). Consecutive groups of `size` index batches form one global
batch, and rank r takes member r of each group: 2 ranks x batch B see exactly the samples
of 1 rank x batch 2B. Training pads the last group from the epoch's start so every rank
runs the same number of steps; validation does not pad: ranks may get uneven shards, and
every sample is validated once (`counted` gives each batch's number of samples, the
weight of Reducer.AVG).

A position is (epoch, batch in epoch); resuming skips index batches without loading data.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterable, Iterator, Sized
from typing import Any

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    Sampler,
)

from assay.errors import TrainingError


def _epoch_seed(seed: int, epoch: int) -> int:
    return (seed * 1_000_003 + epoch * 7919 + 17) % (2**63 - 1)


def _seeded_copy(sampler: Any, seed: int) -> Any:
    """A copy of a shuffling sampler whose generator the shard re-seeds every epoch.

    RandomSampler, SubsetRandomSampler and WeightedRandomSampler draw from `.generator`
    (the global RNG when it is None): a generator seeded from (trial seed, epoch) gives
    every rank the same order, and a restored trial the order it had.
    """
    if not hasattr(sampler, "generator"):
        return sampler
    seeded = copy.copy(sampler)
    seeded.generator = torch.Generator()
    seeded.assay_seed = seed
    return seeded


class _ShardBatchSampler(Sampler[list[int]]):
    """This rank's index batches of one epoch, from a start position."""

    def __init__(
        self, source: Iterable[list[int]], n_batches: int, rank: int, size: int, pad: bool
    ) -> None:
        self.source = source
        self.n_batches = n_batches
        self.rank = rank
        self.size = size
        self.pad = pad
        self.epoch = 0
        self.start = 0
        # The number of indices in each batch of the current iteration (None where an
        # index batch has no length), set before its first batch is yielded.
        self.sizes: list[int | None] = []

    def steps_per_epoch(self) -> int:
        """Batches this rank runs in a full epoch (every rank the same when padded)."""
        if self.pad:
            return -(-self.n_batches // self.size)
        return len(range(self.rank, self.n_batches, self.size))

    def __len__(self) -> int:
        return max(0, self.steps_per_epoch() - self.start)

    def __iter__(self) -> Iterator[list[int]]:
        inner = getattr(self.source, "sampler", None)
        seed = getattr(inner, "assay_seed", None)
        if seed is not None:
            inner.generator.manual_seed(_epoch_seed(seed, self.epoch))  # type: ignore[union-attr]
        batches = list(self.source)
        if self.pad and batches:
            total = self.steps_per_epoch() * self.size
            batches.extend(itertools.islice(itertools.cycle(batches), total - len(batches)))
        mine = batches[self.rank :: self.size][self.start :]
        self.sizes = [len(b) if isinstance(b, Sized) else None for b in mine]
        yield from mine


def _refuse_distributed_sampler(loader: DataLoader[Any], training: bool) -> None:
    """A DistributedSampler (from a plain DDP script) would shard the data a second time:
    each rank would see a 1/size of its own shard, padded with repeats."""
    samplers = [loader.sampler, getattr(loader.batch_sampler, "sampler", None)]
    if any(isinstance(s, DistributedSampler) and s.num_replicas > 1 for s in samplers):
        which = "training" if training else "validation"
        raise TrainingError(
            f"build_{which}_data_loader() returned a DataLoader with a DistributedSampler: "
            "the harness shards a plain DataLoader across slots itself, so the data would be "
            "sharded twice; give the DataLoader shuffle=True/False (or the sampler the "
            "DistributedSampler would wrap) instead"
        )


class ShardedLoader:
    """Iterates a user's DataLoader as this rank's shard, epoch by epoch, resumably."""

    def __init__(
        self, loader: DataLoader[Any], *, rank: int, size: int, seed: int, training: bool
    ) -> None:
        if not isinstance(loader, DataLoader):
            raise TrainingError(
                "build_*_data_loader() must return a torch.utils.data.DataLoader, got "
                f"{type(loader).__name__}"
            )
        _refuse_distributed_sampler(loader, training)
        self.user_loader = loader
        self.rank, self.size, self.training = rank, size, training
        self.seed = seed
        self.iterable = isinstance(loader.dataset, IterableDataset)
        self._shard: _ShardBatchSampler | None = None
        self._loader: DataLoader[Any] | None = None
        if not self.iterable:
            self._build()

    def _build(self) -> None:
        user = self.user_loader
        batch_sampler = user.batch_sampler
        if batch_sampler is None:
            raise TrainingError(
                "the DataLoader must batch its samples (batch_size=... or batch_sampler=...); "
                "batch_size=None is not supported"
            )
        if isinstance(batch_sampler, BatchSampler) and type(batch_sampler) is BatchSampler:
            sampler: Sampler[int] | Iterable[int] = batch_sampler.sampler
            # Shuffling samplers are re-seeded per epoch; any other order is the sampler's own.
            sampler = _seeded_copy(sampler, self.seed)
            source: Iterable[list[int]] = BatchSampler(
                sampler,
                batch_sampler.batch_size,
                batch_sampler.drop_last,
            )
        else:
            source = batch_sampler
        n_batches = len(source)  # type: ignore[arg-type]
        self._shard = _ShardBatchSampler(source, n_batches, self.rank, self.size, self.training)
        generator = torch.Generator()
        self._loader = DataLoader(
            user.dataset,
            batch_sampler=self._shard,
            num_workers=user.num_workers,
            collate_fn=user.collate_fn,
            pin_memory=user.pin_memory,
            timeout=user.timeout,
            worker_init_fn=user.worker_init_fn,
            multiprocessing_context=user.multiprocessing_context,
            generator=generator,
            prefetch_factor=user.prefetch_factor if user.num_workers > 0 else None,
            persistent_workers=False,
            pin_memory_device=user.pin_memory_device,
        )
        self._generator = generator

    def batches_per_epoch(self) -> int | None:
        """Global batches (steps of every rank) in one epoch; None when unknown."""
        if self._shard is not None:
            return self._shard.steps_per_epoch() if self.training else self._shard.n_batches
        try:
            n = len(self.user_loader)
        except TypeError:
            return None
        return -(-n // self.size) if self.training else n

    def epoch(self, epoch: int, start: int = 0) -> Iterator[Any]:
        """This rank's batches of `epoch`, skipping the first `start` of them."""
        if self._loader is None or self._shard is None:
            return self._iterable_epoch(start)
        self._shard.epoch = epoch
        self._shard.start = start
        self._generator.manual_seed(_epoch_seed(self.seed, epoch) ^ 0x5DEECE66D)
        return iter(self._loader)

    def counted(self, epoch: int) -> Iterator[tuple[Any, int | None]]:
        """This rank's batches of `epoch`, each with the number of samples its sampler
        drew for it (None for an iterable dataset, whose batches are not drawn by index).
        The DataLoader yields batches in its sampler's order: batch i is index batch i."""
        batches = self.epoch(epoch)
        if self._shard is None:
            yield from ((batch, None) for batch in batches)
            return
        for i, batch in enumerate(batches):
            yield batch, self._shard.sizes[i]

    def _iterable_epoch(self, start: int) -> Iterator[Any]:
        return itertools.islice(self._iterable_shard(), start, None)

    def _iterable_shard(self) -> Iterator[Any]:
        # An iterable dataset cannot be indexed: every rank reads the whole stream, and
        # takes member `rank` of each group of `size` batches. In training, an incomplete
        # last group is padded from the epoch's first batches, so ranks step together.
        first: list[Any] = []
        group: list[Any] = []
        for batch in self.user_loader:
            if self.training and len(first) < self.size:
                first.append(batch)
            group.append(batch)
            if len(group) == self.size:
                yield group[self.rank]
                group = []
        if group:
            if self.rank < len(group):
                yield group[self.rank]
            elif self.training:
                yield first[(self.rank - len(group)) % len(first)]
