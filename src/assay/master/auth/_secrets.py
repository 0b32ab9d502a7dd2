"""Which values of an experiment config are secret, and how they are hidden from users.

The store keeps a config as it was submitted: the trials need their storage keys, and
the master sends the config to the agents whole. Everything else that shows a config to
a user (the API, hence the CLI and the web UI) shows `masked(config)`, in which the
value of every key whose name says it holds a secret reads `MASK`.

The config has no section reserved for secrets, so the rule is by name, anywhere in the
config (`checkpoint_storage.access_key` and `secret_key`, a `data.hf_token`, a
hyperparameter `api_key`), and also for `NAME=value` strings, the form environment
variables are written in.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from typing import Any

MASK = "********"

# A name containing one of these holds a secret wherever the word sits.
_SECRET_PARTS = ("password", "passwd", "passphrase", "secret", "credential")
# A name ending in one of these does: "access_key", "apiKey", "hf_token", "AUTHTOKEN",
# "AWS_ACCESS_KEY_ID"; "key_dim", "tokenizer" and "max_tokens" do not.
_SECRET_ENDINGS = ("token", "apikey", "accesskey", "privatekey")
_CAMEL = re.compile(r"([a-z0-9])([A-Z])")
_NOT_ALNUM = re.compile(r"[^a-z0-9]+")
_ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_.-]*)=(.+)", re.DOTALL)

# A secret name before a value in text: a quoted value (JSON, Python, YAML), a bare value
# after `=` (environment, query strings, command lines), or a bare value after `:` at the
# start of a line (YAML).
_NAME = r"[A-Za-z_][\w.-]*"
_QUOTED = re.compile(rf"""\b({_NAME})(["']?\s*[:=]\s*)(["'])((?:\\.|(?!\3)[^\\])*)\3""")
_BARE = re.compile(rf"""\b({_NAME})(\s*=\s*)(?!["'])([^\s&,;]+)""")
_YAML = re.compile(
    rf"""^([ \t]*(?:-[ \t]+)?)({_NAME})(:[ \t]+)(?!["'\[{{|>&*!#])(\S(?:[^\n]*\S)?)""", re.M
)
# Text without any of these has nothing `mask_text` would change (a cheap first look:
# task logs pass through here line by line).
_TRIGGERS = ("pass", "secret", "credential", "token", "key")


@functools.lru_cache(maxsize=4096)
def is_secret_name(name: str) -> bool:
    """Whether a key named `name` holds a secret (case-insensitive, any word style).

    Remembered per name: configs repeat the same few dozen keys in every answer."""
    lower = name.lower()
    if any(part in lower for part in _SECRET_PARTS):
        return True
    words = [w for w in _NOT_ALNUM.split(_CAMEL.sub(r"\1_\2", name).lower()) if w]
    if len(words) >= 2 and words[-2:] == ["key", "id"]:
        return True
    return bool(words) and (words[-1] == "key" or words[-1].endswith(_SECRET_ENDINGS))


def masked(value: Any) -> Any:
    """A copy of a JSON-like `value` in which every secret reads `MASK`.

    A value left empty (None, "", false, an empty list or mapping) stays as it is: that
    no key was given is worth seeing, and reveals nothing.
    """
    if isinstance(value, Mapping):
        return {
            key: MASK if is_secret_name(str(key)) and _is_set(item) else masked(item)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [masked(item) for item in value]
    if isinstance(value, str):
        match = _ASSIGNMENT.fullmatch(value)
        if match and is_secret_name(match[1]):
            return f"{match[1]}={MASK}"
    return value


def mask_text(text: str, mask: str = MASK, *, yaml_mask: str | None = None) -> str:
    """`text` with the values given to secret names replaced by `mask`.

    Finds `name: "value"`, `name = 'value'`, `"name": "value"`, `NAME=value` and YAML's
    `name: value` at the start of a line, where `name` is secret by `is_secret_name`.
    `yaml_mask`: what replaces the last form's value instead (`MASK` bare is not YAML).
    """
    lower = text.lower()
    if not any(word in lower for word in _TRIGGERS):
        return text

    def quoted(m: re.Match[str]) -> str:
        if not is_secret_name(m[1]):
            return m[0]
        return f"{m[1]}{m[2]}{m[3]}{mask}{m[3]}"

    def bare(m: re.Match[str]) -> str:
        return f"{m[1]}{m[2]}{mask}" if is_secret_name(m[1]) else m[0]

    def yaml(m: re.Match[str]) -> str:
        return f"{m[1]}{m[2]}{m[3]}{yaml_mask or mask}" if is_secret_name(m[2]) else m[0]

    text = _QUOTED.sub(quoted, text)
    text = _BARE.sub(bare, text)
    return _YAML.sub(yaml, text)


def masked_config_text(
    text: str, config: Mapping[str, Any], filled: Sequence[tuple[str, str]] = ()
) -> str | None:
    """The submitted config text with its secrets masked, or None when the masking cannot
    be shown to be complete: the masked text must parse to exactly `masked(config)`.
    (YAML has forms `mask_text` does not rewrite, such as a block scalar or a flow
    mapping; a config written so is shown from its parsed form instead.) `filled`: the
    (section, key) pairs the master may have filled in (the seed it drew), which the
    text may lack."""
    import yaml

    shown = mask_text(text, yaml_mask=f'"{MASK}"')
    try:
        parsed = yaml.safe_load(shown)
    except yaml.YAMLError:
        return None
    expected = masked(config)
    for section, key in filled:
        written = parsed.get(section) if isinstance(parsed, Mapping) else None
        found = expected.get(section)
        if not isinstance(found, Mapping) or (isinstance(written, Mapping) and key in written):
            continue
        rest = {k: v for k, v in found.items() if k != key}
        if rest or isinstance(written, Mapping):
            expected = {**expected, section: rest}
        else:  # the master added the whole section
            expected = {k: v for k, v in expected.items() if k != section}
    return shown if parsed == expected else None


def _is_set(value: Any) -> bool:
    if value is None or isinstance(value, bool):
        return False
    return not (isinstance(value, str | Mapping | list | tuple) and not value)
