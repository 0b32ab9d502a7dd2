"""Row (e) of bench/search_quality.py, every method at one budget (our asha with the random
and the bohb sampler, Optuna's and Ray Tune's peers): the cap on batches trained and what
each method reports it used, the settings and search space handed to Ray, the simulated
clock that drives Ray's schedulers, and the line that skips Ray's rows without it. None of
it needs Ray installed. Also `--quick`'s last line."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from assay.config import Categorical, Const, Double, Int, Log

ROOT = Path(__file__).resolve().parent.parent.parent
RUNGS = [3, 15, 62, 250, 1000]  # ASHA's defaults for max_length 1000


@pytest.fixture(scope="module")
def sq() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "search_quality_bench", ROOT / "bench" / "search_quality.py"
    )
    assert spec
    assert spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_rays_schedulers_get_our_rungs(sq: ModuleType) -> None:
    plan = sq.ray_plan()
    assert list(sq.RUNGS) == RUNGS
    # Ray's ASHA rungs and HyperBand's bracket starts, by Ray's formulas, are our rungs.
    assert plan["asha_rungs_batches"] == RUNGS
    assert plan["hyperband_r0_batches"] == RUNGS
    assert plan["asha"] == {"max_t": 256, "grace_period": 1, "reduction_factor": 4}
    assert plan["hyperband"] == {"max_t": 256, "reduction_factor": 4}


def test_the_search_space_maps_to_rays_domains(sq: ModuleType) -> None:
    space = {
        "bs": Const(64),
        "lr": Log(-5.0, 0.0, 10.0),
        "width": Int(16, 512),
        "dropout": Double(0.0, 0.6),
        "opt": Categorical(("sgd", "adam")),
    }
    searched, constants = sq.ray_space(space)
    assert constants == {"bs": 64}
    assert searched == {
        "lr": ("loguniform", 1e-5, 1.0),
        "width": ("randint", 16, 513),  # Ray's upper bound is exclusive
        "dropout": ("uniform", 0.0, 0.6),
        "opt": ("choice", ["sgd", "adam"]),
    }
    for problem in sq.PROBLEMS:  # both problems convert
        assert sq.ray_space(problem.space)[0]


class _Scheduler:
    """A stand-in with Ray's scheduler interface: pauses the first three trials at their
    first rung and resumes them once the fourth has reported; stops odd trials at the
    third rung."""

    def __init__(self) -> None:
        self.added: list[Any] = []
        self.resume: list[Any] = []
        self.max_running = 0

    def on_trial_add(self, ctrl: Any, trial: Any) -> None:
        assert trial.status == "PENDING"
        self.added.append(trial)

    def choose_trial_to_run(self, ctrl: Any) -> Any:
        running = sum(t.status == "RUNNING" for t in ctrl.get_trials())
        self.max_running = max(self.max_running, running)
        for t in ctrl.get_trials():
            if t.status == "PENDING":
                return t
        if self.resume:
            return self.resume.pop(0)
        return None

    def on_trial_result(self, ctrl: Any, trial: Any, result: dict[str, Any]) -> str:
        assert result["batches"] == RUNGS[trial.rung]
        assert result["rung"] == 4**trial.rung
        index = self.added.index(trial)
        if trial.rung == 0 and index < 3:
            return "PAUSE"
        if trial.rung == 0 and index == 3:
            self.resume = [t for t in self.added[:3] if t.status == "PAUSED"]
        if trial.rung == 2 and index % 2:
            return "STOP"
        return "CONTINUE"

    def on_trial_complete(self, ctrl: Any, trial: Any, result: Any) -> None:
        assert result is trial.last_result

    def on_trial_remove(self, ctrl: Any, trial: Any) -> None:
        raise AssertionError("no trial is stopped while paused here")


class _Searcher:
    def __init__(self) -> None:
        self.results: list[str] = []
        self.completed: list[str] = []

    def suggest(self, trial_id: str) -> dict[str, Any]:
        return {"x": len(self.completed) + len(self.results)}

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        self.results.append(trial_id)

    def on_trial_complete(self, trial_id: str, result: Any = None) -> None:
        self.completed.append(trial_id)


def test_rays_schedulers_are_driven_to_the_budget_on_our_clock(sq: ModuleType) -> None:
    problem = sq.Problem("flat", {}, lambda h, batches, seed: 1.0 / batches)
    scheduler, searcher = _Scheduler(), _Searcher()
    budget = 8_000
    run = sq.run_ray(scheduler, searcher, problem, 7, budget, {"c": 1})
    # It stops at the first result that crosses the budget, and no sooner.
    assert run.batches >= budget > run.trace[-2][0]
    assert run.trace[-1][0] == run.batches
    # Every trial's batches are counted once: the trace adds up the rungs each reached.
    assert run.batches == sum(t.batches for t in scheduler.added)
    assert all(t.batches == RUNGS[t.rung] for t in scheduler.added if t.rung >= 0)
    assert run.best == 1.0 / 1000  # only full-length results count
    capped = run.capped(budget)  # what the equal-budget row reads: the crossing result is out
    assert capped.batches == run.trace[-2][0] <= budget
    assert scheduler.max_running <= sq.CONCURRENT
    # Paused trials resumed where they had stopped; each rung reached was reported once,
    # to the searcher too, except a result the scheduler stopped the trial on.
    assert all(t.rung >= 1 for t in scheduler.added[:3])
    for index, t in enumerate(scheduler.added):
        stopped = t.rung == 2 and index % 2 == 1
        assert searcher.results.count(t.trial_id) == t.rung + (0 if stopped else 1)
        if stopped or t.rung == 4:
            assert t.status == "TERMINATED"
            assert t.trial_id in searcher.completed
    assert any(t.rung == 2 and t.status == "TERMINATED" for t in scheduler.added)
    assert all(t.hparams["c"] == 1 for t in scheduler.added)  # constants reach the curve


def test_capped_keeps_the_results_within_the_budget(sq: ModuleType) -> None:
    run = sq.Run(0.1, 3000, [(1000, 0.5, 1000), (1500, 0.01, 62), (2000, 0.3, 1000)])
    assert run.capped(999) == sq.Run(math.inf, 0, [])
    assert run.capped(1000) == sq.Run(0.5, 1000, run.trace[:1])
    assert run.capped(1999) == sq.Run(0.5, 1500, run.trace[:2])  # the crossing one is out
    assert run.capped(5000) == sq.Run(0.3, 2000, run.trace)
    assert sq.Run(0.1, 10, [(10, 0.1, 3), (20, 0.2, 15)]).trials() == 1


def test_the_picked_trial_is_scored_by_its_noise_free_loss(sq: ModuleType) -> None:
    trace = [(1000, 0.09, 1000), (1500, 0.01, 62), (2600, 0.08, 1000), (3600, 0.07, 1000)]
    run = sq.Run(0.07, 3600, trace, [0.10, 0.02, 0.11, 0.12])
    # The lowest noisy result is the trial handed over, though another was truly better.
    assert run.chosen_truth() == 0.12
    capped = run.capped(3000)
    assert capped.truths == [0.10, 0.02, 0.11]
    assert (capped.best, capped.chosen_truth()) == (0.08, 0.11)
    assert run.capped(999).chosen_truth() == math.inf  # no full-length result
    tie = sq.Run(0.05, 2000, [(1000, 0.05, 1000), (2000, 0.05, 1000)], [0.2, 0.1])
    assert tie.chosen_truth() == 0.2  # the earlier of equal results
    with pytest.raises(ValueError, match="2 noise-free losses for 1 results"):
        sq.Run(0.05, 1000, [(1000, 0.05, 1000)], [0.1, 0.2]).chosen_truth()


def test_a_problems_loss_is_its_noise_free_loss_plus_noise(sq: ModuleType) -> None:
    for problem in sq.PROBLEMS:
        recorded, truths = problem.recorded()
        hparams = next(iter(_draws(problem.space, 1)))
        for i, length in enumerate(RUNGS):
            value = recorded.loss(hparams, length, 11)
            assert value == problem.loss(hparams, length, 11)
            assert truths[i] == problem.mean(hparams, length)
            assert abs(value - truths[i]) < 0.2  # noise of sd 0.01 (0.04 at 3 batches)
        assert len({problem.loss(hparams, 1000, s) for s in range(5)}) == 5
    plain = sq.Problem("flat", {}, lambda h, batches, seed: 1.0 / batches)
    assert plain.recorded() == (plain, [])  # no noise-free loss known: none recorded


def _draws(space: Any, n: int) -> list[dict[str, Any]]:
    from assay.master.searcher._samplers import RandomSampler

    sampler = RandomSampler(space, 0)
    return [sampler.propose(i, f"t{i}") for i in range(n)]


def test_every_method_records_one_noise_free_loss_per_result(sq: ModuleType) -> None:
    """The noise-free loss of each result lines up with the run's trace: here it is
    1 / length and the noisy one adds the trial's seed, so a shifted list shows."""
    problem = sq.Problem(
        "shifted",
        sq.SPACE,
        lambda h, batches, seed: 1.0 / batches + (seed % 97) / 1000,
        lambda h, batches: 1.0 / batches,
    )
    runs = [sq.run_ours_capped(sampler, problem, 2, 3_000) for sampler in ("random", "bohb")]
    if importlib.util.find_spec("optuna"):
        runs += [sq.run_optuna(2, 3_000, problem, kind, 4) for kind in ("sha", "hyperband_tpe")]
    runs.append(sq.run_ray(_Scheduler(), _Searcher(), problem, 7, 3_000, {"c": 1}))
    for run in runs:
        assert len(run.truths) == len(run.trace) > 0
        assert run.truths == [1.0 / length for _, _, length in run.trace]
        assert any(v != 1.0 / length for _, v, length in run.trace)  # the seeds show
        assert run.chosen_truth() in (math.inf, 1.0 / 1000)


