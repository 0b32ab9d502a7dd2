"""Sizes of memory as configs write them: `8G`, `512Mi`, `4GiB`, `1.5g` or a number of bytes.

Units are powers of 1024 whichever way they are spelled (K, Ki, KiB, KB; M; G; T), as
docker, Slurm and systemd read them: `8G` is 8 GiB.
"""

from __future__ import annotations

import math
import re

_UNITS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(?:([kmgtp])i?b?|b)?\s*$", re.IGNORECASE)
# A limit under this could not start a Python process, let alone train.
MIN_MEMORY = 16 * 2**20
MAX_MEMORY = 2**60
SIZE_FORMS = "a size such as 8G, 512Mi, 4GiB (powers of 1024) or a number of bytes"


def parse_size(value: object) -> int:
    """Bytes from an integer or a size string; ValueError with what is accepted."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"expected {SIZE_FORMS}, got {value!r}")
    if isinstance(value, int | float):
        if not math.isfinite(value) or value != int(value):
            raise ValueError(f"expected a whole number of bytes, got {value!r}")
        return int(value)
    match = _SIZE.match(value)
    if match is None:
        raise ValueError(f"expected {SIZE_FORMS}, got {value!r}")
    number, unit = match.group(1), (match.group(2) or "").lower()
    scale = 1 << (10 * _UNITS[unit])
    if "." not in number:
        return int(number) * scale
    if not unit:
        raise ValueError(f"expected a whole number of bytes, got {value!r}")
    return int(float(number) * scale)


def parse_memory(value: object) -> int:
    """A memory limit in bytes, from 16 MiB to 1 EiB; ValueError saying why not."""
    size = parse_size(value)
    if not MIN_MEMORY <= size <= MAX_MEMORY:
        shown = f"{value!r} ({format_size(size)})" if isinstance(value, str) else repr(value)
        raise ValueError(
            f"must be from {format_size(MIN_MEMORY)} to {format_size(MAX_MEMORY)}, got {shown}"
        )
    return size


def format_size(size: int) -> str:
    """`size` bytes in words: "64 MiB", "1.5 GiB", "512 B"."""
    for power, unit in ((6, "EiB"), (5, "PiB"), (4, "TiB"), (3, "GiB"), (2, "MiB"), (1, "KiB")):
        scale = 1024**power
        if size >= scale:
            shown = f"{size / scale:.1f}".removesuffix(".0")
            return f"{shown} {unit}"
    return f"{size} B"


__all__ = ["MAX_MEMORY", "MIN_MEMORY", "SIZE_FORMS", "format_size", "parse_memory", "parse_size"]
