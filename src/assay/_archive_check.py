"""Would the model directory's archive keep what the entrypoint needs? A file that
`.assayignore` leaves out is not in the archive, so a trial that imports it fails where it
runs: said here, before the config is submitted or run, from the parsed source alone.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path


def ignored_import(tree: ast.Module, shown: Path, model_dir: Path) -> str | None:
    """The problem when the model directory's archive would leave out the file `shown`
    (parsed as `tree`), or a module of the directory that it imports at its top level
    (outside `try`, so nothing catches the ImportError): the trial would fail to import."""
    from assay.common.archive import IGNORE_FILE, left_out

    if left_out(model_dir, shown.as_posix(), is_dir=False):
        return f"{IGNORE_FILE} leaves out {shown}, which the entrypoint runs: remove it there"
    for node in tree.body:
        if isinstance(node, ast.Import):
            tops = [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            tops = [node.module.split(".")[0]]
        else:
            continue
        for top in tops:
            # What Python would import from the directory: a package (a folder with an
            # __init__.py; a folder without one is data, or a namespace package that
            # anything installed shadows), else a module.
            local = [
                (relpath, is_dir)
                for relpath, is_dir, marker in (
                    (top, True, f"{top}/__init__.py"),
                    (f"{top}.py", False, f"{top}.py"),
                )
                if (model_dir / marker).is_file()
            ]
            kept = [c for c in local if not left_out(model_dir, c[0], is_dir=c[1])]
            if local and not kept and not installed(top):
                relpath, is_dir = local[0]
                return (
                    f"{shown} imports {top}, but {IGNORE_FILE} leaves "
                    f"{relpath}{'/' if is_dir else ''} out of the archive, so the trial "
                    f"could not import it: remove it from {IGNORE_FILE}"
                )
    return None


def installed(top: str) -> bool:
    """Whether `top` is importable from this environment (found, not imported)."""
    try:
        return importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        return False
