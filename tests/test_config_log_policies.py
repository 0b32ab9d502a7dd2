"""`log_policies`: every form Determined has accepted is read, and a policy that cannot
work is refused with its key path."""

from __future__ import annotations

from typing import Any

import pytest

from assay.config import LogPolicy, parse_config
from assay.errors import InvalidConfigError


def _config(policies: Any) -> dict[str, Any]:
    return {
        "entrypoint": "python3 train.py",
        "searcher": {"name": "single", "metric": "loss", "max_length": 10},
        "log_policies": policies,
    }


OOM = "CUDA out of memory"


@pytest.mark.parametrize(
    ("policy", "actions", "name"),
    [
        # before 0.36: one action, as a mapping
        ({"pattern": OOM, "action": {"type": "cancel_retries"}}, {"cancel_retries"}, None),
        # 0.36 and 0.37: a list of actions (a signal only labels the trial)
        (
            {"pattern": OOM, "actions": ["cancel_retries", "exclude_node", {"signal": "OOM"}]},
            {"cancel_retries", "exclude_node"},
            None,
        ),
        # 0.38: a name, and one action as a string
        ({"name": "oom", "pattern": OOM, "action": "exclude_node"}, {"exclude_node"}, "oom"),
        (
            {"name": "oom", "pattern": OOM, "action": {"type": "exclude_node"}},
            {"exclude_node"},
            "oom",
        ),
    ],
    ids=["legacy", "actions", "named", "named-legacy-action"],
)
def test_each_form_of_determineds_policies_is_read(
    policy: dict[str, Any], actions: set[str], name: str | None
) -> None:
    config = parse_config(_config([{"pattern": "first", "action": "cancel_retries"}, policy]))

    assert config.log_policies[1] == LogPolicy(OOM, frozenset(actions), name, 1)  # type: ignore[arg-type]
    assert config.log_policies[0].pattern == "first"


@pytest.mark.parametrize(
    ("policies", "says"),
    [
        ([], "log_policies: has no effect: the list is empty"),
        (
            [{"name": "CUDA OOM", "pattern": None}],
            "log_policies[0]: has no effect: a policy without a pattern turns off one of "
            "Determined's default policies, and Assay has none",
        ),
        (
            [{"name": "oom", "pattern": OOM}],
            "log_policies[0]: has no effect: it has no action (cancel_retries or "
            "exclude_node); Assay does not label trials by their log lines",
        ),
        (
            [{"pattern": OOM, "actions": [{"signal": "OOM"}]}],
            "log_policies[0].actions[0]: has no effect: Assay does not label trials with signals",
        ),
    ],
    ids=["empty", "default-off", "label-only", "signal-only"],
)
def test_policies_that_change_nothing_warn(policies: Any, says: str) -> None:
    config = parse_config(_config(policies))

    assert config.log_policies == ()
    assert config.warnings == (says,)


@pytest.mark.parametrize(
    ("policies", "problem"),
    [
        ("oom", "log_policies: expected a list of policies, got a string"),
        (["oom"], "log_policies[0]: expected a mapping {pattern, action}, got 'oom'"),
        ([{"action": "cancel_retries"}], "log_policies[0].pattern: is required"),
        ([{"pattern": "", "action": "cancel_retries"}], "log_policies[0].pattern: is empty"),
        (
            [{"pattern": "(unclosed", "action": "cancel_retries"}],
            "log_policies[0].pattern: is not a regular expression: missing ) at position 9",
        ),
        (
            [{"pattern": "x" * 1001, "action": "cancel_retries"}],
            "log_policies[0].pattern: is 1001 characters; at most 1000",
        ),
        (
            [{"pattern": OOM, "action": "retry_forever"}],
            "log_policies[0].action: expected cancel_retries or exclude_node (or {type: ...}), "
            "got 'retry_forever'",
        ),
        (
            [{"pattern": OOM, "action": {"type": "on_failure_dont_retry"}}],
            "log_policies[0].action: expected cancel_retries or exclude_node",
        ),
        (
            [{"pattern": OOM, "actions": "cancel_retries"}],
            "log_policies[0].actions: expected a list of actions, got a string",
        ),
        (
            [{"pattern": OOM, "action": "cancel_retries", "actions": ["exclude_node"]}],
            "log_policies[0]: give action or actions, not both",
        ),
        (
            [{"pattern": OOM, "action": "cancel_retries", "when": "always"}],
            "log_policies[0].when: unknown key (allowed: action, actions, name, pattern)",
        ),
        (
            [
                {"name": "oom", "pattern": OOM, "action": "cancel_retries"},
                {"name": "oom", "pattern": "ECC", "action": "exclude_node"},
            ],
            "log_policies[1].name: 'oom' names an earlier policy too",
        ),
        (
            [{"pattern": OOM, "action": "cancel_retries"}] * 33,
            "log_policies: at most 32 policies, got 33",
        ),
    ],
    ids=[
        "not-a-list",
        "not-a-mapping",
        "no-pattern",
        "empty-pattern",
        "bad-regex",
        "long-pattern",
        "unknown-action",
        "unknown-legacy-type",
        "actions-not-a-list",
        "both",
        "unknown-key",
        "duplicate-name",
        "too-many",
    ],
)
def test_a_policy_that_cannot_work_is_refused_with_its_key_path(
    policies: Any, problem: str
) -> None:
    with pytest.raises(InvalidConfigError) as info:
        parse_config(_config(policies))

    assert len(info.value.problems) == 1, info.value.problems
    assert info.value.problems[0].startswith(problem)
