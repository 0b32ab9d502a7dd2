"""`log_policies`: Determined's rules that act on a trial's log lines.

Each policy is a regular expression searched for in every line a trial's ranks write,
and what to do when the run that wrote the line fails: `cancel_retries` (the trial
ends in ERROR instead of restarting) or `exclude_node` (its next runs avoid the agent
whose rank wrote the line). Every form Determined has accepted is read:

    - {pattern: "CUDA out of memory", action: {type: cancel_retries}}   # before 0.36
    - {pattern: "...", actions: [cancel_retries, exclude_node]}         # 0.36, 0.37
    - {name: oom, pattern: "...", action: cancel_retries}               # 0.38

A `signal` (0.37) or a policy without an action (0.38: it only labels the trial in
Determined's web UI) changes nothing here and says so in a warning. Patterns are
compiled with the `regex` module, which the master also matches them with, each line
under a time limit: Determined's patterns are RE2 (Go) expressions, which it reads alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from assay.config._reader import Section, type_name

Action = Literal["cancel_retries", "exclude_node"]
ACTIONS: tuple[Action, ...] = ("cancel_retries", "exclude_node")
MAX_POLICIES = 32
MAX_PATTERN_CHARS = 1000


@dataclass(frozen=True)
class LogPolicy:
    """A pattern searched for in each log line, and what a match does when its run fails."""

    pattern: str
    actions: frozenset[Action]
    name: str | None = None
    index: int = 0  # its place in `log_policies`, for messages

    @property
    def label(self) -> str:
        """`log_policies[0] ('oom')`: the policy as messages name it."""
        named = f" ({self.name!r})" if self.name else ""
        return f"log_policies[{self.index}]{named}"


def parse_log_policies(top: Section, warnings: list[str]) -> tuple[LogPolicy, ...]:
    """The policies of `log_policies` that act (an empty list, or policies that do
    nothing here, give warnings); every problem is recorded with its key path."""
    if "log_policies" not in top.data:
        return ()
    value = top.raw("log_policies")
    if value in (None, []):
        warnings.append("log_policies: has no effect: the list is empty")
        return ()
    if not isinstance(value, list):
        top.error("log_policies", f"expected a list of policies, got {type_name(value)}")
        return ()
    if len(value) > MAX_POLICIES:
        top.error("log_policies", f"at most {MAX_POLICIES} policies, got {len(value)}")
        return ()
    policies: list[LogPolicy] = []
    names: set[str] = set()
    for i, item in enumerate(value):
        where = f"log_policies[{i}]"
        if not isinstance(item, Mapping):
            top.problems.append(f"{where}: expected a mapping {{pattern, action}}, got {item!r}")
            continue
        policy = _policy(Section(item, where, top.problems), i, warnings)
        if policy is not None and policy.name is not None:
            if policy.name in names:
                top.problems.append(f"{where}.name: {policy.name!r} names an earlier policy too")
            names.add(policy.name)
        if policy is not None and policy.actions:
            policies.append(policy)
    return tuple(policies)


def _policy(s: Section, index: int, warnings: list[str]) -> LogPolicy | None:
    name = s.get_str("name", None)
    pattern = s.get_str("pattern", None)
    said = len(warnings)
    actions = _actions(s, warnings)
    s.finish()
    if actions is None:
        return None
    if pattern is None:
        if s.raw("pattern") is None and name is not None:
            warnings.append(
                f"{s.path}: has no effect: a policy without a pattern turns off one of "
                "Determined's default policies, and Assay has none"
            )
        else:
            s.error("pattern", "is required: a regular expression searched for in each line")
        return None
    if not _pattern_ok(s, pattern):
        return None
    if not actions and len(warnings) == said:  # (a signal's warning says it already)
        warnings.append(
            f"{s.path}: has no effect: it has no action (cancel_retries or exclude_node); "
            "Assay does not label trials by their log lines"
        )
    return LogPolicy(pattern, frozenset(actions), name, index)


def _actions(s: Section, warnings: list[str]) -> set[Action] | None:
    """The policy's actions (empty: none), or None when they are invalid (recorded)."""
    if s.has("action") and s.has("actions"):
        s.error(None, "give action or actions, not both")
        return None
    if s.has("action"):
        read = [_action(s, "action", s.raw("action"), warnings)]
    else:
        listed = s.raw("actions")
        if listed is not None and not isinstance(listed, list):
            s.error("actions", f"expected a list of actions, got {type_name(listed)}")
            return None
        read = [_action(s, f"actions[{i}]", a, warnings) for i, a in enumerate(listed or [])]
    if None in read:
        return None
    return {a for a in ACTIONS if a in read}


def _action(s: Section, key: str, value: Any, warnings: list[str]) -> str | None:
    """`cancel_retries` or `exclude_node` (also as `{type: ...}`), or `signal`, which
    changes nothing here (a warning says so); None when invalid (recorded)."""
    if isinstance(value, Mapping) and set(value) == {"signal"}:
        warnings.append(
            f"{s.key_path(key)}: has no effect: Assay does not label trials with signals"
        )
        return "signal"
    kind = value.get("type") if isinstance(value, Mapping) and set(value) == {"type"} else value
    if isinstance(kind, str) and kind in ACTIONS:
        return kind
    s.error(key, f"expected cancel_retries or exclude_node (or {{type: ...}}), got {value!r}")
    return None


def _pattern_ok(s: Section, pattern: str) -> bool:
    if not pattern:
        s.error("pattern", "is empty: it would match every line")
        return False
    if len(pattern) > MAX_PATTERN_CHARS:
        s.error("pattern", f"is {len(pattern)} characters; at most {MAX_PATTERN_CHARS}")
        return False
    import regex

    try:
        regex.compile(pattern)
    except regex.error as e:
        s.error("pattern", f"is not a regular expression: {e} ({pattern!r})")
        return False
    return True


__all__ = ["ACTIONS", "MAX_POLICIES", "Action", "LogPolicy", "parse_log_policies"]
