"""The seeded fake cluster: random seeds end cleanly, a long run stays within its time, and
every check the simulation makes can fail."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from assay.master import scheduler
from assay.master.lifecycle import StartRun as Start
from assay.master.lifecycle import TrialStatus
from assay.master.lifecycle import effects as fx
from assay.master.lifecycle import experiment as experiment_life
from assay.master.lifecycle import trial as trial_life
from assay.master.lifecycle.run import requeue
from assay.master.simulate import (
    EXPERIMENT_EDGES,
    EXPERIMENT_MOVES,
    TRIAL_EDGES,
    TRIAL_MOVES,
    ExperimentView,
    FakeAgent,
    InvariantError,
    MasterAdapter,
    RunView,
    Snapshot,
    Stats,
    StoreKind,
    TrialView,
    check_move,
    check_progress,
    check_queue,
    check_restart,
    check_restore,
    check_runs,
    check_slots,
    check_snapshot,
    check_start,
    check_trials,
    simulate,
)


def _ended_cleanly(stats: Stats) -> None:
    """Every experiment created ended, with its trials, and the master logged no failure."""
    # A continued experiment ends once more.
    continued = stats.events["continue"] - stats.events["continue-refused"]
    assert stats.experiments.total() == stats.events["create"] + continued
    assert stats.trials.total() > 0 or stats.events["create"] == 0
    assert not stats.errors, stats.errors


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
# A run restored from a checkpoint keeps the best validated before it, in memory as in
# the store; a master restarted right after loaded it while memory had dropped it.
@example(seed=974664)
def test_any_seed_plays_to_a_clean_end(seed: int) -> None:
    stats = simulate(seed, 300)
    assert stats.steps >= 300
    _ended_cleanly(stats)


def test_an_exit_for_a_part_given_up_on_changes_nothing() -> None:
    # Seed 23: an agent answers a kill of a part the master had already given up on
    # ("not running on this agent"); the report is ignored and the cluster plays on.
    _ended_cleanly(simulate(23, 300))


def test_the_same_seed_plays_the_same_cluster() -> None:
    # Seed 11 keeps lost agents' runs waiting for them, restarts the master 5 times and
    # continues 2 experiments.
    first, second = simulate(11, 300), simulate(11, 300)
    assert first.restarts == 5
    assert (first.events, first.trials, first.experiments) == (
        second.events,
        second.trials,
        second.experiments,
    )


def test_a_seed_plays_the_same_cluster_on_sqlite_as_in_memory() -> None:
    # The simulation runs on the in-memory store; the master on its SQL store must end
    # every experiment and trial alike, step for step.
    on_sqlite, in_memory = simulate(11, 300, store="sqlite"), simulate(11, 300)
    _ended_cleanly(on_sqlite)
    assert on_sqlite.restarts == 5
    assert (on_sqlite.events, on_sqlite.trials, on_sqlite.experiments) == (
        in_memory.events,
        in_memory.trials,
        in_memory.experiments,
    )


@pytest.mark.slow
def test_ten_thousand_events() -> None:
    stats = simulate(2024, 10_000)
    _ended_cleanly(stats)
    # Everything the cluster can do happened, many times over.
    for kind in ("harness", "deliver", "join", "disconnect", "die", "create", "restart"):
        assert stats.events[kind] >= 10, (kind, stats.events)
    assert set(stats.trials) == {"COMPLETED", "CANCELED", "ERROR"}
    assert stats.restarts >= 10
    print(f"{stats.steps} steps in {stats.seconds:.1f} s ({stats.events_per_second:.0f}/s)")


# --- every check can fail -------------------------------------------------------------------


def _trial(experiment_id: int = 1, state: str = "RUNNING", **fields: Any) -> TrialView:
    values: dict[str, Any] = {
        "experiment_id": experiment_id,
        "state": state,
        "run_id": 1,
        "restarts": 0,
        "total_batches": 0,
        "best_validation": None,
        "target": 8,
        "closed": False,
        "checkpoint": None,
    }
    return TrialView(**{**values, **fields})


def _run(allocation_id: str, *placement: tuple[str, tuple[int, ...]]) -> RunView:
    return RunView(allocation_id, 1, placement, frozenset(), frozenset(), None, False)


@pytest.fixture
def healthy() -> Snapshot:
    """Two experiments: trial 1 runs on a0/0, trial 2 on a0/1 and a1/0, trial 3 waits."""
    return Snapshot(
        experiments={
            1: ExperimentView("ACTIVE", 0.0, False, "", (1, 2), max_restarts=1),
            2: ExperimentView("ACTIVE", 0.5, False, "", (3,), max_restarts=0),
        },
        trials={1: _trial(), 2: _trial(), 3: _trial(2, "QUEUED", run_id=0)},
        runs={1: _run("1.1", ("a0", (0,))), 2: _run("2.1", ("a0", (1,)), ("a1", (0,)))},
        queue=frozenset({3}),
        allocations={1: (("a0", (0,)),), 2: (("a0", (1,)), ("a1", (0,)))},
        agents={"a0": 2, "a1": 1},
    )


def test_a_healthy_snapshot_passes(healthy: Snapshot) -> None:
    check_snapshot(healthy)


def test_a_slot_given_twice_is_caught(healthy: Snapshot) -> None:
    twice = replace(healthy, allocations={**healthy.allocations, 2: (("a0", (0,)),)})
    with pytest.raises(InvariantError, match="slot a0/0 is given to trials 1 and 2"):
        check_slots(twice)
    # The runs say so even when the scheduler does not.
    runs = {**healthy.runs, 2: _run("2.1", ("a0", (0,)), ("a1", (0,)))}
    with pytest.raises(InvariantError, match="uses slot a0/0"):
        check_slots(replace(healthy, runs=runs))


def test_slots_held_without_a_run_or_off_the_agent_are_caught(healthy: Snapshot) -> None:
    leaked = replace(healthy, runs={1: healthy.runs[1]})
    with pytest.raises(InvariantError, match="trial 2, which has no run"):
        check_slots(leaked)
    with pytest.raises(InvariantError, match="holds slot 1 of a1"):
        check_slots(replace(healthy, allocations={**healthy.allocations, 2: (("a1", (1,)),)}))


def test_a_run_whose_agent_is_gone_keeps_no_slot(healthy: Snapshot) -> None:
    # a1 was lost: its part is over, and the scheduler no longer holds a1's slot.
    run = replace(healthy.runs[2], gone=frozenset({"a1"}))
    check_slots(
        replace(
            healthy,
            runs={**healthy.runs, 2: run},
            allocations={**healthy.allocations, 2: (("a0", (1,)),)},
        )
    )


def test_the_queue_holds_only_queued_trials_of_active_experiments(healthy: Snapshot) -> None:
    with pytest.raises(InvariantError, match="queued trial 1 is RUNNING"):
        check_queue(replace(healthy, queue=frozenset({1, 3})))
    paused = {**healthy.experiments, 2: replace(healthy.experiments[2], state="PAUSED")}
    with pytest.raises(InvariantError, match="experiment PAUSED"):
        check_queue(replace(healthy, experiments=paused))
    with pytest.raises(InvariantError, match="trial 3 is QUEUED but not in the queue"):
        check_queue(replace(healthy, queue=frozenset()))
    with pytest.raises(InvariantError, match="not a trial of a live experiment"):
        check_queue(replace(healthy, queue=frozenset({3, 9})))


def test_running_trials_have_runs_and_live_experiments_are_not_over(healthy: Snapshot) -> None:
    with pytest.raises(InvariantError, match="trial 1 is RUNNING and has no run"):
        check_runs(replace(healthy, runs={2: healthy.runs[2]}))
    over = {**healthy.trials, 3: _trial(2, "COMPLETED")}
    with pytest.raises(InvariantError, match="experiment 2 is ACTIVE with every trial ended"):
        check_runs(replace(healthy, trials=over, queue=frozenset()))


def test_restarts_stay_within_the_limit_and_nothing_goes_back(healthy: Snapshot) -> None:
    restarted = {**healthy.trials, 3: _trial(2, "QUEUED", run_id=1, restarts=1)}
    with pytest.raises(InvariantError, match="restarted 1 times; its experiment allows 0"):
        check_runs(replace(healthy, trials=restarted))
    check_progress(healthy, healthy)
    fell = {**healthy.experiments, 2: replace(healthy.experiments[2], progress=0.25)}
    with pytest.raises(InvariantError, match="progress fell from 0.5 to 0.25"):
        check_progress(healthy, replace(healthy, experiments=fell))
    back = {**healthy.trials, 1: _trial(run_id=2), 2: _trial(run_id=0)}
    with pytest.raises(InvariantError, match="trial 2 went back"):
        check_progress(healthy, replace(healthy, trials=back))


def test_a_trial_paused_after_its_searcher_closed_it_is_caught(healthy: Snapshot) -> None:
    stuck = {**healthy.trials, 3: _trial(2, "PAUSED", target=None, closed=True)}
    snapshot = replace(healthy, trials=stuck, queue=frozenset())
    with pytest.raises(InvariantError, match="trial 3 is PAUSED after its searcher closed it"):
        check_trials(snapshot)
    # Paused at its rung, waiting for a promotion: the searcher has not closed it.
    check_snapshot(replace(snapshot, trials={**stuck, 3: _trial(2, "PAUSED", target=None)}))


def test_a_trial_stopping_with_a_run_nobody_stops_is_caught(healthy: Snapshot) -> None:
    stopping = replace(healthy, trials={**healthy.trials, 1: _trial(state="STOPPING")})
    with pytest.raises(InvariantError, match="trial 1 is STOPPING but its run is not stopped"):
        check_trials(stopping)
    runs = {**healthy.runs, 1: replace(healthy.runs[1], stopping="preempt")}
    check_snapshot(replace(stopping, runs=runs))


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("COMPLETED", "QUEUED"),
        ("PAUSED", "STOPPING"),
        ("PAUSED", "RUNNING"),
        ("NEW", "RUNNING"),
        ("QUEUED", "NEW"),
    ],
)
def test_a_trial_moving_off_its_edges_is_caught(old: str, new: str) -> None:
    with pytest.raises(InvariantError, match=f"trial 7 moved from {old} to {new}"):
        check_move("trial", 7, old, new, TRIAL_EDGES)


@pytest.mark.parametrize(
    ("old", "new"),
    [("CANCELED", "ACTIVE"), ("STOPPING_KILLED", "STOPPING_CANCELED"), ("PAUSED", "COMPLETED")],
)
def test_an_experiment_moving_off_its_edges_is_caught(old: str, new: str) -> None:
    with pytest.raises(InvariantError, match="experiment 4 moved"):
        check_move("experiment", 4, old, new, EXPERIMENT_EDGES)


def test_one_step_may_make_several_moves_but_never_leaves_an_end() -> None:
    check_move("trial", 1, "QUEUED", "QUEUED", TRIAL_EDGES)  # written again
    check_move("trial", 1, "PAUSED", "RUNNING", TRIAL_MOVES)  # promoted and placed
    check_move("trial", 1, "NEW", "STOPPING", TRIAL_MOVES)  # created, placed, preempted
    check_move("experiment", 1, "PAUSED", "COMPLETED", EXPERIMENT_MOVES)  # activated, over
    for old, new in [("COMPLETED", "QUEUED"), ("ERROR", "CANCELED"), ("QUEUED", "NEW")]:
        with pytest.raises(InvariantError):
            check_move("trial", 1, old, new, TRIAL_MOVES)
    with pytest.raises(InvariantError):
        check_move("experiment", 1, "STOPPING_CANCELED", "ACTIVE", EXPERIMENT_MOVES)


def test_a_restart_must_restore_what_the_old_master_held(healthy: Snapshot) -> None:
    restored = replace(
        healthy,
        trials={1: _trial(state="QUEUED"), 2: _trial(state="QUEUED"), 3: healthy.trials[3]},
        runs={},
        queue=frozenset({1, 2, 3}),
        allocations={},
        agents={},
    )
    check_restart(healthy, restored, keep_runs=False)
    forgot = replace(restored, trials={**restored.trials, 1: _trial(state="QUEUED", restarts=1)})
    with pytest.raises(InvariantError, match="trial 1 was"):
        check_restart(healthy, forgot, keep_runs=False)
    searched = {**restored.experiments, 2: replace(restored.experiments[2], search='{"x": 1}')}
    with pytest.raises(InvariantError, match="experiment 2 was"):
        check_restart(healthy, replace(restored, experiments=searched), keep_runs=False)
    with pytest.raises(InvariantError, match="live experiments after the restart"):
        check_restart(healthy, replace(restored, experiments={}, trials={}), keep_runs=False)
    # Runs that wait for their agents: the same allocations, awaiting every agent.
    waiting = {
        t: replace(r, awaiting=frozenset(a for a, _ in r.placement))
        for t, r in healthy.runs.items()
    }
    kept = replace(healthy, runs=waiting, allocations={}, agents={})
    check_restart(healthy, kept, keep_runs=True)
    with pytest.raises(InvariantError, match="run of trial 2 was"):
        check_restart(healthy, replace(kept, runs={**waiting, 2: healthy.runs[2]}), keep_runs=True)
    # A preemption under way goes on: a restored run that forgot it is caught.
    trials = {**healthy.trials, 1: _trial(state="STOPPING")}
    preempting = {**healthy.runs, 1: replace(healthy.runs[1], stopping="preempt")}
    old = replace(healthy, trials=trials, runs=preempting)
    still = {**waiting, 1: replace(waiting[1], stopping="preempt")}
    check_restart(old, replace(kept, trials=trials, runs=still), keep_runs=True)
    with pytest.raises(InvariantError, match="run of trial 1 was"):
        check_restart(old, replace(kept, trials=trials, runs=waiting), keep_runs=True)


def _start(allocation_id: str, slots: tuple[int, ...]) -> Start:
    return Start(
        allocation_id, 5, 2, 1, slots, tuple(range(len(slots))), len(slots), "", 0, b"",
        "{}", "", "", "", "token", "{}", 0, "",
    )  # fmt: skip


def test_a_start_on_slots_still_in_use_is_caught() -> None:
    agent = FakeAgent("a0", "cpu", 2, parts={"4.1.x": (0,)})
    assert check_start(agent, _start("5.2.y", (1,))) == []
    # Whether the master gave the part up (its agent was lost) or not: never killed.
    with pytest.raises(InvariantError, match=r"slots \[0\] of a0 are given to 5.2.y .*never"):
        check_start(agent, _start("5.2.y", (0, 1)))
    with pytest.raises(InvariantError, match=r"starts on slots \[2\]"):
        check_start(agent, _start("5.2.y", (2,)))
    agent.killed.add("4.1.x")  # told to kill it: the start waits for it to go
    assert check_start(agent, _start("5.2.y", (0, 1))) == ["4.1.x"]


def test_a_run_must_start_from_its_trials_newest_checkpoint() -> None:
    checkpoints = {"old": (5, 4), "new": (5, 8), "other": (6, 8)}
    check_restore(5, "new", "new", checkpoints)
    check_restore(5, "", None, checkpoints)
    for uuid, match in [("old", "batch 4"), ("", "from checkpoint none"), ("other", "trial 6")]:
        with pytest.raises(InvariantError, match=match):
            check_restore(5, uuid, "new", checkpoints)


# --- and the simulation runs them -----------------------------------------------------------


def test_the_simulation_catches_slots_a_master_never_frees(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(scheduler.Scheduler, "release", lambda self, request_id: False)
    # Caught by the slot check, or, when the trial is requeued first, by the scheduler's
    # own: a pending request must not hold slots.
    leak = r"seed 3, step \d+ .*which has no run|pending but already holds an allocation"
    with pytest.raises((InvariantError, ValueError), match=leak):
        simulate(3, 300)


def test_the_simulation_catches_a_master_that_revives_ended_trials(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    after_restart = trial_life.after_restart

    def revive(experiment: Any, running: Any, now: Any) -> list[Any]:
        ended = [t for t in experiment.trials.values() if t.state == "COMPLETED"]
        return [e for t in ended for e in requeue(t)] + after_restart(experiment, running, now)

    monkeypatch.setattr(trial_life, "after_restart", revive)
    with pytest.raises(InvariantError, match=r"seed 0, step \d+ \(restart\): trial \d+ was"):
        simulate(0, 300)


def test_the_simulation_catches_a_move_off_the_edges_within_one_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    act = experiment_life.act

    def act_and_jump(experiment: Any, action: str, runs: Any, now: Any) -> list[Any]:
        # An activation that marks paused trials RUNNING before it requeues them: the
        # step ends in a state one step may reach, but the move itself is no edge.
        paused = [t.id for t in experiment.trials.values() if t.state == "PAUSED"]
        jumps = [fx.SetTrial(t, {"state": TrialStatus.RUNNING}) for t in paused]
        back = [fx.SetTrial(t, {"state": TrialStatus.PAUSED}) for t in paused]
        effects = act(experiment, action, runs, now)
        return [*jumps, *back, *effects] if action == "activate" else effects

    monkeypatch.setattr(experiment_life, "act", act_and_jump)
    with pytest.raises(InvariantError, match=r"seed 1, step \d+ .*moved from PAUSED to RUNNING"):
        simulate(1, 400)


def test_the_drain_fails_on_an_experiment_that_never_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    act = experiment_life.act

    def activate_and_forget(experiment: Any, action: str, runs: Any, now: Any) -> list[Any]:
        # An activation that leaves paused trials PAUSED: every snapshot passes, but with
        # nothing left running, nothing will ever end the experiment.
        effects = act(experiment, action, runs, now)
        if action != "activate":
            return effects
        return [e for e in effects if not isinstance(e, (fx.SetTrial, fx.Enqueue))]

    monkeypatch.setattr(experiment_life, "act", activate_and_forget)
    with pytest.raises(InvariantError, match=r"seed 1: the cluster is idle, yet experiments"):
        simulate(1, 150)


def test_the_simulation_names_the_seed_and_step_of_a_broken_snapshot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    snapshot = MasterAdapter.snapshot
    calls = 0

    def broken(self: MasterAdapter, *, search: bool = False) -> Snapshot:
        nonlocal calls
        calls += 1
        taken = snapshot(self, search=search)
        if calls < 50:
            return taken
        return replace(taken, queue=taken.queue | {10**6})

    monkeypatch.setattr(MasterAdapter, "snapshot", broken)
    with pytest.raises(InvariantError, match=r"seed 5, step \d+ \([\w -]+\): queued trial 1000000"):
        simulate(5, 200)


def test_a_restart_with_nothing_live_restores_nothing(tmp_path: Path) -> None:
    adapter = MasterAdapter(tmp_path, reconnect_wait_s=0, preemption=False)
    try:
        before = adapter.snapshot(search=True)
        adapter.restart()
        check_restart(before, adapter.snapshot(search=True), keep_runs=False)
    finally:
        adapter.close()


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_a_continued_experiment_keeps_its_new_length_across_a_restart(
    tmp_path: Path, store: StoreKind
) -> None:
    """A single trial of 4 batches completes; continued, its master restarts: the new
    master holds the new length (stored config, the trial's target) and the trial ends
    there, its runs restored from its newest checkpoint (batch 4 first)."""
    import yaml

    from assay.master.simulate._simulation import Simulation, _master_errors
    from assay.master.simulate._workload import model_archive

    config = {
        "name": "continued",
        "entrypoint": "model_def:T",
        "hyperparameters": {"global_batch_size": 8, "lr": 0.1},
        "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 4}},
    }
    with _master_errors() as errors:
        sim = Simulation(7, tmp_path, errors, store)
        try:
            adapter = sim.adapter
            experiment_id = adapter.create(yaml.safe_dump(config), model_archive(), activate=True)
            sim.drain()
            assert adapter.continuable(experiment_id) == 4
            sim.step((f"continue {experiment_id}", lambda: sim._continue(experiment_id)))
            sim.step(("restart", sim._restart))
            experiment = adapter.master.experiments[experiment_id]
            assert experiment.config.searcher.max_length.value == 12
            [trial] = experiment.trials.values()
            assert (trial.target, trial.checkpoint and trial.checkpoint.total_batches) == (12, 4)
            sim.drain()
            stored = adapter.store.get_experiment(experiment_id)
            assert stored.state == "COMPLETED"
            assert stored.config["searcher"]["max_length"] == {"batches": 12}
            [ended] = adapter.store.list_trials(experiment_id)
            assert (ended.state, ended.total_batches) == ("COMPLETED", 12)
            assert ended.run_id >= 2  # (the fake harness checks each run restores the newest)
            assert not errors.lines
        finally:
            adapter.close()
