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
    config_a, searcher_a = check_submission(CONFIG, model)
    config_b, searcher_b = check_submission(CONFIG, model)
    assert config_a == config_b
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
