"""How long to train: a count of batches or epochs, as the config's lengths are written.

`max_length: {batches: 2000}`, `min_validation_period: {epochs: 1}` and the like; a length in
epochs becomes batches once the training data loader's length is known.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from assay.errors import InvalidConfigError

# `searcher.max_length` of a script that gives none: a target no trial reaches.
UNBOUNDED_LENGTH = 2**62


class LengthUnit(StrEnum):
    BATCHES = "batches"
    EPOCHS = "epochs"


@dataclass(frozen=True)
class Length:
    """A training length, in dataloader batches (global batches) or epochs."""

    unit: LengthUnit
    value: int

    @classmethod
    def batches(cls, n: int) -> Length:
        return cls(LengthUnit.BATCHES, n)

    @classmethod
    def epochs(cls, n: int) -> Length:
        return cls(LengthUnit.EPOCHS, n)

    @property
    def bounded(self) -> bool:
        """False for the `searcher.max_length` of a script's config that gives none."""
        return self.value != UNBOUNDED_LENGTH

    def to_batches(self, batches_per_epoch: int | None) -> int:
        if self.unit is LengthUnit.BATCHES:
            return self.value
        if batches_per_epoch is None:
            raise InvalidConfigError(
                [
                    "a length in epochs needs a training data loader with a known length; "
                    "give lengths in batches (e.g. {batches: 1000}) for iterable datasets"
                ]
            )
        return self.value * batches_per_epoch

    def in_words(self) -> str:
        """`1 epoch`, `20 batches`."""
        unit = self.unit.value.removesuffix("s") if self.value == 1 else self.unit.value
        return f"{self.value} {unit}"

    def to_dict(self) -> dict[str, int]:
        return {self.unit.value: self.value}


__all__ = ["UNBOUNDED_LENGTH", "Length", "LengthUnit"]
