"""The docs site builds strictly (every link and anchor resolves, the generated reference
pages included), and every page its nav names exists."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _hooks() -> Any:
    """docs/hooks.py, which writes the reference pages at build time."""
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    assert spec is not None
    assert spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    return hooks


def generated_page(path: str) -> str:
    """A reference page (`reference/cli-commands.md`, ...) as `mkdocs build` writes it."""
    return str(_hooks().PAGES[path]())


def _generated_pages() -> set[str]:
    return set(_hooks().PAGES)


def _nav_pages(nav: Any) -> Iterator[str]:
    if isinstance(nav, str):
        yield nav
    elif isinstance(nav, list):
        for entry in nav:
            yield from _nav_pages(entry)
    elif isinstance(nav, dict):
        for value in nav.values():
            yield from _nav_pages(value)


def test_every_page_in_the_nav_exists() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    pages = list(_nav_pages(config["nav"]))
    generated = _generated_pages()

    assert len(pages) == len(set(pages)), "a page is in the nav twice"
    missing = [p for p in pages if p not in generated and not (DOCS / p).is_file()]
    assert not missing, f"the nav names pages that do not exist: {missing}"
    on_disk = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert not on_disk - set(pages), f"pages left out of the nav: {on_disk - set(pages)}"
    assert generated <= set(pages), f"generated pages left out of the nav: {generated}"


@pytest.mark.slow
def test_the_site_builds_strictly(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )

    assert done.returncode == 0, done.stderr
    assert (tmp_path / "index.html").is_file()
    for generated in ["cli-commands", "http-routes", "config-schema", "master-settings"]:
        assert (tmp_path / "reference" / generated / "index.html").is_file(), generated
