"""What any config value may be: what the store can keep and every client can read back.

The master stores a config as JSON (PostgreSQL's or SQLite's) and answers it inside
protobuf messages, so a value must survive both, for every user who lists experiments:

- mappings and lists nest at most `MAX_CONFIG_DEPTH` deep, the config itself counting as
  one: protobuf readers refuse messages nested deeper than 100 (each level of a config is
  three there), and deep values are what made JSON encoding fail in the commit;
- text holds no NUL (PostgreSQL cannot store it) and no lone surrogate (not UTF-8);
- numbers are finite (JSON has no NaN or infinity) and integers fit in 64 bits;
- nothing else YAML can build (dates, `!!binary`, `!!set`) is taken: JSON has no such type.

The name, description and labels are shown in every list, so they are bounded further
(`text_problems`): `MAX_NAME_CHARS`, `MAX_DESCRIPTION_CHARS`, `MAX_LABELS` of at most
`MAX_LABEL_CHARS`, and no control characters (a description may hold tabs and newlines).

Every name that users show one another (experiment names and labels, model labels,
hyperparameter names, metric names and groups) must also look like what it is
(`name_problem`, the one rule for all of them): no bidirectional controls (U+202E shows
"emoc" as "come"), no invisible characters (format characters such as U+200B ZERO WIDTH
SPACE, Hangul fillers, the blank Braille pattern), no space but the ASCII one, and no
word that mixes Latin, Cyrillic and Greek letters ("paypal" with a Cyrillic U+0430 for
its first "a"). User, workspace, project, model and template names are stricter still:
ASCII letters, digits and a few marks.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import unicodedata
from collections.abc import Mapping
from typing import Any, Literal

MAX_CONFIG_DEPTH = 32
MAX_NAME_CHARS = 255  # the store's column; Kubernetes allows 253 for an object's name
MAX_DESCRIPTION_CHARS = 4096
MAX_LABELS = 64
MAX_LABEL_CHARS = 255  # the store's column
# A metric's name (the store's column): refused by the Core API in the script too, not
# only by the master, which would fail the run.
MAX_METRIC_NAME_CHARS = 255
# The distinct metric names one trial may report: the master's `metric_names_per_trial`.
METRIC_NAMES_PER_TRIAL = 1000
MAX_INT = 2**63 - 1

# NUL: PostgreSQL's text and JSON cannot hold it; surrogates: not encodable as UTF-8.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
# C0, DEL and C1 controls: in a name or label they rewrite other users' terminals.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_CONTROL_IN_TEXT = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # tab and newline allowed
_SHOWN_KEY_CHARS = 40
# Bidirectional controls: embeddings, overrides, isolates and marks. They are format
# characters (refused as invisible too); named apart because they also reorder the text.
_BIDI_CONTROLS = frozenset(
    "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
)
# Invisible characters that are not format characters: the combining grapheme joiner,
# Hangul fillers, Khmer inherent vowels and the blank Braille pattern.
_INVISIBLE = frozenset("\u034f\u115f\u1160\u17b4\u17b5\u2800\u3164\uffa0")
_LOOK_ALIKE_SCRIPTS = frozenset({"LATIN", "CYRILLIC", "GREEK"})


def value_problems(config: Mapping[Any, Any]) -> tuple[list[str], bool]:
    """`key.path: what to fix` for every value of `config` the store or a client cannot
    hold, and whether some value nests too deep (nothing inside it is looked at: a parser
    that recurses into it must not be given it)."""
    problems: list[str] = []
    too_deep = False
    # Iterative, so a hostile depth costs no Python stack; a value's path is built only
    # for a problem, from its trail: (parent's trail, key or list index) or None.
    pending: list[tuple[Any, int, Any]] = [(config, 1, None)]
    while pending:
        value, depth, trail = pending.pop()
        kind = type(value)
        if kind is str:
            if not _storable(value):
                problems.append(f"{_path(trail)}: {_text_problem(value, 'the text')}")
        elif kind is bool or kind is int or kind is float or value is None:
            problem = _number_problem(value)
            if problem is not None:
                problems.append(f"{_path(trail)}: {problem}")
        elif isinstance(value, Mapping | list | tuple):
            if depth > MAX_CONFIG_DEPTH:
                too_deep = True
                problems.append(
                    f"{_path(trail)}: nests mappings and lists more than {MAX_CONFIG_DEPTH} deep "
                    "(the config itself is the first); flatten it or keep it in a file the "
                    "model reads"
                )
                continue
            depth += 1
            if isinstance(value, Mapping):
                items = list(value.items())
                for key, _ in items:
                    if type(key) is not str or not _storable(key):
                        problem = _key_problem(key)
                        if problem is not None:
                            problems.append(f"{_path(trail)}: {problem}")
                # Reversed onto the stack: the problems come in the order of the text.
                pending.extend((child, depth, (trail, key)) for key, child in reversed(items))
            else:
                pending.extend(
                    (child, depth, (trail, [i])) for i, child in reversed(list(enumerate(value)))
                )
        else:
            problems.append(
                f"{_path(trail)}: is {_kind(value)}, which JSON cannot hold: {_fix(value)}"
            )
    return problems, too_deep


def _storable(text: str) -> bool:
    if text.isascii():
        return "\x00" not in text
    return _UNSTORABLE.search(text) is None


def _path(trail: Any) -> str:
    """`data.splits[1]` of a trail; `<config>` for the config itself."""
    steps: list[Any] = []
    while trail is not None:
        trail, step = trail
        steps.append(step)
    path = ""
    for step in reversed(steps):
        if isinstance(step, list):  # a list index
            path += f"[{step[0]}]"
        else:
            shown = str(step)
            if not shown.isprintable():
                shown = repr(shown)
            if len(shown) > _SHOWN_KEY_CHARS:
                shown = shown[:_SHOWN_KEY_CHARS] + "..."
            path = f"{path}.{shown}" if path else shown
    return path or "<config>"


TextKind = Literal["name", "description", "label"]
_LIMITS: dict[TextKind, int] = {
    "name": MAX_NAME_CHARS,
    "description": MAX_DESCRIPTION_CHARS,
    "label": MAX_LABEL_CHARS,
}


def text_problems(value: str, path: str, kind: TextKind) -> list[str]:
    """The problems of a name, description or label shown in every experiment list."""
    problems = []
    limit = _LIMITS[kind]
    if len(value) > limit:
        problems.append(f"{path}: is {len(value)} characters; a {kind} may have at most {limit}")
    if kind != "description":
        # NUL has its own message (value_problems): it cannot be stored at all.
        problem = name_problem(value.replace("\x00", ""))
        if problem is not None:
            problems.append(f"{path}: {problem}")
        return problems
    control = _CONTROL_IN_TEXT.search(value)
    if control is not None and control.group() != "\x00":
        problems.append(
            f"{path}: contains the control character U+{ord(control.group()):04X}; a "
            "description is plain text (tabs and newlines are allowed)"
        )
    return problems


def name_problem(name: str) -> str | None:
    """Why `name` cannot name something other users see (None: it can): what it holds
    that would make it look like another name, said with the character's code point."""
    if name.isascii():
        control = _CONTROL.search(name)
        return None if control is None else _control_problem(control.group())
    for char in name:
        problem = _char_problem(char)
        if problem is not None:
            return problem
    return _mixed_scripts(name)


