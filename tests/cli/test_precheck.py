"""`assay experiment create` refuses an entrypoint that cannot exist, before uploading,
without importing torch or the user's module; the checks themselves on small trees."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from assay._precheck import MAX_PARSED_BYTES, trial_problem
from tests.conftest import REGRESSION_DIR

from .conftest import CONFIG, FakeApi, assert_ok, assert_one_line_error, run_cli
from .test_experiment import created

# Importing this "torch" fails loudly: a check that imports torch cannot pass unnoticed.
FAKE_TORCH = 'raise ImportError("torch was imported")\n'


@pytest.fixture
def no_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "fake-site" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(FAKE_TORCH)
    monkeypatch.setenv("PYTHONPATH", str(fake.parent))


def _model(tmp_path: Path, extra: str = "") -> Path:
    model = tmp_path / "model"
    model.mkdir()
    shutil.copy(REGRESSION_DIR / "model_def.py", model / "model_def.py")
    if extra:
        with (model / "model_def.py").open("a") as f:
            f.write(extra)
    return model


def _config(tmp_path: Path, **overrides: object) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(dict(CONFIG, **overrides)))
    return path


def test_a_misspelt_class_is_refused_naming_the_classes_there(
    master: FakeApi, tmp_path: Path, no_torch: None
) -> None:
    config = _config(tmp_path, entrypoint="model_def:RegresionTrial")

    done = run_cli("e", "create", config, _model(tmp_path), master=master)

    line = assert_one_line_error(done, "'model_def:RegresionTrial'", "model_def.py has no")
    assert "RegressionTrial" in line
    assert "did you mean 'RegressionTrial'" in line
    assert master.requests == []


def test_a_missing_module_is_refused_naming_the_files_there(
    master: FakeApi, tmp_path: Path, no_torch: None
) -> None:
    config = _config(tmp_path, entrypoint="model:RegressionTrial")

    done = run_cli("e", "create", config, _model(tmp_path), master=master)

    assert_one_line_error(done, "no module 'model'", "model_def.py")
    assert master.requests == []


def test_a_model_definition_that_does_not_compile_is_refused_with_its_line(
    master: FakeApi, tmp_path: Path, no_torch: None
) -> None:
    model = _model(tmp_path, "\ndef broken(:\n    pass\n")

    done = run_cli("e", "create", _config(tmp_path), model, master=master)

    assert_one_line_error(done, "model_def.py does not compile", "line")
    assert master.requests == []


def test_a_script_that_does_not_compile_is_refused(
    master: FakeApi, tmp_path: Path, no_torch: None
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "train.py").write_text("print('hi'\n")
    config = _config(tmp_path, entrypoint="python3 train.py")

    done = run_cli("e", "create", config, model, master=master)

    assert_one_line_error(done, "train.py does not compile", "line 1")
    assert master.requests == []


def test_a_good_entrypoint_is_uploaded_without_importing_torch(
    master: FakeApi, tmp_path: Path, no_torch: None
) -> None:
    # An import the CLI's machine lacks is no reason to refuse: agents may have it.
    model = _model(tmp_path, "\nimport package_only_on_the_agents  # noqa\n")
    master.responses["CreateExperiment"] = created(5)

    done = run_cli("e", "create", _config(tmp_path), model, master=master)

    assert_ok(done)
    assert len(master.calls("CreateExperiment")) == 1


def test_names_bound_at_the_top_level_in_any_way_count(tmp_path: Path) -> None:
    source = """
import os
from base import Imported as Renamed
try:
    from fast import Tried
except ImportError:
    Tried = None
if os.environ.get("X"):
    class InIf: ...
else:
    InElse = object
with open(__file__) as Opened:
    pass
Assigned, (Unpacked, _) = 1, (2, 3)
Annotated: type = object
def Function(): ...
class Defined:
    class Nested: ...
