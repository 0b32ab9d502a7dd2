"""Turn a model directory and an `entrypoint` into a Trial class, with errors users can act on."""

from __future__ import annotations

import importlib
import sys
import traceback
from pathlib import Path

from assay._trial import Trial
from assay.errors import EntrypointError, TrialLoadError

# Errors that importing the model definition raises the same way on every run (its code
# or its imports are wrong), as opposed to, say, an OSError while it reads a file.
REPEATABLE_IMPORT_ERRORS = (SyntaxError, ImportError, NameError, AttributeError, TypeError)


def load_trial_class(model_dir: str | Path, entrypoint: str) -> type[Trial]:
    """Import `module:Class` from `model_dir` (which is put first on `sys.path`)."""
    model_dir = Path(model_dir).resolve()
    if not model_dir.is_dir():
        raise TrialLoadError(f"model directory {model_dir} does not exist or is not a directory")
    module_name, _, qualname = entrypoint.partition(":")
    if not module_name or not qualname:
        raise EntrypointError(
            f"entrypoint {entrypoint!r} must look like 'module:ClassName' (e.g. model_def:MyTrial)"
        )
    if str(model_dir) in sys.path:
        sys.path.remove(str(model_dir))
    sys.path.insert(0, str(model_dir))
    _forget_foreign_module(module_name.split(".")[0], model_dir)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name == module_name.split(".")[0]:
            found = sorted(p.stem for p in model_dir.glob("*.py"))
            raise EntrypointError(
                f"entrypoint {entrypoint!r}: no module {module_name!r} in {model_dir} "
                f"(Python files there: {', '.join(found) or 'none'})"
            ) from None
        raise EntrypointError(
            f"importing {module_name!r} from {model_dir} failed: {_where(e)}"
        ) from None
    except Exception as e:
        kind = EntrypointError if isinstance(e, REPEATABLE_IMPORT_ERRORS) else TrialLoadError
        raise kind(f"importing {module_name!r} from {model_dir} failed: {_where(e)}") from None
    obj: object = module
    for part in qualname.split("."):
        if not hasattr(obj, part):
            candidates = sorted(
                name
                for name, value in vars(module).items()
                if isinstance(value, type) and issubclass(value, Trial) and value is not Trial
            )
            hint = f"; Trial classes there: {', '.join(candidates)}" if candidates else ""
            raise EntrypointError(
                f"entrypoint {entrypoint!r}: module {module_name!r} has no {qualname!r}{hint}"
            )
        obj = getattr(obj, part)
    if not (isinstance(obj, type) and issubclass(obj, Trial)):
        raise EntrypointError(
            f"entrypoint {entrypoint!r} names {obj!r}, which is not a subclass of assay.Trial"
        )
    return obj


def _forget_foreign_module(top: str, model_dir: Path) -> None:
    """Drop a cached module of the same name imported from another directory.

    Two model directories often both hold `model_def.py`; in one process, the second
    must not silently get the first one's classes.
    """
    cached = sys.modules.get(top)
    file = getattr(cached, "__file__", None)
    if cached is None or (file is not None and Path(file).resolve().is_relative_to(model_dir)):
        return
    for name in [n for n in sys.modules if n == top or n.startswith(top + ".")]:
        del sys.modules[name]


def _where(error: BaseException) -> str:
    """`Type: message (file.py, line N)` for the innermost frame of the user's code."""
    frames = traceback.extract_tb(error.__traceback__)
    user = [f for f in frames if "importlib" not in f.filename]
    location = ""
    if isinstance(error, SyntaxError) and error.filename:
        location = f" ({Path(error.filename).name}, line {error.lineno})"
    elif user:
        last = user[-1]
        location = f" ({Path(last.filename).name}, line {last.lineno})"
    message = error.msg if isinstance(error, SyntaxError) else str(error)
    return f"{type(error).__name__}: {message}{location}"
