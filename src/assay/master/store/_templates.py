"""Experiment templates: named partial configs that `experiment create --template NAME`
merges under the experiment's own config.

Templates are edited by people, one call at a time, so these writes are the store's
direct ones, each one transaction. A template's config is checked here to be a mapping
(the experiment that uses it is validated as a whole when it is created).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from assay.master.errors import ConflictError, InvalidArgumentError, NotFoundError
from assay.master.store._base import StoreBase
from assay.master.store._models import ExperimentTemplate, User

TEMPLATE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


@dataclass(frozen=True)
class TemplateRecord:
    name: str
    config: dict[str, Any]
    owner: str
    created_at: dt.datetime
    updated_at: dt.datetime


def check_template_name(name: str) -> str:
    if not TEMPLATE_NAME.fullmatch(name):
        raise InvalidArgumentError(
            f"template name {name!r} is not allowed: 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


class TemplateQueries(StoreBase):
    """Experiment templates."""

    def create_template(self, name: str, config: Mapping[str, Any], *, owner_id: int) -> None:
        """A new template; a template of that name already existing is a `ConflictError`."""
        if not isinstance(config, Mapping):
            raise InvalidArgumentError("a template's config must be a mapping of config keys")
        row = ExperimentTemplate(
            name=check_template_name(name), config=dict(config), owner_id=owner_id
        )
        try:
            with self.write() as s:
                s.add(row)
        except IntegrityError:
            raise ConflictError(
                f"a template named {name!r} exists already: delete it first, or choose another name"
            ) from None

    def get_template(self, name: str) -> TemplateRecord:
        with self.read() as s:
            found = s.execute(
                select(ExperimentTemplate, User.username)
                .join(User, User.id == ExperimentTemplate.owner_id)
                .where(ExperimentTemplate.name == name)
            ).first()
            if found is None:
                raise NotFoundError(
                    f"template {name!r} does not exist (assay template list shows them)"
                )
            return _record(found[0], found[1])

    def list_templates(self) -> list[TemplateRecord]:
        with self.read() as s:
            rows = s.execute(
                select(ExperimentTemplate, User.username)
                .join(User, User.id == ExperimentTemplate.owner_id)
                .order_by(ExperimentTemplate.name)
            ).all()
            return [_record(t, owner) for t, owner in rows]

    def delete_template(self, name: str) -> None:
        with self.write() as s:
            row = s.execute(
                select(ExperimentTemplate).where(ExperimentTemplate.name == name)
            ).scalar()
            if row is None:
                raise NotFoundError(
                    f"template {name!r} does not exist (assay template list shows them)"
                )
            s.delete(row)


def _record(t: ExperimentTemplate, owner: str) -> TemplateRecord:
    return TemplateRecord(
        name=t.name,
        config=dict(t.config),
        owner=owner,
        created_at=t.created_at,
        updated_at=t.updated_at,
    )
