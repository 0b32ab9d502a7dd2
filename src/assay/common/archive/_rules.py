"""What a model definition may hold: its size limits, the `.assayignore` rules and the
files always left out, and the error every archive function raises."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from assay.errors import AssayError

MAX_MODEL_DEF_BYTES = 96 * 2**20
"""Largest compressed model definition the master accepts (96 MiB)."""

MAX_UNPACKED_BYTES = 4 * MAX_MODEL_DEF_BYTES
"""Largest total size of the files a model definition may unpack to (384 MiB)."""

IGNORE_FILE = ".assayignore"

LOCAL_OUTPUT_MARKER = ".assay-local-output"
"""A directory holding this file was made by a local run for its output (`./checkpoints`
and `./assay-metrics` of `assay trial run-local` or of a plain `python3 train.py`):
packing a model directory leaves it out."""

# Never worth shipping, whatever .assayignore says.
_ALWAYS_SKIPPED_DIRS = frozenset({"__pycache__", ".git"})
_ALWAYS_SKIPPED_FILES = frozenset({".git"})
_ALWAYS_SKIPPED_SUFFIXES = (".pyc",)


class ModelDefinitionError(AssayError):
    """The model directory cannot be packed, or a model-definition archive is unusable."""


def format_bytes(n: int) -> str:
    """`1536` -> `1.5 KiB`: sizes for people, with the exact count kept next to it."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def sized(n: int) -> str:
    return f"{format_bytes(n)} ({n} bytes)"


# --- .assayignore ----------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    regex: re.Pattern[str]
    negate: bool
    dir_only: bool


def _translate(pattern: str) -> str:
    """Translate one gitignore glob (already stripped of `!`, leading and trailing `/`)."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("/**", i) and i + 3 == n:
            out.append("(?:/.*)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            end = pattern.find("]", i + 2 if pattern[i + 1 : i + 2] in ("!", "^") else i + 1)
            if end == -1:
                out.append(re.escape(c))
                i += 1
                continue
            body = pattern[i + 1 : end]
            if body[:1] in ("!", "^"):
                body = "^" + body[1:]
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = end + 1
        elif c == "\\" and i + 1 < n:
            out.append(re.escape(pattern[i + 1]))
            i += 2
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


def parse_rules(lines: Iterable[str]) -> list[Rule]:
    rules: list[Rule] = []
    for raw in lines:
        line = raw.rstrip("\n").rstrip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        if negate:
            line = line[1:]
        if line.startswith("\\"):  # `\#name`, `\!name`: a literal first character
            line = line[1:]
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        if not line:
            continue
        # A slash at the start or in the middle anchors the pattern at the directory root;
        # otherwise it matches a name at any depth.
        anchored = "/" in line
        line = line.lstrip("/")
        body = _translate(line)
        regex = body if anchored else f"(?:.*/)?{body}"
        rules.append(Rule(re.compile(f"^{regex}$", re.DOTALL), negate, dir_only))
    return rules


def is_ignored(rules: list[Rule], relpath: str, is_dir: bool) -> bool:
    ignored = False
    for rule in rules:
        if rule.dir_only and not is_dir:
            continue
        if rule.regex.match(relpath):
            ignored = not rule.negate
    return ignored


def always_skipped(name: str, is_dir: bool) -> bool:
    if is_dir:
        return name in _ALWAYS_SKIPPED_DIRS
    return name in _ALWAYS_SKIPPED_FILES or name.endswith(_ALWAYS_SKIPPED_SUFFIXES)


def left_out(root: Path, relpath: str, *, is_dir: bool) -> bool:
    """Whether packing `root` leaves `relpath` (a path under it) out of the archive: by
    `.assayignore` (it or a directory above it), or as always skipped."""
    ignore_file = root / IGNORE_FILE
    rules = parse_rules(ignore_file.read_text().splitlines()) if ignore_file.is_file() else []
    parts = PurePosixPath(relpath).parts
    for i, name in enumerate(parts, start=1):
        directory = i < len(parts) or is_dir
        if always_skipped(name, directory) or is_ignored(rules, "/".join(parts[:i]), directory):
            return True
    return False


def make_local_output_dir(directory: Path) -> None:
    """Create `directory` for a local run's output, marked so that an `experiment create`
    of the model directory it lies in does not ship it. One that exists already is left
    as it is, unmarked: it may hold files its owner means to ship."""
    if directory.exists():
        return
    try:
        directory.mkdir(parents=True)
    except FileExistsError:
        return  # made meanwhile (another rank of the same run, or another process)
    (directory / LOCAL_OUTPUT_MARKER).write_text(
        "Made by a local Assay run for its output; model directories are packed without it.\n"
    )
