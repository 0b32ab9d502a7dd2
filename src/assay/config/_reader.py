"""A small typed reader over one mapping of the config that collects every problem.

Each getter validates one key and records a message naming the full key path and what is
allowed; `finish()` reports keys nobody asked for (with a close match when there is one),
so a typo never passes silently.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any, Final, TypeVar

T = TypeVar("T")


class _Missing:
    def __repr__(self) -> str:
        return "<required>"


REQUIRED: Final = _Missing()


def type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return type(value).__name__


class Section:
    """Reads the keys of one mapping found at `path` in the config."""

    def __init__(self, data: Mapping[str, Any], path: str, problems: list[str]) -> None:
        self.data = data
        self.path = path
        self.problems = problems
        self._seen: set[str] = set()

    def key_path(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def error(self, key: str | None, message: str) -> None:
        where = self.key_path(key) if key is not None else (self.path or "<config>")
        self.problems.append(f"{where}: {message}")

    def has(self, key: str) -> bool:
        self._seen.add(key)
        return key in self.data and self.data[key] is not None

    def raw(self, key: str) -> Any:
        self._seen.add(key)
        return self.data.get(key)

    def _fetch(self, key: str, default: object) -> tuple[bool, Any]:
        self._seen.add(key)
        if key not in self.data or self.data[key] is None:
            if default is REQUIRED:
                self.error(key, "is required")
                return False, None
            return False, default
        return True, self.data[key]

    def get_int(
        self,
        key: str,
        default: int | _Missing | None,
        *,
        minimum: int | None = None,
        maximum: int | None = None,
    ) -> int | None:
        present, value = self._fetch(key, default)
        if not present:
            return value  # type: ignore[no-any-return]
        if isinstance(value, bool) or not isinstance(value, int):
            self.error(key, f"expected an integer, got {type_name(value)} ({value!r})")
            return default if isinstance(default, int) else None
        if minimum is not None and value < minimum:
            self.error(key, f"must be at least {minimum}, got {value}")
        if maximum is not None and value > maximum:
            self.error(key, f"must be at most {maximum}, got {value}")
        return value

    def get_number(self, key: str, default: float | _Missing | None) -> float | None:
        present, value = self._fetch(key, default)
        if not present:
            return value  # type: ignore[no-any-return]
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.error(key, f"expected a number, got {type_name(value)} ({value!r})")
            return None
        return float(value)

    def get_bool(self, key: str, default: bool) -> bool:
        present, value = self._fetch(key, default)
        if present and not isinstance(value, bool):
            self.error(key, f"expected true or false, got {type_name(value)} ({value!r})")
            return default
        return bool(value)

    def get_str(self, key: str, default: str | _Missing | None) -> str | None:
        present, value = self._fetch(key, default)
        if not present:
            return value  # type: ignore[no-any-return]
        if not isinstance(value, str):
            self.error(key, f"expected a string, got {type_name(value)} ({value!r})")
            return None
        return value

    def get_choice(self, key: str, choices: Sequence[str], default: str) -> str:
        """An optional choice: the default when absent or invalid (invalid is reported)."""
        return self._choice(key, choices, default) or default

    def get_required_choice(self, key: str, choices: Sequence[str]) -> str | None:
        """A required choice; None when absent or invalid (and reported)."""
        return self._choice(key, choices, REQUIRED)

    def _choice(self, key: str, choices: Sequence[str], default: str | _Missing) -> str | None:
        present, value = self._fetch(key, default)
        if not present:
            return value if isinstance(value, str) else None
        if isinstance(value, bool) and "off" in choices and value is False:
            return "off"  # YAML 1.1 reads a bare `off` as false
        if not isinstance(value, str) or value not in choices:
            allowed = " | ".join(choices)
            self.error(key, f"expected one of {allowed}, got {value!r}")
            return None
        return value

    def get_str_list(self, key: str) -> list[str]:
        present, value = self._fetch(key, [])
        if not present:
            return []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.error(key, f"expected a list of strings, got {value!r}")
            return []
        return list(value)

    def get_mapping(self, key: str, *, required: bool = False) -> Mapping[str, Any] | None:
        present, value = self._fetch(key, REQUIRED if required else None)
        if not present:
            return None
        if not isinstance(value, Mapping):
            self.error(key, f"expected a mapping, got {type_name(value)} ({value!r})")
            return None
        return value

    def section(self, key: str, *, required: bool = False) -> Section:
        mapping = self.get_mapping(key, required=required)
        return Section(mapping or {}, self.key_path(key), self.problems)

    def finish(self, extra_allowed: Sequence[str] = ()) -> None:
        allowed = set(self._seen) | set(extra_allowed)
        for key in self.data:
            if key in allowed:
                continue
            if not isinstance(key, str):
                self.error(None, f"keys must be strings, got {key!r}")
                continue
            hint = difflib.get_close_matches(key, sorted(allowed), n=1)
            suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
            known = ", ".join(sorted(allowed))
            self.error(key, f"unknown key{suggestion} (allowed: {known})")
