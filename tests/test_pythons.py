"""scripts/pythons.py, the runner of the unit tier on every supported Python: what it
installs where torch has no wheel, how it reads pytest's counts, and its skip of the tests
that import torch there."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "pythons.py"


@pytest.fixture(scope="module")
def pythons() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pythons_under_test", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_without_torch_the_torch_stack_is_left_out_and_nothing_else(pythons: ModuleType) -> None:
    everything = pythons.requirements(without_torch=False)
    kept = pythons.requirements(without_torch=True)
    names = {pythons._name(r) for r in kept}
    assert not names & pythons.NEEDS_TORCH
    assert {pythons._name(r) for r in everything} - names == {"torch", "lightning"}
    assert {"numpy", "pytest", "grpcio"} <= names


def test_the_wheel_for_the_interpreters_tag_is_chosen(
    pythons: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in (
        "torch-2.12.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
        "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
        "torch-2.13.0+cpu-cp312-cp312-win_amd64.whl",
    ):
        (tmp_path / name).touch()
    monkeypatch.setattr(pythons, "WHEELS", tmp_path)
    chosen = pythons.torch_wheel(pythons.Python(Path("/x"), "3.11.2"))
    assert chosen.name.startswith("torch-2.13.0+cpu-cp311")
    assert pythons.torch_wheel(pythons.Python(Path("/x"), "3.12.1")) is None
    assert pythons.Python(Path("/x"), "3.13.0").tag == "cp313"


def test_a_venv_is_made_again_when_pyproject_or_the_wheel_changes(pythons: ModuleType) -> None:
    python = pythons.Python(Path("/x"), "3.11.2")
    wheel = Path("torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl")
    assert pythons.stamp(python, wheel) == pythons.stamp(python, wheel)
    assert pythons.stamp(python, wheel) != pythons.stamp(python, None)
    assert pythons.stamp(python, None) != pythons.stamp(pythons.Python(Path("/x"), "3.11.7"), None)


def test_pytests_closing_counts_are_the_summary(pythons: ModuleType) -> None:
    output = (
        "....\nSKIPPED [1] x.py:3: why\n===== 885 passed, 2 skipped in 269.58s (0:04:29) =====\n"
    )
    assert pythons._summary(output) == "885 passed, 2 skipped in 269.58s (0:04:29)"
    assert pythons._summary("Traceback ...\n") == "no summary (pytest did not finish)"


def test_a_torch_import_by_the_projects_code_is_a_skip_naming_the_file(
    pythons: ModuleType,
) -> None:
    finder = pythons._TorchIsMissing("no CPU wheel of torch for cp312")
    with pytest.raises(pytest.skip.Exception, match=r"tests/test_pythons.py imports torch.nn: no"):
        finder.find_spec("torch.nn")
    with pytest.raises(pytest.skip.Exception, match="imports lightning"):
        finder.find_spec("lightning")
    assert finder.find_spec("numpy") is None
    assert finder.find_spec("torchvision_like") is None
