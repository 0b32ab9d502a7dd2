"""The submission checks remember what passed, and never what was refused."""

from __future__ import annotations

import io
import tarfile

import pytest

from assay.master.errors import InvalidArgumentError
from assay.master.submission import _submission, check_submission

CONFIG = """\
name: remembered
entrypoint: model_def:T
hyperparameters:
  global_batch_size: 8
  lr: {type: double, minval: 0.001, maxval: 0.1}
searcher: {name: random, metric: loss, max_trials: 3, max_length: {batches: 10}}
"""


def _archive(**members: bytes) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_a_resubmitted_config_is_the_same_config_with_a_searcher_of_its_own() -> None:
    model = _archive(**{"model_def.py": b"class T: pass\n"})
    seeded = CONFIG + "reproducibility: {experiment_seed: 7}\n"
    config_a, searcher_a = check_submission(seeded, model)
    config_b, searcher_b = check_submission(seeded, model)
    assert config_a is config_b  # remembered
    assert searcher_a is not searcher_b
    # Each searcher starts its own search: what one does is not seen by the other.
    first = searcher_a.initial_operations()
    assert first
    assert searcher_b.snapshot() != searcher_a.snapshot()


def test_a_refused_config_is_refused_every_time() -> None:
    model = _archive(**{"model_def.py": b""})
    bad = CONFIG.replace("max_trials: 3", "max_trials: -3")
    for _ in range(3):
        with pytest.raises(InvalidArgumentError, match="max_trials"):
            check_submission(bad, model)


def test_a_refused_archive_is_checked_again_and_a_changed_byte_is_checked_in_full() -> None:
    escaping = _archive(**{"../outside.py": b"x = 1\n"})
    for _ in range(2):
        with pytest.raises(InvalidArgumentError):
            check_submission(CONFIG, escaping)
    good = _archive(**{"model_def.py": b"class T: pass\n"})
    check_submission(CONFIG, good)
    # Not a prefix, a changed byte in the middle of an archive that passed.
    broken = bytearray(good)
    broken[len(broken) // 2] ^= 0xFF
    with pytest.raises(InvalidArgumentError):
        check_submission(CONFIG, bytes(broken))


def test_the_archives_remembered_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_submission, "_PASSED_LIMIT", 4)
    _submission._PASSED_ARCHIVES.clear()
    for i in range(10):
        check_submission(CONFIG, _archive(**{"model_def.py": f"x = {i}\n".encode()}))
    assert len(_submission._PASSED_ARCHIVES) == 4


def test_only_ordinary_configs_are_remembered() -> None:
    model = _archive(**{"model_def.py": b""})
    _submission._parsed_config.cache_clear()
    check_submission(CONFIG, model)
    padded = CONFIG + "#" * (_submission._REMEMBERED_CHARS + 1) + "\n"
    check_submission(padded, model)
    check_submission(padded, model)
    assert _submission._parsed_config.cache_info().currsize == 1


def test_a_config_without_a_seed_gets_one_drawn_for_each_submission() -> None:
    # As Determined's master does: two experiments of one config search different points.
    model = _archive(**{"model_def.py": b"class T: pass\n"})
    configs = [check_submission(CONFIG, model)[0] for _ in range(4)]
    seeds = {c.experiment_seed for c in configs}
    assert len(seeds) == 4
    for config in configs:
        assert config.raw["reproducibility"] == {"experiment_seed": config.experiment_seed}
        assert 0 <= config.experiment_seed < 2**31
    # Everything else is the config as submitted.
    assert {c.raw["searcher"]["max_trials"] for c in configs} == {3}


def test_a_seed_the_config_sets_is_kept_and_its_search_repeats() -> None:
    model = _archive(**{"model_def.py": b"class T: pass\n"})
    seeded = CONFIG + "reproducibility:\n  experiment_seed: 1234\n"
    (config_a, searcher_a), (config_b, searcher_b) = (
        check_submission(seeded, model) for _ in range(2)
    )
    assert config_a.experiment_seed == config_b.experiment_seed == 1234
    assert searcher_a.initial_operations() == searcher_b.initial_operations()
    drawn = check_submission(CONFIG, model)[1].initial_operations()
    assert drawn != searcher_a.initial_operations()


def test_the_text_people_read_back_says_a_drawn_seed_and_keeps_a_given_one() -> None:
    model = _archive(**{"model_def.py": b"class T: pass\n"})
    config, _ = check_submission(CONFIG, model)
    text = _submission.seeded_text(CONFIG, config)
    assert text.startswith(CONFIG)
    assert text.endswith(
        f"# reproducibility.experiment_seed: {config.experiment_seed} (drawn by the master: "
        "the config set none; set it to search the same points again)\n"
    )
    seeded = CONFIG + "reproducibility: {experiment_seed: 5}\n"
    assert _submission.seeded_text(seeded, check_submission(seeded, model)[0]) == seeded
