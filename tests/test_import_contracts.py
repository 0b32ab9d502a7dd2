"""The rule `.importlinter` holds every package to: no module imports another package's
private module (scripts/import_contracts.py)."""

from __future__ import annotations

import grimp
import pytest

from scripts.import_contracts import ComponentPrivacyContract, may_import, owner_of

BOUNDARIES = ["app.cli", "app.client", "app.master"]


@pytest.mark.parametrize(
    ("module", "owner"),
    [
        ("app.cli._client", "app.cli"),
        ("app.master._servicers._experiments", "app.master._servicers"),
        ("app.master._servicers.experiments", "app.master"),
        ("app._trial", "app"),
        ("app.client", None),
        ("app.__main__", None),
    ],
)
def test_a_private_module_belongs_to_the_parent_of_its_innermost_private_part(
    module: str, owner: str | None
) -> None:
    assert owner_of(module) == owner


@pytest.mark.parametrize(
    ("importer", "imported", "allowed"),
    [
        ("app.cli.main", "app.cli._client", True),  # its own package
        ("app.cli._deploy", "app.cli._client", True),
        ("app.client._session", "app.cli._client", False),  # another component
        ("app._load", "app.cli._client", False),
        ("app.core._context", "app._trial", True),  # the user library's own subpackage
        ("app", "app.core._info", False),  # above the owner
        ("app.client._checkpoint", "app._trial", False),  # a component nested in the owner
        ("app.master._core", "app.master.store._models", False),  # beside the owner
        ("app.master.store", "app.master.store._models", True),
        ("app.client", "app.client", True),  # public
    ],
)
def test_who_may_import_a_private_module(importer: str, imported: str, allowed: bool) -> None:
    assert may_import(importer, imported, BOUNDARIES) is allowed


def test_the_contract_lists_each_import_with_its_lines() -> None:
    graph = grimp.ImportGraph()
    for module in ("app", "app._trial", "app.cli", "app.cli._client", "app.client"):
        graph.add_module(module)
    graph.add_import(
        importer="app.client", imported="app.cli._client", line_number=3, line_contents="x"
    )
    graph.add_import(
        importer="app.cli", imported="app.cli._client", line_number=1, line_contents="y"
    )
    graph.add_import(importer="app.cli", imported="app._trial", line_number=2, line_contents="z")
    options = {"packages": ["app"], "boundaries": BOUNDARIES}

    check = ComponentPrivacyContract("privacy", {}, options).check(graph, verbose=False)

    assert not check.kept
    assert check.metadata["violations"] == [
        ("app.cli", "app._trial", (2,)),
        ("app.client", "app.cli._client", (3,)),
    ]
