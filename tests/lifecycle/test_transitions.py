"""The lifecycles' transitions on plain data: each returns the effects the shell applies."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from assay.config import parse_config
from assay.master.errors import ConflictError
from assay.master.lifecycle import (
    CONTINUE_EDGES,
    EXPERIMENT_EDGES,
    RELEASED,
    TERMINAL_EXPERIMENT,
    TERMINAL_TRIAL,
    TRIAL_EDGES,
    ExperimentState,
    ExperimentStatus,
    Restore,
    Run,
    TrialState,
    TrialStatus,
)
from assay.master.lifecycle import agent as agent_life
from assay.master.lifecycle import effects as fx
from assay.master.lifecycle import experiment as experiment_life
from assay.master.lifecycle import trial as trial_life
from assay.master.searcher import Close, Create, Shutdown, ValidateAfter
from assay.master.submission import new_searcher

E, T = ExperimentStatus, TrialStatus
NOW = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)


def _experiment(state: ExperimentStatus = E.ACTIVE, **searcher: Any) -> ExperimentState:
    config = parse_config(
        {
            "name": "t",
            "entrypoint": "model_def:T",
            "hyperparameters": {"lr": 0.1, "global_batch_size": 8},
            "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 10}}
            | searcher,
        }
    )
    return ExperimentState(1, config, state, 0, new_searcher(config))


def _trial(experiment: ExperimentState, id: int, state: TrialStatus, **kw: Any) -> TrialState:
    trial = TrialState(id, experiment.id, f"r{id}", {}, 0, state, **kw)
    experiment.add_trial(trial)
    return trial


def _run(trial: TrialState, agent: str = "a0") -> Run:
    return Run(f"{trial.id}.1.x", trial.id, 1, trial.experiment_id, ((agent, (0,)),), "tok")


def _states(effects: list[fx.Effect]) -> dict[int, object]:
    return {
        e.trial_id: e.fields["state"]
        for e in effects
        if isinstance(e, fx.SetTrial) and "state" in e.fields
    }


def test_terminal_states_have_no_way_out_but_continue() -> None:
    out = {(str(s), str(n)) for s in TERMINAL_EXPERIMENT for n in EXPERIMENT_EDGES[s]}
    out |= {(str(s), str(n)) for s in TERMINAL_TRIAL for n in TRIAL_EDGES[s]}
    assert out == CONTINUE_EDGES
    assert set(EXPERIMENT_EDGES) == set(ExperimentStatus)
    assert set(TRIAL_EDGES) == set(TrialStatus)


@pytest.mark.parametrize(
    ("action", "state"),
    [("pause", E.PAUSED), ("activate", E.ACTIVE), ("cancel", E.ACTIVE), ("archive", E.ACTIVE)],
)
def test_an_action_refused_says_which_states_it_applies_to(
    action: str, state: ExperimentStatus
) -> None:
    experiment = _experiment(state)
    if action == "cancel":
        experiment.state = E.CANCELED
    with pytest.raises(ConflictError, match=f"cannot {action} experiment 1: it is"):
        experiment_life.act(experiment, action, {}, NOW)


def test_pause_stops_running_trials_at_a_checkpoint_and_parks_queued_ones() -> None:
    experiment = _experiment()
    running = _trial(experiment, 1, T.RUNNING)
    queued = _trial(experiment, 2, T.QUEUED)
    _trial(experiment, 3, T.COMPLETED)
    run = _run(running)
    effects = experiment_life.act(experiment, "pause", {1: run}, NOW)
    assert effects[0] == fx.SetExperiment(1, {"state": E.PAUSED})
    assert _states(effects) == {1: T.STOPPING, 2: T.PAUSED}
    assert fx.Kill(run.allocation_id, graceful=True, stopping="pause") in effects
    assert fx.Dequeue(queued.id) in effects


def test_kill_is_not_graceful_and_cancels_queued_trials() -> None:
    experiment = _experiment()
    running = _trial(experiment, 1, T.RUNNING)
    _trial(experiment, 2, T.QUEUED, checkpointed=True)
    effects = experiment_life.act(experiment, "kill", {1: _run(running)}, NOW)
    assert effects[0] == fx.SetExperiment(1, {"state": E.STOPPING_KILLED})
    assert fx.Kill("1.1.x", graceful=False, stopping="kill") in effects
    assert _states(effects) == {1: T.STOPPING, 2: T.CANCELED}
    assert fx.CollectGarbage(1, ended_trial_ids=(2,)) in effects
    assert effects[-1] == fx.Settle(1)


def test_a_trial_kill_stops_that_trial_only_and_its_searcher_sees_it_exit() -> None:
    experiment = _experiment()
    running = _trial(experiment, 1, T.RUNNING)
    queued = _trial(experiment, 2, T.QUEUED)
    other = _trial(experiment, 3, T.RUNNING)
    run = _run(running)
    effects = experiment_life.kill_trial(experiment, running, run, NOW)
    assert effects == [
        fx.SetTrial(1, {"state": T.STOPPING}),
        fx.Kill(run.allocation_id, graceful=False, stopping="kill_trial"),
    ]
    run.stopping = "kill_trial"
    assert experiment_life.kill_trial(experiment, running, run, NOW) == []  # once
    # A pause meanwhile stops the other trials and lets the kill land.
    paused = experiment_life.act(experiment, "pause", {1: run, 3: _run(other)}, NOW)
    assert _states(paused) == {2: T.PAUSED, 3: T.STOPPING}
    effects = experiment_life.kill_trial(experiment, queued, None, NOW)
    assert fx.Dequeue(2) in effects
    assert _states(effects) == {2: T.CANCELED}
    assert fx.Tell(1, "r2", "on_trial_exited_early", ("user_canceled",)) in effects
    assert effects[-1] == fx.Settle(1)
    assert not any(isinstance(e, fx.SetExperiment) for e in effects)


def test_a_trial_kill_is_refused_for_an_ended_trial_or_a_stopping_experiment() -> None:
    experiment = _experiment()
    done = _trial(experiment, 1, T.COMPLETED)
    with pytest.raises(ConflictError, match="cannot kill trial 1: it has ended"):
        experiment_life.kill_trial(experiment, done, None, NOW)
    experiment.state = E.STOPPING_KILLED
    live = _trial(experiment, 2, T.STOPPING)
    with pytest.raises(ConflictError, match="STOPPING_KILLED and stops all its trials"):
        experiment_life.kill_trial(experiment, live, _run(live), NOW)


def test_activate_requeues_only_trials_with_a_target() -> None:
    experiment = _experiment(E.PAUSED)
    _trial(experiment, 1, T.PAUSED, target=10)
    _trial(experiment, 2, T.PAUSED, target=None)  # waits for a promotion
    effects = experiment_life.act(experiment, "activate", {}, NOW)
    assert _states(effects) == {1: T.QUEUED}
    assert fx.Enqueue(1) in effects


def test_activate_completes_a_paused_trial_its_searcher_closed() -> None:
    experiment = _experiment(E.PAUSED)
    _trial(experiment, 1, T.PAUSED, closed=True)
    effects = experiment_life.act(experiment, "activate", {}, NOW)
    assert _states(effects) == {1: T.COMPLETED}
    assert fx.Tell(1, "r1", "on_trial_closed") in effects


def test_searcher_operations() -> None:
    experiment = _experiment()
    new = experiment_life.apply_operation(experiment, Create("r9", {"lr": 1}, 5), set(), NOW)
    assert new == [
        fx.NewTrial(1, "r9", {"lr": 1}, 5, T.QUEUED),
        fx.Tell(1, "r9", "on_trial_created"),
    ]
    paused = _trial(experiment, 2, T.PAUSED)
    promoted = experiment_life.apply_operation(experiment, ValidateAfter("r2", 40), set(), NOW)
    assert promoted == [
        fx.SetTrial(2, {"target": 40}),
        fx.SetTrial(2, {"state": T.QUEUED}),
        fx.Enqueue(2),
    ]
    closed = experiment_life.apply_operation(experiment, Close("r2"), set(), NOW)
    assert _states(closed) == {paused.id: T.COMPLETED}
    assert fx.Tell(1, "r2", "on_trial_closed") in closed
    running = _trial(experiment, 3, T.RUNNING)
    # A running trial is closed in memory and stops at its next question.
    assert experiment_life.apply_operation(experiment, Close("r3"), {running.id}, NOW) == [
        fx.SetTrial(3, {"closed": True, "target": None})
    ]
    assert experiment_life.apply_operation(experiment, Shutdown(), set(), NOW) == [
        fx.SetExperiment(1, {"shutdown": True})
    ]


def test_an_experiment_ends_when_its_search_is_over_and_its_trials_have_ended() -> None:
    experiment = _experiment()
    _trial(experiment, 1, T.COMPLETED, checkpointed=True)
    waiting = _trial(experiment, 2, T.RUNNING)
    assert experiment_life.settle(experiment, set(), NOW) == ([], None)
    waiting.state = T.ERROR
    experiment.shutdown = True
    effects, problem = experiment_life.settle(experiment, set(), NOW)
    assert problem is None
    assert effects == [
        fx.SetExperiment(1, {"state": E.COMPLETED, "end_time": NOW, "progress": 1.0}),
        fx.CollectGarbage(1, experiment_ended=True),
        fx.Drop(1),
    ]


def test_a_searcher_that_stops_without_finishing_ends_its_experiment_with_a_warning() -> None:
    experiment = _experiment()
    _trial(experiment, 1, T.ERROR)
    effects, problem = experiment_life.settle(experiment, set(), NOW)
    assert problem is not None
    assert "stopped without finishing" in problem
    assert effects[0] == fx.SetExperiment(1, {"state": E.ERROR, "end_time": NOW, "progress": 0.0})
    # A queued trial of it keeps it going.
    assert experiment_life.settle(experiment, {1}, NOW) == ([], None)


@pytest.mark.parametrize(
    ("ends", "final"),
    [
        ((T.CANCELED, T.CANCELED), E.CANCELED),  # a user killed every trial: as Determined
        ((T.CANCELED, T.COMPLETED), E.COMPLETED),
        ((T.CANCELED, T.ERROR), E.ERROR),  # none completed, one failed
        ((T.ERROR, T.ERROR), E.ERROR),
    ],
)
def test_an_experiment_ends_by_how_its_trials_ended(
    ends: tuple[TrialStatus, ...], final: ExperimentStatus
) -> None:
    experiment = _experiment()
    for trial_id, state in enumerate(ends, start=1):
        _trial(experiment, trial_id, state)
    experiment.shutdown = True
    effects, problem = experiment_life.settle(experiment, set(), NOW)
    assert problem is None
    first = effects[0]
    assert isinstance(first, fx.SetExperiment)
    assert first.fields["state"] == final
    assert final in EXPERIMENT_EDGES[E.ACTIVE]


def test_a_paused_or_stopping_experiment() -> None:
    experiment = _experiment(E.PAUSED)
    _trial(experiment, 1, T.CANCELED)
    assert experiment_life.settle(experiment, set(), NOW) == ([], None)
    experiment.state = E.STOPPING_CANCELED
    effects, _ = experiment_life.settle(experiment, set(), NOW)
    assert effects[0] == fx.SetExperiment(
        1, {"state": E.CANCELED, "end_time": NOW, "progress": 0.0}
    )


def test_reconcile_adopts_kills_and_loses() -> None:
    experiment = _experiment()
    adopted = _run(_trial(experiment, 1, T.RUNNING))
    adopted.awaiting = {"a0"}
    stopping = _run(_trial(experiment, 2, T.STOPPING))
    stopping.stopping = "kill"
    gone = _run(_trial(experiment, 3, T.RUNNING))
    elsewhere = _run(_trial(experiment, 4, T.RUNNING), agent="a1")
    given_up = _run(_trial(experiment, 5, T.RUNNING))
    given_up.exit_codes["a0"] = []  # the master stopped waiting for it
    effects = agent_life.reconcile(
        "a0",
        {adopted.allocation_id, stopping.allocation_id, given_up.allocation_id, "stranger"},
        [adopted, stopping, gone, elsewhere, given_up],
    )
    assert effects == [
        fx.Adopt(adopted.allocation_id, "a0"),
        fx.Kill(stopping.allocation_id, graceful=False),
        fx.PartLost(gone.allocation_id, "a0"),
        fx.KillUnknown("a0", given_up.allocation_id),
        fx.KillUnknown("a0", "stranger"),
    ]


def test_reap_gives_up_on_silent_and_gone_agents_and_unconfirmed_runs() -> None:
    clocks = [
        agent_life.AgentClock("quiet", True, last_heartbeat=0.0, disconnected_at=None),
        agent_life.AgentClock("gone", False, last_heartbeat=95.0, disconnected_at=60.0),
        agent_life.AgentClock("fine", True, last_heartbeat=99.0, disconnected_at=None),
        agent_life.AgentClock("away", False, last_heartbeat=99.0, disconnected_at=95.0),
    ]
    experiment = _experiment()
    run = _run(_trial(experiment, 1, T.RUNNING))
    run.awaiting, run.deadline = {"a0"}, 99.0
    effects = agent_life.reap(clocks, [run], now=100.0, wall=100.0, wait_s=30, heartbeat_s=5)
    assert [type(e).__name__ for e in effects] == ["DropAgent", "DropAgent", "PartLost"]
    assert [e.agent_id for e in effects] == ["quiet", "gone", "a0"]  # type: ignore[union-attr]


def _gang(exited: dict[str, list[int]], stopping: Any = None) -> Run:
    """A run of trial 1 on agents a0 and a1; `exited`: the parts reported gone already."""
    run = Run("1.1.x", 1, 1, 1, (("a0", (0,)), ("a1", (0,))), "tok", stopping=stopping)
    run.exit_codes.update(exited)
    return run


ENDED, KILL, FINISH = fx.PartEnded, fx.Kill("1.1.x", graceful=False), fx.FinishRun("1.1.x")


@pytest.mark.parametrize(
    ("exited", "stopping", "codes", "then"),
    [
        # The first part to end: a failure kills the rest of the gang, success waits.
        ({}, None, [0], []),
        ({}, None, [0, 1], [KILL]),
        ({}, None, [], [KILL]),  # its processes could not start
        ({}, "pause", [1], []),  # being stopped already: no second kill
        # The last part: the run ends, whatever its codes.
        ({"a1": [0]}, None, [0], [FINISH]),
        ({"a1": [0]}, None, [3], [KILL, FINISH]),
        ({"a1": [143]}, "kill", [143], [FINISH]),
    ],
)
def test_a_part_exits(
    exited: dict[str, list[int]], stopping: Any, codes: list[int], then: list[fx.Effect]
) -> None:
    run = _gang(exited, stopping)
    effects = agent_life.part_exited(run, "a0", codes, "said")
    assert effects == [ENDED("1.1.x", "a0", tuple(codes), "said"), *then]


def test_an_exit_reported_by_an_agent_outside_the_run_changes_nothing() -> None:
    assert agent_life.part_exited(_gang({}), "intruder", [1], "forged") == []
    assert agent_life.part_exited(_gang({"a0": [0]}), "a0", [1], "again") == []


@pytest.mark.parametrize(
    ("exited", "then"),
    [
        ({}, [KILL]),  # the other part is killed and keeps its slots until it is gone
        ({"a1": [0]}, [KILL, FINISH]),
        ({"a0": [1]}, [KILL]),  # reported gone before: the other part still runs
    ],
)
def test_a_part_is_lost(exited: dict[str, list[int]], then: list[fx.Effect]) -> None:
    effects = agent_life.part_lost(_gang(exited), "a0")
    assert effects == [ENDED("1.1.x", "a0", lost=True), *then]


def test_validation_at_the_target_tells_the_searcher_once() -> None:
    experiment = _experiment()
    trial = _trial(experiment, 1, T.RUNNING, target=10)
    assert trial_life.validated(trial, experiment, 9, 0.5, stop_requested=False) == []
    effects = trial_life.validated(trial, experiment, 12, 0.5, stop_requested=False)
    assert effects == [
        fx.SetTrial(1, {"target": None}),
        fx.Tell(1, "r1", "on_validation_completed", (0.5, 10)),
    ]
    trial.target = None
    assert trial_life.validated(trial, experiment, 12, 0.5, stop_requested=False) == []


def test_a_stop_requested_at_the_target_reports_it_first() -> None:
    experiment = _experiment()
    trial = _trial(experiment, 1, T.RUNNING, target=10)
    effects = trial_life.validated(trial, experiment, 10, 0.5, stop_requested=True)
    assert [e.event for e in effects if isinstance(e, fx.Tell)] == [
        "on_validation_completed",
        "on_trial_exited_early",
    ]
    assert effects[-2] == fx.SetTrial(1, {"target": None, "closed": True})


def test_after_a_restart_trials_resume_pause_or_finish_the_stop() -> None:
    experiment = _experiment()
    _trial(experiment, 1, T.RUNNING)
    _trial(experiment, 2, T.RUNNING)  # its run awaits its agent
    _trial(experiment, 3, T.PAUSED, target=None)  # at its rung
    effects = trial_life.after_restart(experiment, {2}, NOW)
    assert _states(effects) == {1: T.QUEUED}
    experiment.state = E.STOPPING_KILLED
    assert _states(trial_life.after_restart(experiment, set(), NOW)) == {
        1: T.CANCELED,
        2: T.CANCELED,
        3: T.CANCELED,
    }


def _awaited(experiment: ExperimentState, trial: TrialState, stopping: str | None) -> Run | None:
    placement = (("a0", (0,)),)
    return trial_life.awaited_run(
        f"{trial.id}.1.x",
        1,
        placement,
        trial,
        experiment,
        token="tok",
        deadline=9.0,
        stopping=stopping,
    )


# (experiment state, trial state, the stop the store recorded) -> the stop that goes on
_STORED_STOPS = [
    (E.ACTIVE, T.STOPPING, "kill_trial", "kill_trial"),  # not taken for a preemption
    (E.PAUSED, T.STOPPING, "kill_trial", "kill_trial"),  # nor for a pause
    (E.ACTIVE, T.STOPPING, "preempt", "preempt"),
    (E.PAUSED, T.STOPPING, "pause", "pause"),
    (E.ACTIVE, T.STOPPING, "pause", "pause"),  # activated while the pause landed
    (E.STOPPING_CANCELED, T.STOPPING, "cancel", "cancel"),
    (E.STOPPING_KILLED, T.STOPPING, "kill", "kill"),
    (E.STOPPING_KILLED, T.STOPPING, "cancel", "cancel"),
    (E.ACTIVE, T.RUNNING, None, None),  # a run not asked to stop
]


@pytest.mark.parametrize(("experiment_state", "trial_state", "stored", "expected"), _STORED_STOPS)
def test_a_restarted_master_goes_on_with_the_stop_the_store_recorded(
    experiment_state: ExperimentStatus, trial_state: TrialStatus, stored: str | None, expected: str
) -> None:
    experiment = _experiment(experiment_state)
    trial = _trial(experiment, 1, trial_state, run_id=1)
    run = _awaited(experiment, trial, stored)
    assert run is not None
    assert run.stopping == expected
    assert (run.allocation_id, run.run_id, run.awaiting, run.deadline) == ("1.1.x", 1, {"a0"}, 9.0)


# A row written before the store recorded the stop: it is inferred as before.
_INFERRED_STOPS = [
    (E.ACTIVE, T.STOPPING, "preempt"),
    (E.ACTIVE, T.RUNNING, None),
    (E.PAUSED, T.STOPPING, "pause"),
    (E.PAUSED, T.RUNNING, "pause"),
    (E.STOPPING_CANCELED, T.STOPPING, "cancel"),
    (E.STOPPING_KILLED, T.STOPPING, "kill"),
]


@pytest.mark.parametrize(("experiment_state", "trial_state", "expected"), _INFERRED_STOPS)
@pytest.mark.parametrize("stored", [None, "", "no-such-stop"])
def test_a_run_stored_without_its_stop_infers_it_from_the_experiment(
    experiment_state: ExperimentStatus, trial_state: TrialStatus, expected: str, stored: str | None
) -> None:
    experiment = _experiment(experiment_state)
    trial = _trial(experiment, 1, trial_state, run_id=1)
    run = _awaited(experiment, trial, stored)
    assert run is not None
    assert run.stopping == expected


def test_a_stored_run_whose_trial_moved_on_is_over_whatever_its_stop() -> None:
    experiment = _experiment()
    ended = _trial(experiment, 1, T.CANCELED, run_id=1)
    later = _trial(experiment, 2, T.RUNNING, run_id=2)  # the stored run 1 is not its run
    assert _awaited(experiment, ended, "kill_trial") is None
    assert _awaited(experiment, later, "kill_trial") is None


def test_disabling_an_agent_stops_at_a_checkpoint_what_runs_there_and_nothing_else() -> None:
    here = _gang({})  # a0 and a1, running
    exited_here = Run("2.1.x", 2, 1, 1, (("a0", (1,)),), "tok")
    exited_here.exit_codes["a0"] = [0]
    stopping = Run("3.1.x", 3, 1, 1, (("a0", (2,)),), "tok", stopping="pause")
    elsewhere = Run("4.1.x", 4, 1, 1, (("a2", (0,)),), "tok")
    effects = agent_life.disabled("a0", [here, exited_here, stopping, elsewhere])
    assert [type(e) for e in effects] == [fx.SetTrial, fx.Log, fx.Kill]
    assert effects[0] == fx.SetTrial(1, {"state": TrialStatus.STOPPING})
    assert effects[2] == fx.Kill("1.1.x", graceful=True, stopping="preempt")
    log = effects[1]
    assert isinstance(log, fx.Log)
    assert "agent a0 was disabled" in log.message


def _finished(state: ExperimentStatus, batches: int | None = 4, **searcher: Any) -> ExperimentState:
    experiment = _experiment(state, **searcher)
    checkpoint = Restore("c1", batches, "/c") if batches is not None else None
    _trial(experiment, 1, T.COMPLETED, checkpoint=checkpoint, total_batches=4, restarts=2)
    return experiment


@pytest.mark.parametrize("state", [E.COMPLETED, E.CANCELED, E.ERROR])
def test_continue_makes_the_experiment_active_and_queues_its_trial_afresh(
    state: ExperimentStatus,
) -> None:
    experiment = _finished(state)
    effects = experiment_life.continue_trial(experiment, experiment.trials[1], 8)
    assert effects == [
        fx.SetExperiment(1, {"state": E.ACTIVE, "end_time": None, "progress": 0.5}),
        fx.SetTrial(
            1,
            {
                "state": T.QUEUED,
                "end_time": None,
                "restarts": 0,
                "closed": False,
                "target": None,
            },
        ),
        fx.Enqueue(1),
    ]


@pytest.mark.parametrize(
    ("state", "batches", "searcher", "message"),
    [
        (E.ACTIVE, 4, {}, "cannot continue experiment 1: it is ACTIVE; continue applies to "),
        (E.PAUSED, 4, {}, "it is PAUSED"),
        (E.COMPLETED, None, {}, "trial 1 has no checkpoint to continue from: `assay experiment "),
        (E.COMPLETED, 4, {"max_length": {"batches": 4}}, r"batch 4: continue to a longer"),
        (
            E.COMPLETED,
            4,
            {"name": "random", "max_trials": 1},
            "is a random search: continue applies to a single-trial",
        ),
    ],
)
def test_continue_refuses_what_cannot_go_on(
    state: ExperimentStatus, batches: int | None, searcher: dict[str, Any], message: str
) -> None:
    experiment = _finished(state, batches, **searcher)
    length = experiment.config.searcher.max_length.value
    with pytest.raises(ConflictError, match=message):
        experiment_life.continue_trial(experiment, experiment.trials[1], length)


def test_continue_refuses_an_experiment_of_several_trials() -> None:
    experiment = _finished(E.COMPLETED)
    _trial(experiment, 2, T.COMPLETED, checkpoint=Restore("c2", 4, "/c"))
    with pytest.raises(ConflictError, match="has 2 trials: continue applies to a single-trial"):
        experiment_life.continue_trial(experiment, experiment.trials[1], 8)


def test_a_run_told_no_more_before_a_restart_is_still_released() -> None:
    experiment = _experiment()
    trial = _trial(experiment, 1, T.RUNNING, run_id=1)
    run = _awaited(experiment, trial, RELEASED)
    assert run is not None
    assert (run.released, run.stopping) == (True, None)
    assert _awaited(experiment, trial, None).released is False  # type: ignore[union-attr]
    # A stop under way decides the end first: the run is that stop's, not released.
    experiment.state = E.PAUSED
    paused = _awaited(experiment, trial, RELEASED)
    assert paused is not None
    assert (paused.released, paused.stopping) == (False, "pause")


def test_a_single_searchs_progress_is_its_trials_batches_by_whole_percents() -> None:
    experiment = _experiment(max_length={"batches": 1000})
    trial = _trial(experiment, 1, T.RUNNING, total_batches=600)

    moved = trial_life.progress_trained(experiment, trial)
    experiment.progress = 0.6
    trial.total_batches = 605  # less than a percent more: no write
    unmoved = trial_life.progress_trained(experiment, trial)
    trial.total_batches = 290  # 0.28 + 0.01 is more than 0.29 in floats: not skipped
    experiment.progress = 0.28
    after_a_rounding = trial_life.progress_trained(experiment, trial)
    trial.total_batches = 1000  # all of it: still below 1 until the experiment completes
    last = trial_life.progress_trained(experiment, trial)

    assert moved == [fx.SetExperiment(1, {"progress": 0.6})]
    assert unmoved == []
    assert after_a_rounding == [fx.SetExperiment(1, {"progress": 0.29})]
    assert last == [fx.SetExperiment(1, {"progress": 0.99})]


def test_progress_by_batches_is_a_single_searchs_only() -> None:
    asha = _experiment(name="asha", max_trials=4, max_length={"batches": 100})
    unbounded = parse_config(
        {
            "entrypoint": "python3 train.py",
            "searcher": {"name": "single", "metric": "loss"},
        }
    )
    script = ExperimentState(2, unbounded, E.ACTIVE, 0, new_searcher(unbounded))

    assert trial_life.progress_trained(asha, _trial(asha, 1, T.RUNNING, total_batches=50)) == []
    trial = TrialState(2, 2, "r2", {}, 0, T.RUNNING, total_batches=50)
    script.add_trial(trial)
    assert trial_life.progress_trained(script, trial) == []
