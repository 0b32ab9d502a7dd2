"""`run_outcome`: one row per way a run can end, and the precedence between rows."""

from __future__ import annotations

import datetime as dt

import pytest

from assay.config import LogPolicy
from assay.errors import INVALID_HP_EXIT_CODE, PERMANENT_ERROR_EXIT_CODE, PREEMPTED_EXIT_CODE
from assay.master.lifecycle import (
    ExperimentStatus,
    Failure,
    Outcome,
    Restore,
    Run,
    RunEnd,
    TrialState,
    TrialStatus,
    finish_run,
    run_end,
    run_outcome,
)
from assay.master.lifecycle import effects as fx
from assay.master.lifecycle.log_policy import Matched

P = PREEMPTED_EXIT_CODE
E = PERMANENT_ERROR_EXIT_CODE
NOW = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)

ERROR = "exited with code 1: FileNotFoundError: [Errno 2] No such file: '/data/x.csv'"
OOPS = Failure(ERROR, 0, None, run_id=2)
OOPS_1 = Failure(ERROR, 0, None, run_id=1)
AT_40 = Failure(ERROR, 40, None, run_id=1)
OTHER_CKPT = Failure(ERROR, 0, "c-1", run_id=1)
OTHER_ERROR = Failure("exited with code 1: KeyError: 'x'", 0, None, run_id=1)
CANCEL = Matched(cancel="log_policies[0] matched a line from a0: CUDA out of memory")