"""
    (tmp_path / "m.py").write_text(source)
    names = ["Renamed", "Tried", "InIf", "InElse", "Opened", "Assigned", "Unpacked"]
    for name in [*names, "Annotated", "Function", "Defined", "Defined.Nested"]:
        assert trial_problem(f"m:{name}", tmp_path) is None, name
    problem = trial_problem("m:Nested", tmp_path)
    assert problem is not None
    assert "m.py has no 'Nested'" in problem


@pytest.mark.parametrize(
    "source",
    [
        "from helpers import *\n",
        "def __getattr__(name):\n    return name\n",
        "globals()['Made'] = type('Made', (), {})\n",
    ],
    ids=["star-import", "module-getattr", "globals"],
)
def test_what_only_running_the_module_would_tell_passes(tmp_path: Path, source: str) -> None:
    (tmp_path / "m.py").write_text(source)
    assert trial_problem("m:Made", tmp_path) is None


def test_packages_and_installed_modules(tmp_path: Path) -> None:
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "sub" / "__init__.py").write_text("class T: ...\n")
    (tmp_path / "pkg" / "mod.py").write_text("class U: ...\n")
    assert trial_problem("pkg.sub:T", tmp_path) is None
    assert trial_problem("pkg.mod:U", tmp_path) is None
    assert "pkg/mod.py has no 'T'" in (trial_problem("pkg.mod:T", tmp_path) or "")
    assert trial_problem("yaml:Anything", tmp_path) is None  # installed: not checked
    assert "no module 'nowhere'" in (trial_problem("nowhere:T", tmp_path) or "")


@pytest.mark.parametrize(
    "expression",
    ["+".join(["1"] * 200_000), "-" * 100_000 + "1"],
    ids=["too-deep", "too-much-memory"],
)
def test_a_file_the_parser_cannot_hold_is_let_through_to_the_import(
    master: FakeApi, tmp_path: Path, no_torch: None, expression: str
) -> None:
    model = _model(tmp_path, f"\nx = {expression}\n")
    master.responses["CreateExperiment"] = created(5)

    done = run_cli("e", "create", _config(tmp_path), model, master=master)

    assert_ok(done)
    assert len(master.calls("CreateExperiment")) == 1
    assert trial_problem("model_def:Missing", model) is None  # cannot tell: not refused


def test_a_file_over_the_size_cap_is_not_parsed(tmp_path: Path) -> None:
    body = "class Present: ...\n"
    (tmp_path / "small.py").write_text(body)
    padding = "#" * 1023 + "\n"
    (tmp_path / "big.py").write_text(body + padding * (MAX_PARSED_BYTES // 1024 + 1))

    assert "small.py has no 'Missing'" in (trial_problem("small:Missing", tmp_path) or "")
    assert trial_problem("big:Missing", tmp_path) is None


def test_a_script_too_deep_for_the_compiler_is_let_through_not_crashed(tmp_path: Path) -> None:
    from assay._script import script_problem

    model = tmp_path / "model"
    model.mkdir()
    for source in ("x = " + "+".join(["1"] * 200_000), "x = " + "-" * 100_000 + "1"):
        (model / "train.py").write_text(source + "\n")
        assert script_problem(["python3", "train.py"], model) is None
    (model / "train.py").write_text("print('hi'\n" + "#" * (3 * 2**20))
    assert script_problem(["python3", "train.py"], model) is None  # too big to check here


def test_a_module_that_assayignore_leaves_out_is_refused_when_imported(tmp_path: Path) -> None:
    # model_def.py imports helpers, which .assayignore leaves out: the trial died with
    # ModuleNotFoundError, although run-local in the same directory worked.
    model = tmp_path / "m"
    model.mkdir()
    (model / "helpers.py").write_text("X = 1\n")
    (model / "lib").mkdir()
    (model / "lib" / "__init__.py").write_text("")
    (model / "model_def.py").write_text("import helpers\nfrom lib import x\nclass T: ...\n")
    (model / "guarded.py").write_text(
        "try:\n    import helpers\nexcept ImportError:\n    helpers = None\nclass T: ...\n"
    )
    from assay._script import script_problem

    assert trial_problem("model_def:T", model) is None
    (model / ".assayignore").write_text("helpers.py\n")
    refused = trial_problem("model_def:T", model)
    assert refused == (
        "model_def.py imports helpers, but .assayignore leaves helpers.py out of the archive, "
        "so the trial could not import it: remove it from .assayignore"
    )
    assert script_problem(["python3", "model_def.py"], model) == refused
    assert trial_problem("guarded:T", model) is None  # a try that catches it: its own call
    (model / ".assayignore").write_text("lib/\n")
    assert "leaves lib/ out of the archive" in (trial_problem("model_def:T", model) or "")
    # A data folder beside data.py, or named like an installed package, is no module.
    (model / "data.py").write_text("X = 1\n")
    (model / "data").mkdir()
    (model / "data" / "big.bin").write_bytes(b"x")
    (model / "wandb").mkdir()
    (model / "uses_data.py").write_text("import data\nimport wandb\nclass T: ...\n")
    (model / ".assayignore").write_text("data/\nwandb/\n")
    assert trial_problem("uses_data:T", model) is None
    (model / ".assayignore").write_text("*.py\n")
    assert trial_problem("model_def:T", model) == (
        ".assayignore leaves out model_def.py, which the entrypoint runs: remove it there"
    )
