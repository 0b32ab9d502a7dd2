"""Errors that Assay raises for users to read.

Each carries a message that says what is wrong and what to do about it; the CLI prints
the message alone (no traceback) and exits non-zero.
"""

from __future__ import annotations

from collections.abc import Sequence


class AssayError(Exception):
    """Base class of every error Assay reports to a user."""


class InvalidConfigError(AssayError):
    """The experiment config is invalid; `problems` lists each as `key.path: what to fix`."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"invalid experiment config:\n{lines}")


class PermanentError(AssayError):
    """A failure that running the trial again would repeat, whatever the machine.

    Raised (as one of its subclasses, or wrapping the original error) for an entrypoint
    that names no importable Trial, a Trial whose construction fails on a programming
    error (a `TypeError` from a hyperparameter of the wrong type, an unknown
    hyperparameter), and a validation that lacks `searcher.metric`. On a cluster the
    trial's process exits with `PERMANENT_ERROR_EXIT_CODE` and the trial ends in ERROR at
    once, without using its restarts.
    """


class TrialLoadError(AssayError):
    """The model directory or entrypoint could not be turned into a Trial class."""


class EntrypointError(TrialLoadError, PermanentError):
    """The entrypoint names no Trial class that can be imported: a missing module or
    class, a syntax or import error in the model definition, not a Trial subclass."""


class HyperparameterError(AssayError, KeyError):
    """A trial asked for a hyperparameter the experiment does not define."""

    def __str__(self) -> str:
        return str(self.args[0])


class InvalidHP(AssayError):  # noqa: N818 - Determined's name, kept for portability
    """Raised by a Trial to say its hyperparameters are unusable (not a failure).

    On a cluster the trial's process exits with `INVALID_HP_EXIT_CODE`, and the searcher
    replaces the trial with another instead of restarting it.
    """


# The exit code of a cluster trial process whose Trial raised InvalidHP.
INVALID_HP_EXIT_CODE = 77
# The exit code of a cluster trial process that stopped at a checkpoint when asked to
# (SIGTERM or the master's preemption request): it resumes later, not counted as a failure.
PREEMPTED_EXIT_CODE = 80
# The exit code of a cluster trial process that failed with a `PermanentError`: the trial
# ends in ERROR without a restart (sysexits' EX_CONFIG).
PERMANENT_ERROR_EXIT_CODE = 78


class TrialPreempted(AssayError):  # noqa: N818 - a stop asked for, not a failure
    """Training stopped at a checkpoint because it was asked to; it resumes later."""


class TrainingError(AssayError):
    """Training could not run: a worker failed, or the Trial broke a contract."""


class TrialContractError(TrainingError, PermanentError):
    """The Trial broke a contract as it was built (a hook's signature, a missing
    evaluation method, a setting its code contradicts): every run would do the same."""


class SearcherMetricError(TrainingError, PermanentError):
    """A validation did not return the metric `searcher.metric` names."""


# What Gloo and NCCL print when the ranks' collectives do not pair up (one rank in
# `should_preempt()` while another is in DDP's gradient all-reduce, say).
_COLLECTIVE_MISMATCH = ("collective mismatch", "op.preamble.length <= op.nbytes")


def early_exit_hint(ranks: Sequence[int]) -> str:
    """A hint to add to a failed rank's message when other ranks had already exited 0
    while it trained on; "" when none had."""
    if not ranks:
        return ""
    left = ", ".join(str(r) for r in ranks)
    return (
        f"; rank {left} had already exited 0 while it trained on: every rank must run the "
        "same loop to the end, or the others wait for it in a collective"
    )


def collective_mismatch_hint(output: str) -> str:
    """A hint to add to a failed rank's message when its output shows that the ranks made
    different collective calls; "" otherwise."""
    if not any(sign in output for sign in _COLLECTIVE_MISMATCH):
        return ""
    return (
        "; the ranks made different collective calls: call core.preempt.should_preempt(), "
        "gather/broadcast/barrier and store_path(shard=True) on every rank at the same "
        "points (not under `if rank == 0`)"
    )