# (id, RunEnd, outcome): each row is the first that applies for its facts.
ROWS = [
    ("cancel", RunEnd((0,), stopping="cancel", closed=True), Outcome.CANCELED),
    ("kill", RunEnd((-9,), stopping="kill"), Outcome.CANCELED),
    ("kill-trial", RunEnd((-9,), stopping="kill_trial", closed=True), Outcome.KILLED),
    ("closed-and-ok", RunEnd((0, 0), stopping="pause", closed=True), Outcome.COMPLETED),
    (
        "closed-as-its-pause-landed",
        RunEnd((P,), stopping="pause", closed=True, experiment_active=False),
        Outcome.COMPLETED,
    ),
    ("closed-then-crashed", RunEnd((1,), closed=True), Outcome.RESTART),
    ("preempt", RunEnd((P,), stopping="preempt", target=100), Outcome.PREEMPTED),
    ("preempt-failed", RunEnd((1,), stopping="preempt"), Outcome.PREEMPTED),
    ("pause", RunEnd((P,), stopping="pause", experiment_active=False), Outcome.PAUSED),
    ("pause-reactivated", RunEnd((P,), stopping="pause"), Outcome.RESUMED),
    ("lost", RunEnd((), lost=True, target=100), Outcome.LOST),
    ("lost-ok", RunEnd((0,), lost=True), Outcome.LOST),
    ("at-rung", RunEnd((0,), target=None), Outcome.AT_RUNG),
    ("promoted", RunEnd((0,), target=200, released=True), Outcome.PROMOTED),
    ("script-exit-0", RunEnd((0,), target=200, is_script=True), Outcome.SCRIPT_DONE),
    ("sigterm-checkpoint", RunEnd((P, 0), target=200), Outcome.STOPPED),
    ("invalid-hp", RunEnd((INVALID_HP_EXIT_CODE,), target=200), Outcome.INVALID_HP),
    ("permanent", RunEnd((E,), target=200), Outcome.PERMANENT),
    ("permanent-others-stopped", RunEnd((E, -15, 1), target=200), Outcome.PERMANENT),
    ("permanent-script", RunEnd((E,), target=200, is_script=True), Outcome.PERMANENT),
    # A permanent failure overrides what is left of the restarts, never a stop under way.
    (
        "permanent-first-run",
        RunEnd((E,), target=200, restarts=0, max_restarts=5),
        Outcome.PERMANENT,
    ),
    ("permanent-as-preempted", RunEnd((E,), stopping="preempt", target=200), Outcome.PREEMPTED),
    ("permanent-agent-lost", RunEnd((E,), lost=True, target=200), Outcome.LOST),
    ("permanent-when-canceled", RunEnd((E,), stopping="cancel"), Outcome.CANCELED),
    ("failed", RunEnd((1,), target=200, restarts=0, max_restarts=1), Outcome.RESTART),
    # The same error at the same batch from the same checkpoint as the run before.
    ("repeated", RunEnd((1,), target=200, failure=OOPS, last_failure=OOPS_1), Outcome.REPEATED),
    ("repeated-last", RunEnd((1,), failure=OOPS, last_failure=OOPS_1), Outcome.REPEATED),
    ("progress-since", RunEnd((1,), failure=OOPS, last_failure=AT_40), Outcome.RESTART),
    ("new-checkpoint", RunEnd((1,), failure=OOPS, last_failure=OTHER_CKPT), Outcome.RESTART),
    ("other-error", RunEnd((1,), failure=OOPS, last_failure=OTHER_ERROR), Outcome.RESTART),
    ("first-failure", RunEnd((1,), target=200, failure=OOPS), Outcome.RESTART),
    (
        "repeated-but-preempted",
        RunEnd((1,), stopping="preempt", failure=OOPS, last_failure=OOPS_1),
        Outcome.PREEMPTED,
    ),
    ("repeated-permanent", RunEnd((E,), failure=OOPS, last_failure=OOPS_1), Outcome.PERMANENT),
    # With no restarts left, that is the reason given.
    (
        "repeated-none-left",
        RunEnd((1,), restarts=1, max_restarts=1, failure=OOPS, last_failure=OOPS_1),
        Outcome.ERROR,
    ),
    ("log-policy", RunEnd((1,), target=200, matched=CANCEL), Outcome.LOG_POLICY),
    ("log-policy-none-left", RunEnd((1,), max_restarts=0, matched=CANCEL), Outcome.ERROR),
    ("log-policy-lost", RunEnd((), lost=True, matched=CANCEL), Outcome.LOST),
    (
        "log-policy-ok",
        RunEnd((0,), target=200, is_script=True, matched=CANCEL),
        Outcome.SCRIPT_DONE,
    ),
    ("no-codes", RunEnd((), target=200), Outcome.RESTART),
    ("exit-0-short", RunEnd((0,), target=200), Outcome.RESTART),
    ("no-restarts-left", RunEnd((1,), target=200, restarts=1, max_restarts=1), Outcome.ERROR),
    ("never-restart", RunEnd((1,), max_restarts=0), Outcome.ERROR),
]


