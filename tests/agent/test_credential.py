"""The agent's credential file: written 0600, replaced whole, read back at start."""

from __future__ import annotations

import logging
import stat
from pathlib import Path

import pytest

from assay.agent._credential import CredentialFile


def test_a_credential_is_kept_0600_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "work" / "credential"
    credential = CredentialFile(path)
    assert credential.value == ""
    credential.save("first")
    credential.save("second")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text() == "second\n"
    assert CredentialFile(path).value == "second"
    assert [p.name for p in path.parent.iterdir()] == ["credential"]  # no temporary left


def test_a_file_others_can_read_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "credential"
    path.write_text("secret\n")
    path.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="assay.agent"):
        assert CredentialFile(path).value == "secret"
    assert "chmod 600" in caplog.text


def test_a_credential_that_cannot_be_written_is_kept_in_memory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    credential = CredentialFile(blocker / "credential")  # its parent is a file
    with caplog.at_level(logging.ERROR, logger="assay.agent"):
        credential.save("kept")
    assert credential.value == "kept"
    assert "assay agent remove" in caplog.text
