"""The rung arithmetic against hand-computed cases (the rule: floor(max_length /
divisor**(rungs-1-k)), at least 1)."""

from __future__ import annotations

import pytest

from assay.config import RungPreview, preview, rung_lengths
from assay.config._search import (
    bracket_max_concurrent,
    bracket_max_trials,
    mode_brackets,
    rungs_that_fit,
    search_spec,
    trials_per_rung,
)
from assay.master.searcher import promotion_quota

from ._support import SPACE, config


@pytest.mark.parametrize(
    ("max_length", "divisor", "rungs", "expected"),
    [
        (1000, 4, 3, (62, 250, 1000)),  # 62.5 rounds down
        (1000, 4, 5, (3, 15, 62, 250, 1000)),
        (400, 2, 3, (100, 200, 400)),
        (100, 3, 1, (100,)),
        (5, 4, 3, (1, 1, 5)),  # at least 1 (the config refuses this: rungs must grow)
        (100, 2.5, 3, (16, 40, 100)),  # 100 / 6.25 = 16 exactly, not 15.99...
        (1000, 2.5, 4, (64, 160, 400, 1000)),
        (100, 2.2, 3, (20, 45, 100)),  # 2.2 is 11/5: 100 * 25/121 = 20.66, 100 * 5/11 = 45.45
        (1000, 1.5, 3, (444, 666, 1000)),
    ],
)
def test_rung_lengths(
    max_length: int, divisor: float, rungs: int, expected: tuple[int, ...]
) -> None:
    assert rung_lengths(max_length, divisor, rungs) == expected


@pytest.mark.parametrize(
    ("n", "divisor", "expected"),
    [
        (1000, 4, 5),
        (1024, 4, 6),
        (3, 4, 1),
        (4, 4, 2),
        (1, 2, 1),
        (100, 2.5, 6),  # 2.5**5 = 97.66 <= 100 < 2.5**6
        (625, 2.5, 8),  # 2.5**7 = 610.35
        (10**9, 1.01, 64),  # capped at MAX_RUNGS, and fast
    ],
)
def test_rungs_that_fit(n: int, divisor: float, expected: int) -> None:
    assert rungs_that_fit(n, divisor) == expected


def test_trials_per_rung_halves_down() -> None:
    assert trials_per_rung(16, 4, 3) == (16, 4, 1)
    assert trials_per_rung(10, 4, 3) == (10, 2, 0)
    assert trials_per_rung(100, 3, 4) == (100, 33, 11, 3)
    assert trials_per_rung(20, 2.5, 3) == (20, 8, 3)  # 8 / 2.5 = 3.2


@pytest.mark.parametrize(
    ("results", "divisor", "quota"),
    [(0, 4, 0), (3, 4, 0), (4, 4, 1), (7, 4, 1), (8, 4, 2), (5, 2.5, 2), (4, 2.5, 1), (7, 1.4, 5)],
)
def test_promotion_quota(results: int, divisor: float, quota: int) -> None:
    assert promotion_quota(results, divisor) == quota


def test_mode_brackets() -> None:
    assert mode_brackets("aggressive", 4) == (4,)
    assert mode_brackets("standard", 5) == (3, 4, 5)
    assert mode_brackets("standard", 4) == (2, 3, 4)
    assert mode_brackets("standard", 1) == (1,)
    assert mode_brackets("conservative", 3) == (1, 2, 3)
    with pytest.raises(ValueError, match="mode must be one of"):
        mode_brackets("wild", 3)


def test_bracket_max_trials_equalises_budget() -> None:
    # weights 4**4/5 = 51.2, 4**3/4 = 16, 4**2/3 = 5.33: 70, 22, 7 and the remainder to the first
    assert bracket_max_trials(100, 4, [5, 4, 3]) == (71, 22, 7)
    assert bracket_max_trials(3, 4, [5, 1]) == (2, 1)


def test_bracket_max_trials_never_exceeds_max_trials() -> None:
    # 2.54 -> 2, and two brackets raised to 1: 4 > 3, so the largest gives one back
    assert bracket_max_trials(3, 10, [3, 2, 1]) == (1, 1, 1)
    with pytest.raises(ValueError, match="3 brackets need max_trials >= 3"):
        bracket_max_trials(2, 4, [3, 2, 1])


