"""`LogWatch`: which lines of a run match the experiment's log policies, with a time limit
per line that a pattern which backtracks without end cannot get past."""

from __future__ import annotations

import logging
import time

import pytest

from assay.config import LogPolicy
from assay.master._log_watch import LINE_TIMEOUT_S, LogWatch
from assay.master.lifecycle import Run
from assay.master.lifecycle.log_policy import matched

OOM = LogPolicy("CUDA out of memory", frozenset({"cancel_retries"}), "oom", 0)
ECC = LogPolicy(r"Xid \d+: uncorrectable ECC", frozenset({"exclude_node"}), None, 1)


def _run() -> Run:
    return Run("7.1.x", 7, 1, 3, (("a0", (0,)), ("a1", (0,))), "token")


def test_the_first_matching_line_from_each_agent_is_kept() -> None:
    watch, run = LogWatch(3, (OOM, ECC)), _run()

    watch.scan(
        run, "a0", ["epoch 1", "RuntimeError: CUDA out of memory (1)", "CUDA out of memory (2)"]
    )
    watch.scan(
        run, "a1", ["NVRM: Xid 48: uncorrectable ECC error", "NVRM: Xid 63: uncorrectable ECC"]
    )
    watch.scan(run, "a0", ["nothing here"])

    assert run.log_matches == {
        (0, "a0"): "RuntimeError: CUDA out of memory (1)",
        (1, "a1"): "NVRM: Xid 48: uncorrectable ECC error",
    }
    found = matched(run, (OOM, ECC))
    assert found.cancel == (
        "log_policies[0] ('oom') matched a line from a0: RuntimeError: CUDA out of memory (1)"
    )
    assert found.exclude == (
        ("a1", "log_policies[1] matched a line from a1: NVRM: Xid 48: uncorrectable ECC error"),
    )


def test_a_pattern_that_backtracks_without_end_costs_a_line_not_the_master(
    caplog: pytest.LogCaptureFixture,
) -> None:
    hostile = LogPolicy(r"(a|aa)+$", frozenset({"cancel_retries"}), None, 0)
    watch, run = LogWatch(3, (hostile, OOM)), _run()
    lines = ["a" * 60 + "!"] * 5 + ["CUDA out of memory"]

    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="assay.master"):
        watch.scan(run, "a0", lines)
    took = time.monotonic() - started

    # Each slow line is given up on (the limit, checked now and then: well under 1 s),
    # and the other policies still match.
    assert took < 5 * (LINE_TIMEOUT_S + 1.0), took
    assert run.log_matches == {(1, "a0"): "CUDA out of memory"}
    [warning] = [r.getMessage() for r in caplog.records]
    assert warning == (
        f"experiment 3: log_policies[0] took over {LINE_TIMEOUT_S:g} s on a log line; lines "
        "that slow are not matched"
    )


def test_a_long_line_is_kept_shortened() -> None:
    watch, run = LogWatch(3, (OOM,)), _run()
    watch.scan(run, "a0", ["CUDA out of memory " + "x" * 1000])
    assert len(run.log_matches[(0, "a0")]) == 300
