"""The experiment config's `entrypoint`: a Trial's `module:ClassName`, or a script's
command (a string or a list)."""

from __future__ import annotations

import re
import shlex

from assay.config._reader import Section, type_name

TRIAL_ENTRYPOINT = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def parse_entrypoint(top: Section) -> tuple[str | None, tuple[str, ...] | None, bool]:
    """`module:Class`, or a command as a string (`python3 train.py --epochs 1`) or a list;
    and whether the config is a script's.

    A command that is wrong but clearly a command (`train.py`, a list, a string that does
    not split) is still a script's: the rules for a Trial (`global_batch_size` is required)
    would add problems that are not the user's. Otherwise (missing, empty, not a Trial's
    `module:ClassName`) the Trial's rules apply, as for any config that names no command.
    """
    value = top.raw("entrypoint")
    if value is None:
        top.error(
            "entrypoint", "is required: 'module:ClassName' or a command such as 'python3 train.py'"
        )
        return None, None, False
    if isinstance(value, list):
        if not value or not all(isinstance(v, str) and v for v in value):
            top.error("entrypoint", f"a command list must hold non-empty strings, got {value!r}")
            return None, None, True
        argv = tuple(value)
    elif isinstance(value, str):
        if TRIAL_ENTRYPOINT.match(value.strip()):
            return value.strip(), None, False
        try:
            argv = tuple(shlex.split(value))
        except ValueError as e:
            top.error("entrypoint", f"cannot split {value!r} into a command: {e}")
            return None, None, True
        if not argv:
            top.error("entrypoint", f"is empty ({value!r}): give 'module:ClassName' or a command")
            return None, None, False
    else:
        top.error(
            "entrypoint",
            f"expected 'module:ClassName', a command string or a list, got {type_name(value)}",
        )
        return None, None, False
    if len(argv) == 1 and argv[0].endswith(".py"):
        top.error("entrypoint", f"{argv[0]!r} is a file, not a command: write 'python3 {argv[0]}'")
        return None, None, True
    if len(argv) == 1 and (":" in argv[0] or re.fullmatch(r"[A-Za-z_][\w.]*", argv[0])):
        top.error(
            "entrypoint",
            f"expected 'module:ClassName' (e.g. model_def:MyTrial) or a command (e.g. "
            f"'python3 train.py'), got {argv[0]!r}",
        )
        return None, None, False
    return shlex.join(argv), argv, True


__all__ = ["TRIAL_ENTRYPOINT", "parse_entrypoint"]