@pytest.mark.parametrize(("end", "outcome"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_each_way_a_run_ends(end: RunEnd, outcome: Outcome) -> None:
    assert run_outcome(end) is outcome


def test_every_outcome_has_a_row() -> None:
    assert {r[2] for r in ROWS} == set(Outcome)


def _trial(**fields: object) -> TrialState:
    base: dict[str, object] = {
        "id": 7,
        "experiment_id": 3,
        "request_id": "r7",
        "hparams": {},
        "seed": 1,
        "state": TrialStatus.RUNNING,
        "run_id": 2,
        "target": 200,
    }
    return TrialState(**{**base, **fields})  # type: ignore[arg-type]


def _run(**fields: object) -> Run:
    run = Run("7.2.x", 7, 2, 3, (("a0", (0,)),), "token")
    for key, value in fields.items():
        setattr(run, key, value)
    return run


def _states(effects: list[fx.Effect]) -> list[object]:
    return [
        e.fields["state"] for e in effects if isinstance(e, fx.SetTrial) and "state" in e.fields
    ]


def test_a_failure_with_restarts_left_requeues_at_the_back_and_says_where_from() -> None:
    trial = _trial(checkpoint=Restore("u", 100, "/c/u"))
    end = RunEnd((1,), target=200, restarts=0, max_restarts=2)
    outcome, effects = finish_run(_run(messages=["a0: boom"]), trial, end, NOW)
    assert outcome is Outcome.RESTART
    assert _states(effects) == [TrialStatus.QUEUED]
    assert fx.Enqueue(7, to_back=True) in effects
    [line] = [e for e in effects if isinstance(e, fx.Log)]
    assert line.level == "ERROR"
    assert line.message == (
        "assay: run 2 failed (a0: boom); restart 1 of 2 from its latest checkpoint"
    )
    assert isinstance(effects[-1], fx.Settle)


def test_a_restart_without_a_checkpoint_does_not_claim_one() -> None:
    end = RunEnd((1,), target=200, restarts=0, max_restarts=2)
    _, effects = finish_run(_run(), _trial(), end, NOW)
    [line] = [e for e in effects if isinstance(e, fx.Log)]
    assert "restart 1 of 2 from the start (no checkpoint yet)" in line.message
    assert "latest checkpoint" not in line.message


def test_the_last_failure_ends_the_trial_and_tells_the_searcher() -> None:
    trial = _trial(checkpointed=True)
    end = RunEnd((1,), target=200, restarts=1, max_restarts=1)
    outcome, effects = finish_run(_run(), trial, end, NOW)
    assert outcome is Outcome.ERROR
    assert _states(effects) == [TrialStatus.ERROR]
    assert fx.CollectGarbage(3, ended_trial_ids=(7,)) in effects
    assert fx.Tell(3, "r7", "on_trial_exited_early", ("errored",)) in effects


def test_a_permanent_failure_ends_the_trial_at_its_first_run_with_its_cause() -> None:
    trial = _trial(checkpoint=Restore("u", 100, "/c/u"), checkpointed=True)
    end = RunEnd((E,), target=200, restarts=0, max_restarts=5)
    cause = "a0: rank 0 exited with code 78; its last output: error: entrypoint 'm:T': ..."
    outcome, effects = finish_run(_run(messages=[cause]), trial, end, NOW)
    assert outcome is Outcome.PERMANENT
    assert _states(effects) == [TrialStatus.ERROR]
    assert not any("restarts" in e.fields for e in effects if isinstance(e, fx.SetTrial))
    assert not [e for e in effects if isinstance(e, fx.Enqueue)]
    assert fx.SetTrial(7, {"last_error": f"run 2: {cause}"}) in effects
    assert fx.Tell(3, "r7", "on_trial_exited_early", ("errored",)) in effects
    assert fx.CollectGarbage(3, ended_trial_ids=(7,)) in effects
    [line] = [e for e in effects if isinstance(e, fx.Log)]
    assert line.level == "ERROR"
    assert line.message == (
        f"assay: run 2 failed ({cause}); every run would fail the same way: the trial ends "
        "in ERROR, not restarted"
    )


def test_a_closed_trial_completes_and_the_searcher_learns_it() -> None:
    _, effects = finish_run(_run(), _trial(closed=True), RunEnd((0,), closed=True), NOW)
    assert _states(effects) == [TrialStatus.COMPLETED]
    assert fx.Tell(3, "r7", "on_trial_closed") in effects
    # It never checkpointed: nothing to collect.
    assert not [e for e in effects if isinstance(e, fx.CollectGarbage)]


def test_a_lost_agent_requeues_without_counting_a_restart() -> None:
    _, effects = finish_run(_run(lost=True), _trial(), RunEnd((), lost=True, target=200), NOW)
    assert _states(effects) == [TrialStatus.QUEUED]
    assert not any("restarts" in e.fields for e in effects if isinstance(e, fx.SetTrial))
    assert fx.Enqueue(7) in effects


def test_a_killed_trial_ends_canceled_and_its_searcher_sees_it_exit() -> None:
    trial = _trial(checkpointed=True)
    outcome, effects = finish_run(_run(), trial, RunEnd((-9,), stopping="kill_trial"), NOW)
    assert outcome is Outcome.KILLED
    assert _states(effects) == [TrialStatus.CANCELED]
    assert fx.CollectGarbage(3, ended_trial_ids=(7,)) in effects
    assert fx.Tell(3, "r7", "on_trial_exited_early", ("user_canceled",)) in effects
    assert isinstance(effects[-1], fx.Settle)


def test_a_run_released_before_a_master_restart_is_promoted_not_failed() -> None:
    # The harness validated and checkpointed at 100, the master answered "no more" (and
    # stored that) and died; the searcher set the next target (200) before it did. The
    # restarted master takes the run over as the store says and sees it exit 0.
    at_100 = _trial(total_batches=100, checkpoint=Restore("u", 100, "/c/u"), target=200)
    active = ExperimentStatus.ACTIVE

    def end(run: Run, *, is_script: bool = False) -> Outcome:
        return run_outcome(run_end(run, at_100, active, is_script=is_script, max_restarts=5))

    released = _run(exit_codes={"a0": [0]}, deadline=5.0, released=True)
    assert end(released) is Outcome.PROMOTED
    # Not told "no more": an exit 0 short of the target is user code stopping short (a
    # failed run), even where its trial last checkpointed; a script decides its own end.
    taken_over = _run(exit_codes={"a0": [0]}, deadline=5.0)
    assert end(taken_over) is Outcome.RESTART
    assert end(taken_over, is_script=True) is Outcome.SCRIPT_DONE


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        (
            {"total_batches": 400, "best_validation": None},
            "exited 0 at batch 400, without reporting the searcher's metric 'val_loss' "
            "(searcher.metric) in any validation",
        ),
        (
            # trained to its target, last validated before it (Lightning at an epoch's end)
            {"total_batches": 400, "target": 400, "best_validation": 0.3},
            "exited 0 at batch 400, without a validation at or after its searcher target 400",
        ),
        (
            {"total_batches": 20, "target": 100, "best_validation": 0.3},
            "exited 0 at batch 20, before its searcher target 100",
        ),
    ],
    ids=["never-validated", "validated-before-target", "stopped-early"],
)
def test_a_script_done_says_what_the_searcher_missed(fields: dict[str, object], says: str) -> None:
    trial = _trial(**fields)

    end = RunEnd((0,), target=200, is_script=True, metric="val_loss")
    outcome, effects = finish_run(_run(), trial, end, NOW)

    assert outcome is Outcome.SCRIPT_DONE
    [log] = [e for e in effects if isinstance(e, fx.Log)]
    assert says in log.message
    assert log.message.endswith(": the trial ends as completed")