def test_our_asha_stops_launching_at_the_budget(sq: ModuleType) -> None:
    problem = sq.PROBLEMS[1]
    short, long = (sq.run_ours_capped("random", problem, 3, b) for b in (2_000, 6_000))
    for run, budget in ((short, 2_000), (long, 6_000)):
        assert budget - sq.MAX_LENGTH < run.batches <= budget
        assert run.batches == run.trace[-1][0]
    assert long.trace[: len(short.trace)] == short.trace  # the same run, stopped sooner
    bohb = sq.run_ours_capped("bohb", problem, 3, 2_000)
    assert bohb.batches <= 2_000


@pytest.mark.parametrize("kind", ["sha", "hyperband_tpe"])
@pytest.mark.parametrize("concurrent", [1, 4])
def test_optuna_peers_start_no_trial_past_the_budget(
    sq: ModuleType, kind: str, concurrent: int
) -> None:
    pytest.importorskip("optuna")
    budget = 3_000
    for problem in sq.PROBLEMS:
        run = sq.run_optuna(1, budget, problem, kind, concurrent)
        batches = [b for b, _, _ in run.trace]
        assert batches == sorted(batches)
        assert run.batches == batches[-1] >= budget
        crossed = next(i for i, b in enumerate(batches) if b >= budget)
        # Past the budget only the trials running then report, up to their end.
        started_after = sum(n == sq.RUNGS[0] for _, _, n in run.trace[crossed + 1 :])
        assert started_after <= concurrent - 1
        assert run.capped(budget).batches <= budget