def test_bracket_max_concurrent() -> None:
    assert bracket_max_concurrent(0, 4, (71, 22, 7)) == (7, 7, 7)
    assert bracket_max_concurrent(0, 4, (10, 2)) == (4, 4)
    assert bracket_max_concurrent(5, 4, (71, 22, 7)) == (2, 2, 1)
    assert bracket_max_concurrent(2, 4, (71, 22, 7)) == (1, 1, 1)  # the searcher caps at 2


def test_asha_defaults_cap_the_rungs() -> None:
    # 5 rungs by default, but 16 trials with divisor 4 only fill 3.
    spec = search_spec(config("asha", max_trials=16), SPACE)

    (bracket,) = spec.brackets
    assert bracket.lengths == (62, 250, 1000)
    assert bracket.max_concurrent_trials == 16  # min(divisor**(rungs-1), max_trials)


def test_adaptive_global_cap_only_with_several_brackets() -> None:
    spec = search_spec(config("adaptive_asha", max_trials=100, max_concurrent_trials=2), SPACE)

    assert [b.num_rungs for b in spec.brackets] == [4, 3, 2]  # standard, max 4 rungs fit 100
    assert spec.max_concurrent_trials == 2
    assert sum(b.max_trials for b in spec.brackets) == 100


def test_preview_asha_hand_computed() -> None:
    plan = preview(config("asha", max_trials=16, num_rungs=3), SPACE)

    (bracket,) = plan.brackets
    assert bracket.rungs == (RungPreview(62, 16), RungPreview(250, 4), RungPreview(1000, 1))
    assert bracket.budget == 16 * 62 + 4 * (250 - 62) + 1 * (1000 - 250) == 2494
    assert plan.total_budget == 2494
    assert plan.total_trials == 16


def test_preview_adaptive_hand_computed() -> None:
    plan = preview(config("adaptive_asha", max_length=2000, max_trials=16), SPACE)

    # standard mode over min(5, 6, 3) = 3 rungs: brackets of 3 and 2 rungs
    assert [b.num_rungs for b in plan.brackets] == [3, 2]
    # weights 16/3 and 4/2: int(16 * 0.727) = 11, int(16 * 0.273) = 4, remainder 1 to the first
    assert [b.max_trials for b in plan.brackets] == [12, 4]
    first, second = plan.brackets
    assert first.rungs == (RungPreview(125, 12), RungPreview(500, 3), RungPreview(2000, 0))
    assert first.budget == 12 * 125 + 3 * 375 == 2625
    assert second.rungs == (RungPreview(500, 4), RungPreview(2000, 1))
    assert second.budget == 4 * 500 + 1 * 1500 == 3500
    assert plan.total_budget == 6125


def test_preview_grid_random_single() -> None:
    grid = preview(config("grid"), SPACE)
    # lr 4 values, optimizer 3, width 3, dropout 2
    assert grid.total_trials == 4 * 3 * 3 * 2
    assert grid.total_budget == 72 * 1000
    assert grid.sampler == "grid"
    assert preview(config("random", max_trials=7), SPACE).total_budget == 7000
    assert preview(config("single"), SPACE).total_trials == 1
    assert preview(config("bayesian", max_trials=3), SPACE).sampler == "tpe"


def test_preview_float_divisor_hand_computed() -> None:
    plan = preview(config("asha", max_length=100, max_trials=20, num_rungs=3, divisor=2.5), SPACE)

    (bracket,) = plan.brackets
    assert bracket.rungs == (RungPreview(16, 20), RungPreview(40, 8), RungPreview(100, 3))
    assert bracket.budget == 20 * 16 + 8 * 24 + 3 * 60
    assert bracket.max_concurrent_trials == 6  # floor(2.5**2), below max_trials
    assert plan.divisor == 2.5
    assert bracket_max_concurrent(0, 2.5, (7, 3)) == (3, 3)