def _ended(trial: TrialState, run: Run, **kwargs: object) -> tuple[Outcome, list[fx.Effect]]:
    end = run_end(run, trial, ExperimentStatus.ACTIVE, is_script=True, max_restarts=5, **kwargs)  # type: ignore[arg-type]
    return finish_run(run, trial, end, NOW)


def test_a_failure_that_repeats_the_run_before_ends_the_trial_and_says_why() -> None:
    # A script opening a missing data file: run 1 failed, was restarted, and run 2 fails
    # with the same line at the same batch, with no checkpoint between.
    cause = "a0: rank 0 exited with code 1; its last output: " + ERROR.split(": ", 1)[1]
    first, effects = _ended(_trial(run_id=1), _run(run_id=1, messages=[cause], failure=ERROR))
    assert first is Outcome.RESTART
    assert fx.SetTrial(7, {"last_failure": Failure(ERROR, 0, None, 1)}) in effects
    assert fx.RecordSearch(3) in effects  # stored with the search state
    trial = _trial(run_id=2, restarts=1, last_failure=Failure(ERROR, 0, None, 1))

    second, effects = _ended(trial, _run(messages=[cause], failure=ERROR))

    assert second is Outcome.REPEATED
    assert _states(effects) == [TrialStatus.ERROR]
    assert not [e for e in effects if isinstance(e, fx.Enqueue)]
    reason = (
        "not restarted: it failed as run 1 did, at batch 0, with no batch or checkpoint "
        "gained since"
    )
    assert fx.SetTrial(7, {"last_error": f"run 2 ({reason}): {cause}"}) in effects
    assert fx.Tell(3, "r7", "on_trial_exited_early", ("errored",)) in effects
    [line] = [e for e in effects if isinstance(e, fx.Log)]
    assert line.level == "ERROR"
    assert line.message == (
        f"assay: run 2 failed ({cause}); {reason}: the trial ends in ERROR "
        "(4 of max_restarts 5 unused)"
    )