def test_optuna_hyperband_runs_the_same_twice_on_a_seed(sq: ModuleType) -> None:
    """HyperbandPruner picks a trial's bracket from the study's name: an unnamed study (a
    fresh uuid each time) gave a different run on the same seed."""
    pytest.importorskip("optuna")
    first = sq.run_optuna(3, 2_000, sq.PROBLEMS[1], "hyperband_tpe", 4)
    again = sq.run_optuna(3, 2_000, sq.PROBLEMS[1], "hyperband_tpe", 4)
    assert first.trace == again.trace


def test_optuna_trial_after_trial_is_rows_b(sq: ModuleType) -> None:
    pytest.importorskip("optuna")
    run = sq.run_optuna(0, 2_000)
    # One trial at a time: each runs its rungs in order before the next starts.
    lengths = [n for _, _, n in run.trace]
    for i, n in enumerate(lengths[1:], 1):
        assert n == sq.RUNGS[0] or sq.RUNGS.index(n) == sq.RUNGS.index(lengths[i - 1]) + 1


def test_without_ray_every_other_method_gets_the_same_budget(
    sq: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails
    line = sq.ray_peers(sq.PROBLEMS[0], [0], 1000)
    assert isinstance(line, str)
    assert line.startswith("(e) Ray peers skipped:")
    assert "pip install -e '.[bench-peers]'" in line
    pytest.importorskip("optuna")
    budget = 2_500
    row, skipped = sq.equal_budget(sq.PROBLEMS[1], [0, 1, 2], budget)
    assert skipped == line
    assert (row["seeds"], row["budget"]) == (3, budget)
    methods = ["asha", "asha_bohb", "optuna_sha", "optuna_hyperband_tpe"]
    assert [k for k in row if k not in ("seeds", "budget")] == methods
    for name in methods:
        used = row[name]["budget_used"]
        assert budget - sq.MAX_LENGTH < used["min"] <= used["median"] <= used["max"] <= budget
        assert row[name]["trials"] >= 1
    assert row["asha_bohb"]["vs_asha"]["seeds"] == row["asha_bohb"]["true_vs_asha"]["seeds"] == 3
    for name in methods[2:]:
        for prefix in ("", "true_"):
            assert row[name][f"{prefix}vs_asha"]["seeds"] == 3
            assert row[name][f"{prefix}vs_asha_bohb"]["seeds"] == 3
    for name in methods:
        # The trial each picks is scored in the seeds where it has a full-length result.
        chosen, best = row[name]["median_chosen_true"], row[name]["median_best"]
        assert chosen > 0.0
        assert math.isfinite(chosen) == math.isfinite(best)
        assert (row[name]["full_length_results"] > 0) == math.isfinite(best)
    assert "ray_asha" not in row
    assert isinstance(sq.equal_budget_passed(row), bool)


def test_the_targets_of_the_equal_budget_row(sq: ModuleType) -> None:
    def stats(diff: float, p: float) -> dict[str, Any]:
        return {"median_difference": diff, "sign_p": p, "wilcoxon_p": p}

    row = {
        "optuna_sha": {"vs_asha": stats(0.0, 0.9), "vs_asha_bohb": stats(0.01, 0.01)},
        "optuna_hyperband_tpe": {"vs_asha": stats(-0.01, 0.01), "vs_asha_bohb": stats(0.02, 0.0)},
    }
    assert sq.equal_budget_passed(row)  # a tie with an ASHA-type peer is enough
    row["optuna_sha"]["vs_asha"] = stats(-0.001, 0.5)
    assert not sq.equal_budget_passed(row)
    row["optuna_sha"]["vs_asha"] = stats(0.0, 0.9)
    row["optuna_hyperband_tpe"]["vs_asha_bohb"] = stats(0.02, 0.06)
    assert not sq.equal_budget_passed(row)


@pytest.mark.slow
def test_quick_ends_with_one_json_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "bench/search_quality.py", "--quick", "--seeds", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["benchmark"] == "search_quality"
    assert out["quick"] is True
    assert out["target"] == 3.0
    assert isinstance(out["ratio"], float)
    assert out["seeds"] == out["optuna_sha"]["seeds"] == out["asha_tpe"]["seeds"] == 1
    for problem in ("today", "hard"):
        stats = out["asha_bohb"]["problems"][problem]
        assert stats["seeds"] == 1
        assert {"median_difference", "won", "sign_p", "wilcoxon_p"} <= stats.keys()
    assert "skipped" in out["peers"]


def test_inf_differences_rank_highest_in_the_wilcoxon_test(sq: ModuleType) -> None:
    pytest.importorskip("scipy")
    diffs = [0.01, -0.02, 0.03, 0.04, 0.05, 0.06]
    assert sq.wilcoxon([*diffs[:-1], math.inf]) == sq.wilcoxon(diffs)


def test_the_status_and_decision_strings_are_rays(sq: ModuleType) -> None:
    experiment = pytest.importorskip("ray.tune.experiment")
    schedulers = pytest.importorskip("ray.tune.schedulers")
    trial, decision = experiment.Trial, schedulers.TrialScheduler
    assert (trial.PENDING, trial.RUNNING, trial.PAUSED, trial.TERMINATED) == (
        sq.PENDING,
        sq.RUNNING,
        sq.PAUSED,
        sq.TERMINATED,
    )
    assert (decision.CONTINUE, decision.PAUSE, decision.STOP) == (sq.CONTINUE, sq.PAUSE, sq.STOP)


def test_the_peers_run_can_be_narrowed_and_a_wrong_name_is_refused(
    sq: ModuleType,
    capsys: pytest.CaptureFixture[str],
) -> None:
    pytest.importorskip("optuna")
    row, skipped = sq.equal_budget(sq.PROBLEMS[0], [0, 1], 2_000, ("optuna_sha",))
    assert skipped is None  # no Ray peer was asked for
    assert [k for k in row if k not in ("seeds", "budget")] == ["asha", "asha_bohb", "optuna_sha"]
    with pytest.raises(SystemExit):
        sq.main(["--only-e", "--peers", "optuna_sha,ray_hyperband"])
    assert "no peer ray_hyperband; the peers are optuna_sha," in capsys.readouterr().err
