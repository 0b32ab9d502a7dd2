"""Before a config is submitted or run: does its entrypoint exist in the model directory?

Read with `ast`, never imported: checking must not import torch or run the user's code.
A `module:Class` entrypoint needs the module's file in the model directory (or an
installed module of that name) and, at its top level, a definition, assignment or import
of the class's name. A script entrypoint needs its file, and the file must compile. What
cannot be told without running the code (a module with `from x import *` or a module-level
`__getattr__`) passes.
"""

from __future__ import annotations

import ast
import difflib
import warnings
from collections.abc import Iterator
from pathlib import Path

from assay._archive_check import ignored_import, installed
from assay._script import launcher_trial, script_problem
from assay.config import ExperimentConfig

# Larger model files are let through unread: parsing them costs more than it can tell.
MAX_PARSED_BYTES = 2 * 2**20


def entrypoint_problem(config: ExperimentConfig, model_dir: str | Path) -> str | None:
    """What is wrong with `config`'s entrypoint in `model_dir`, on one line, or None."""
    if config.command is not None:
        trial = launcher_trial(config.command)
        if trial is None:
            # Where the trials run has its own packages: a module is not looked up here.
            return script_problem(config.command, model_dir, runs_here=False)
        return trial_problem(trial, Path(model_dir))
    return trial_problem(config.entrypoint, Path(model_dir))


def trial_problem(entrypoint: str, model_dir: Path) -> str | None:
    """What is wrong with a `module:Class` entrypoint in `model_dir`, or None."""
    module_name, _, qualname = entrypoint.partition(":")
    if not module_name or not qualname:
        return f"entrypoint {entrypoint!r} must look like 'module:ClassName'"
    source = _module_file(model_dir, module_name)
    if source is None:
        top = module_name.split(".")[0]
        if installed(top):
            return None  # an installed package: only importing it would tell
        found = sorted(p.name for p in model_dir.glob("*.py"))
        return (
            f"entrypoint {entrypoint!r}: no module {module_name!r} in {model_dir} "
            f"(Python files there: {', '.join(found) or 'none'})"
        )
    shown = source.relative_to(model_dir)
    try:
        if source.stat().st_size > MAX_PARSED_BYTES:
            return None  # too big to read here: the import will tell
        with warnings.catch_warnings():  # an invalid escape is the import's to warn of
            warnings.simplefilter("ignore")
            tree = ast.parse(source.read_bytes(), filename=str(source))
        return ignored_import(tree, shown, model_dir) or _missing_name(
            entrypoint, shown, tree, qualname
        )
    except SyntaxError as e:
        return (
            f"entrypoint {entrypoint!r}: {shown} does not compile: SyntaxError: {e.msg} "
            f"({shown}, line {e.lineno})"
        )
    except (OSError, ValueError, RecursionError, MemoryError):
        # Unreadable here, NUL bytes, or nested too deep for this parser to hold in
        # memory: cannot tell, so the import will say what is wrong.
        return None


def _missing_name(entrypoint: str, shown: Path, tree: ast.Module, qualname: str) -> str | None:
    """What is wrong with a class `qualname` in the parsed module `tree`, or None."""
    names = _top_level_names(tree)
    if names is None:
        return None
    wanted = qualname.split(".")[0]
    if wanted in names:
        return None
    defined = [n for n in tree.body if isinstance(n, ast.ClassDef)]
    # A class whose base is named like a Trial is most likely one (no import tells here).
    trials = sorted(c.name for c in defined if any("Trial" in ast.unparse(b) for b in c.bases))
    classes = trials or sorted(c.name for c in defined)
    close = difflib.get_close_matches(wanted, classes, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    kind = "Trial classes" if trials else "classes"
    listed = f" ({kind} there: {', '.join(classes)})" if classes else " (it defines no class)"
    return f"entrypoint {entrypoint!r}: {shown} has no {wanted!r}{listed}{hint}"


def _module_file(model_dir: Path, module_name: str) -> Path | None:
    base = model_dir.joinpath(*module_name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _top_level_names(tree: ast.Module) -> set[str] | None:
    """The names a module binds at its top level; None when they cannot be known
    without running it (`import *`, a module `__getattr__`, `globals()` written to)."""
    names: set[str] = set()
    for node in _top_level(tree.body):
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
            return None
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            if node.name == "__getattr__":
                return None
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        else:
            for sub in ast.walk(node):
                if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                    names.add(sub.id)
                elif isinstance(sub, ast.Name) and sub.id in ("globals", "setattr"):
                    return None
    return names


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements run at import: into `if`, `try` and `with` blocks, not functions."""
    for node in body:
        if isinstance(node, ast.If | ast.While | ast.For | ast.AsyncFor):
            yield from _top_level(node.body)
            yield from _top_level(node.orelse)
            if isinstance(node, ast.For | ast.AsyncFor):
                yield ast.Assign(targets=[node.target], value=ast.Constant(None))
        elif isinstance(node, ast.Try | ast.TryStar):
            yield from _top_level(node.body)
            for handler in node.handlers:
                yield from _top_level(handler.body)
            yield from _top_level(node.orelse)
            yield from _top_level(node.finalbody)
        elif isinstance(node, ast.With | ast.AsyncWith):
            yield from _top_level(node.body)
            for item in node.items:
                if item.optional_vars is not None:
                    yield ast.Assign(targets=[item.optional_vars], value=ast.Constant(None))
        else:
            yield node


__all__ = ["entrypoint_problem", "trial_problem"]