def names_problems(space: Mapping[str, Any], path: str) -> list[str]:
    """`name_problem` of every key of `space` and of the mappings nested in it (groups of
    hyperparameters), each with its path."""
    problems: list[str] = []
    pending: list[tuple[Mapping[str, Any], str]] = [(space, path)]
    while pending:
        mapping, where = pending.pop()
        for key, value in mapping.items():
            problem = name_problem(key) if isinstance(key, str) else None
            if problem is not None:
                problems.append(f"{where}: the name {key!r} {problem}")
            elif isinstance(value, Mapping):
                pending.append((value, f"{where}.{key}"))
    return problems


def _char_problem(char: str) -> str | None:
    if char.isascii():
        return _control_problem(char) if _CONTROL.match(char) else None
    category = unicodedata.category(char)
    if category[0] == "L" and char not in _INVISIBLE:
        return None
    shown = _code_point(char)
    if char in _BIDI_CONTROLS:
        return (
            f"contains {shown}, a bidirectional control, which changes the order in which "
            "the name is shown; remove it"
        )
    if category in ("Cf", "Zl", "Zp") or char in _INVISIBLE:
        return f"contains {shown}, which is invisible; remove it"
    if category == "Cc":
        return _control_problem(char)
    if category == "Zs":
        return f"contains {shown}, which looks like a space; use a plain space (U+0020)"
    return None


