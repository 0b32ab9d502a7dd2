"""The master's state directory: its files are the master's alone, while isolated trials
pass through it (0711) to their experiment's checkpoint directory and list nothing."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from assay.master._server import _make_state_dir


def test_the_state_dir_and_checkpoint_root_are_traversable_and_files_private(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = tmp_path / "master"
    state.mkdir(mode=0o755)
    (state / "assay.db").write_text("")
    (state / "assay.db").chmod(0o644)  # as an older master without the umask left it
    (state / "join-token").write_text("secret")
    (state / "join-token").chmod(0o600)

    with caplog.at_level(logging.INFO, logger="assay.master"):
        _make_state_dir(state, state / "checkpoints")

    assert state.stat().st_mode & 0o7777 == 0o711
    assert (state / "checkpoints").stat().st_mode & 0o7777 == 0o711
    for name in ("assay.db", "join-token"):
        assert (state / name).stat().st_mode & 0o7777 == 0o600
    assert "assay.db was open to other users" in caplog.text
    # pytest's temporary directories are 0700: the master says trials cannot reach it.
    assert "cannot reach the checkpoint root" in caplog.text


def test_a_new_state_dir_is_made(tmp_path: Path) -> None:
    _make_state_dir(tmp_path / "a" / "b", tmp_path / "a" / "b" / "checkpoints")

    assert (tmp_path / "a" / "b").stat().st_mode & 0o7777 == 0o711
    assert (tmp_path / "a" / "b" / "checkpoints").is_dir()
