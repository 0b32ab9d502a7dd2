"""The SDK stands on its own: `import assay.client` loads neither the CLI nor click, and
`assay.load_checkpoint` is the SDK's."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _modules_after(statement: str) -> set[str]:
    """The modules loaded by a fresh interpreter that runs `statement`."""
    code = f"{statement}\nimport sys\nprint('\\n'.join(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return set(done.stdout.split())


@pytest.mark.parametrize("statement", ["import assay.client", "from assay import client"])
def test_the_sdk_imports_without_click_or_the_cli(statement: str) -> None:
    loaded = _modules_after(statement)

    assert "assay.client" in loaded
    assert "click" not in loaded
    assert not any(m == "assay.cli" or m.startswith("assay.cli.") for m in loaded)


def test_the_sdk_opens_no_channel_at_import() -> None:
    """grpc and the generated stubs come with the first call, not with the import."""
    loaded = _modules_after("import assay.client")

    assert "grpc" not in loaded
    assert "assay.proto.api_pb2_grpc" not in loaded


def test_load_checkpoint_is_the_sdks() -> None:
    import assay
    from assay import client

    assert assay.load_checkpoint is client.load_checkpoint