def _control_problem(char: str) -> str:
    return f"contains the control character U+{ord(char):04X}; a name is plain text"


def _code_point(char: str) -> str:
    name = unicodedata.name(char, "")
    return f"U+{ord(char):04X} {name}" if name else f"U+{ord(char):04X}"


def _mixed_scripts(name: str) -> str | None:
    """A word (a run of letters and combining marks) whose letters come from more than
    one of the look-alike alphabets: Latin, Cyrillic and Greek."""
    first: str | None = None
    start = 0
    for i, char in enumerate(name):
        category = unicodedata.category(char)
        if category[0] not in "LM":  # a digit, a space, '_', '-', ...: the word ends
            first, start = None, i + 1
            continue
        script = _script(char)
        if script is None:
            continue
        if first is None:
            first = script
        elif script != first:
            end = i
            while end < len(name) and unicodedata.category(name[end])[0] in "LM":
                end += 1
            word = name[start:end]
            return (
                f"mixes {first.title()} and {script.title()} letters in the word {word!r} "
                f"({_code_point(char)}), as names made to look like others do; write each "
                "word in one alphabet"
            )
    return None


def _script(char: str) -> str | None:
    if char.isascii():
        return "LATIN"  # only letters get here
    script = unicodedata.name(char, "").partition(" ")[0]
    return script if script in _LOOK_ALIKE_SCRIPTS else None


def labels_problem(count: int, path: str) -> str | None:
    if count > MAX_LABELS:
        return f"{path}: {count} labels; an experiment may have at most {MAX_LABELS}"
    return None


def _key_problem(key: Any) -> str | None:
    if isinstance(key, str):
        return _text_problem(key, f"the key {_shown(key)}")
    if key is None or isinstance(key, bool | int):
        return None  # JSON writes it as text
    if isinstance(key, float):
        return None if math.isfinite(key) else f"the key {key!r} is not a finite number"
    return f"the key {_shown(key)} is {_kind(key)}; JSON keys are text: quote it"


def _number_problem(value: bool | int | float | None) -> str | None:
    if isinstance(value, float):
        if math.isfinite(value):
            return None
        return (
            f"{value!r} is not a finite number; the store keeps JSON, which has no NaN or "
            "infinity: write it as text ('inf') and convert it in the model"
        )
    if isinstance(value, bool) or value is None or -MAX_INT - 1 <= value <= MAX_INT:
        return None
    return (
        f"an integer of {len(str(abs(value)))} digits; integers must fit in 64 bits "
        "(at most 2**63-1 in magnitude): write it as text or a number with a decimal point"
    )


def _text_problem(text: str, what: str) -> str | None:
    found = _UNSTORABLE.search(text)
    if found is None:
        return None
    if found.group() == "\x00":
        return f"{what} contains a NUL character (\\0), which the database cannot store; remove it"
    return f"{what} contains a lone surrogate (U+{ord(found.group()):04X}), which is not UTF-8"


def _kind(value: Any) -> str:
    if isinstance(value, dt.date):  # datetimes too
        return "a date"
    if isinstance(value, bytes | bytearray):
        return "binary data (!!binary)"
    if isinstance(value, set | frozenset):
        return "a set (!!set)"
    return f"a {type(value).__name__}"


def _fix(value: Any) -> str:
    if isinstance(value, dt.date):
        return "quote it ('2001-12-14') to keep it as text"
    if isinstance(value, bytes | bytearray):
        return "give text (e.g. base64) instead"
    if isinstance(value, set | frozenset):
        return "write a list"
    return "give text, a number, a boolean, a list or a mapping"


def _shown(key: Any) -> str:
    shown = repr(key)
    return shown if len(shown) <= _SHOWN_KEY_CHARS else shown[:_SHOWN_KEY_CHARS] + "..."
