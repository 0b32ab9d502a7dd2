"""One line for an error raised in the user's code: the user's frame, not Assay's or torch's.

`assay trial run-local` ends with this line instead of a traceback through the harness
(`--verbose` prints the whole traceback); a cluster trial's process prints it after the
traceback, so the failure's last line, which becomes the trial's `last_error`, names it.
"""

from __future__ import annotations

import sysconfig
import traceback
from pathlib import Path

import assay

_ASSAY_ROOT = Path(assay.__file__).resolve().parent
_LIBRARY_ROOTS = tuple(
    Path(p).resolve()
    for key in ("stdlib", "platstdlib", "purelib", "platlib")
    if (p := sysconfig.get_paths().get(key))
)


def _is_framework(filename: str) -> bool:
    if filename.startswith("<"):  # <frozen importlib._bootstrap>, <string>
        return True
    path = Path(filename).resolve()
    if path.is_relative_to(_ASSAY_ROOT):
        return True
    return "site-packages" in path.parts or any(path.is_relative_to(r) for r in _LIBRARY_ROOTS)


def user_frame(error: BaseException) -> traceback.FrameSummary | None:
    """The innermost frame of `error`'s traceback outside Assay, the standard library and
    installed packages (None when every frame is theirs)."""
    frames = traceback.extract_tb(error.__traceback__)
    for frame in reversed(frames):
        if not _is_framework(frame.filename):
            return frame
    return None


def _shown(filename: str) -> str:
    path = Path(filename)
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return filename


def describe(error: BaseException) -> str:
    """`train_batch (model_def.py:57) raised ZeroDivisionError: division by zero`, on one
    line; without a user frame, `ZeroDivisionError: division by zero`."""
    text = error.msg if isinstance(error, SyntaxError) else str(error)
    message = " ".join(str(text).split())
    what = type(error).__name__ + (f": {message}" if message else "")
    if isinstance(error, SyntaxError) and error.filename:
        return f"{what} ({_shown(error.filename)}:{error.lineno})"
    frame = user_frame(error)
    if frame is None:
        return what
    return f"{frame.name} ({_shown(frame.filename)}:{frame.lineno}) raised {what}"


__all__ = ["describe", "user_frame"]
