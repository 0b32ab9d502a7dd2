"""import-linter contract types of our own, named in `.importlinter` (`contract_types`).

`lint-imports`, run from the repository root, finds this module there (it puts the working
directory on `sys.path`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import grimp
from importlinter.application import output
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck, InvalidContractOptions

# (importer, imported, line numbers)
Violation = tuple[str, str, tuple[int, ...]]


def is_private_name(name: str) -> bool:
    """`_x` is private; a dunder name (`__main__`, `__init__`) is not."""
    return name.startswith("_") and not name.endswith("__")


def owner_of(module: str) -> str | None:
    """The package a private module belongs to: the parent of the innermost private
    component of its name (`a.b._c` and `a.b._c.d`: `a.b`; `a._b._c`: `a._b`). None for a
    public module, every component of whose name is public."""
    parts = module.split(".")
    private = [i for i, part in enumerate(parts) if i > 0 and is_private_name(part)]
    return ".".join(parts[: private[-1]]) if private else None


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def may_import(importer: str, imported: str, boundaries: Iterable[str]) -> bool:
    """Whether `importer` may import `imported` under `ComponentPrivacyContract`'s rule."""
    owner = owner_of(imported)
    if owner is None:
        return True
    if not within(importer, owner):
        return False
    # A component nested in the owner is a package of its own, not part of the owner.
    return not any(b != owner and within(b, owner) and within(importer, b) for b in boundaries)


class ComponentPrivacyContract(Contract):
    """No module imports another package's private module.

    A module is private when a component of its name below the root starts with one
    underscore (`assay.cli._client`, `assay.master.api._servicers._experiments`). It belongs to
    the parent of its innermost private component: `assay.cli._client` to `assay.cli`,
    `assay.master.api._servicers._experiments` to `assay.master.api._servicers`. A private module
    may be imported only by the package it belongs to and by that package's descendants,
    where the packages listed in `boundaries` are each a package of their own: a module
    inside a boundary package is not part of any package above it. So with `assay.client`
    a boundary, `assay._trial` belongs to `assay` (the user library) and `assay.core` may
    import it, but `assay.client._checkpoint` may not: it goes through what `assay`
    exports, as any user's code would.

    Options:
        - packages: the packages whose private modules are checked (their descendants too).
        - boundaries: packages that are components of their own (optional).
    """

    type_name = "component_privacy"

    packages = fields.ListField(subfield=fields.StringField())
    boundaries = fields.ListField(subfield=fields.StringField(), required=False)

    def validate(self) -> None:
        for package in self._packages():
            if owner_of(package) is not None:
                raise InvalidContractOptions({"packages": f"{package} is private"})

    def _packages(self) -> list[str]:
        return list(cast("list[str]", self.packages))

    def _boundaries(self) -> list[str]:
        return list(cast("list[str] | None", self.boundaries) or [])

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        boundaries = self._boundaries()
        checked = sorted(m for m in graph.modules if any(within(m, p) for p in self._packages()))
        violations: list[Violation] = []
        for imported in checked:
            if owner_of(imported) is None:
                continue
            for importer in sorted(graph.find_modules_that_directly_import(imported)):
                if not may_import(importer, imported, boundaries):
                    details = graph.get_import_details(importer=importer, imported=imported)
                    lines = tuple(sorted({int(d["line_number"]) for d in details}))
                    violations.append((importer, imported, lines))
        return ContractCheck(kept=not violations, metadata={"violations": violations})

    def render_broken_contract(self, check: ContractCheck) -> None:
        violations: list[Violation] = check.metadata["violations"]
        output.print_error(
            f"{len(violations)} imports of another package's private module:", bold=False
        )
        output.new_line()
        for importer, imported, lines in violations:
            shown = ", ".join(map(str, lines))
            output.print_error(f"- {importer} -> {imported} (l.{shown})", bold=False)
        output.new_line()