def test_a_failure_after_progress_is_restarted_and_compared_from_there() -> None:
    trial = _trial(run_id=2, restarts=1, total_batches=60, last_failure=AT_40)
    outcome, effects = _ended(trial, _run(failure=ERROR))
    assert outcome is Outcome.RESTART
    assert fx.SetTrial(7, {"last_failure": Failure(ERROR, 60, None, 2)}) in effects
    # A run that says nothing to compare (no line) is restarted, and the failure before
    # it is forgotten: only two failures in a row are compared.
    outcome, effects = _ended(trial, _run())
    assert outcome is Outcome.RESTART
    assert fx.SetTrial(7, {"last_failure": None}) in effects
    _, effects = _ended(_trial(run_id=2, restarts=1), _run())
    assert not [e for e in effects if isinstance(e, fx.RecordSearch)]  # nothing changed


POLICIES = (
    LogPolicy("CUDA out of memory", frozenset({"cancel_retries"}), "oom", 0),
    LogPolicy("ECC error", frozenset({"exclude_node"}), None, 1),
)


def test_a_line_matching_a_cancel_retries_policy_ends_the_trial_at_its_failure() -> None:
    run = _run(messages=["a0: rank 0 exited with code 1"])
    run.log_matches[(0, "a0")] = "RuntimeError: CUDA out of memory. Tried to allocate 2 GiB"

    outcome, effects = _ended(_trial(), run, policies=POLICIES)

    assert outcome is Outcome.LOG_POLICY
    assert _states(effects) == [TrialStatus.ERROR]
    said = (
        "not restarted: log_policies[0] ('oom') matched a line from a0: RuntimeError: CUDA "
        "out of memory. Tried to allocate 2 GiB (cancel_retries)"
    )
    [error] = [
        e.fields["last_error"]
        for e in effects
        if isinstance(e, fx.SetTrial) and "last_error" in e.fields
    ]
    assert error == f"run 2 ({said}): a0: rank 0 exited with code 1"
    [line] = [e for e in effects if isinstance(e, fx.Log)]
    assert f"; {said}: the trial ends in ERROR (5 of max_restarts 5 unused)" in line.message


def test_a_line_matching_an_exclude_node_policy_steers_the_next_runs_away() -> None:
    run = _run(placement=(("a0", (0,)), ("a1", (0,))))
    run.log_matches[(1, "a1")] = "NVRM: Xid 48: uncorrectable ECC error"

    outcome, effects = _ended(_trial(excluded_agents=("a9",)), run, policies=POLICIES)

    assert outcome is Outcome.RESTART
    avoid = effects.index(fx.SetTrial(7, {"excluded_agents": ("a9", "a1")}))
    assert avoid < effects.index(fx.Enqueue(7, to_back=True))  # its request avoids them
    assert fx.RecordSearch(3) in effects
    [note] = [e for e in effects if isinstance(e, fx.Log) and "exclude_node" in e.message]
    assert note.message == (
        "assay: run 2: log_policies[1] matched a line from a1: NVRM: Xid 48: uncorrectable "
        "ECC error (exclude_node): the trial's runs avoid a1"
    )
    # A trial that ends has no next run to steer.
    _, ended = _ended(_trial(restarts=5), run, policies=POLICIES)
    assert not [e for e in ended if isinstance(e, fx.SetTrial) and "excluded_agents" in e.fields]
