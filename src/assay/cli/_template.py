"""Composing an experiment config: `--config key=value` overrides and partial configs
merged over a base (what `experiment create --config` and `experiment fork` do)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import yaml

from assay.config import merge
from assay.errors import AssayError

from . import _format as fmt
from ._common import AliasedGroup, client, echo_json, user_errors

if TYPE_CHECKING:
    from assay.proto import api_pb2

# `searcher.max_length.batches=200`: dotted keys of letters, digits, `_` and `-`.
_OVERRIDE = re.compile(r"([A-Za-z_][\w-]*(?:\.[A-Za-z_0-9][\w-]*)*)=(.*)", re.S)


def is_override(text: str) -> bool:
    """Whether `text` reads as KEY=VALUE (else it names a file)."""
    return _OVERRIDE.fullmatch(text) is not None


def apply_overrides(config: Mapping[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """`config` with each `a.b.c=VALUE` set; VALUE is read as YAML (`0.1`, `true`,
    `[1, 2]`, `{type: int, minval: 1, maxval: 4}`), so a string needs no quotes."""
    result = dict(config)
    for text in overrides:
        found = _OVERRIDE.fullmatch(text)
        if found is None:
            raise AssayError(
                f"--config {text!r} is not KEY=VALUE (e.g. searcher.max_length.batches=200)"
            )
        keys, raw = found[1].split("."), found[2]
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as e:
            raise AssayError(f"--config {text!r}: the value is not valid YAML: {e}") from None
        patch: dict[str, Any] = {keys[-1]: value}
        for key in reversed(keys[:-1]):
            patch = {key: patch}
        _check_path(result, keys, text)
        result = merge(result, patch)
    return result


def _check_path(config: Mapping[str, Any], keys: list[str], text: str) -> None:
    """Refuse to replace a value that is not a mapping by descending into it."""
    node: Any = config
    for depth, key in enumerate(keys[:-1]):
        node = node.get(key) if isinstance(node, Mapping) else None
        if node is not None and not isinstance(node, Mapping):
            where = ".".join(keys[: depth + 1])
            raise AssayError(
                f"--config {text!r}: {where} is {node!r}, not a mapping; set {where}=... instead"
            )


def read_partial(path: Path) -> dict[str, Any]:
    """A YAML file holding a (partial) config mapping."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise AssayError(f"cannot read config file {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise AssayError(f"{path} is not valid YAML: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise AssayError(f"{path} must hold a mapping of config keys, not {type(data).__name__}")
    return dict(data)


def compose(base: Mapping[str, Any], configs: Iterable[str]) -> dict[str, Any]:
    """`base` with each `--config` laid over it in order: a FILE is merged, a KEY=VALUE set."""
    result = dict(base)
    for given in configs:
        if is_override(given):
            result = apply_overrides(result, [given])
        else:
            result = merge(result, read_partial(Path(given)))
    return result


# --- `assay template`: named partial configs on the master --------------------------------


@click.group("template", cls=AliasedGroup)
def template() -> None:
    """Experiment templates: partial configs that `experiment create --template NAME`
    merges under the experiment's own config."""


def _template_dict(t: api_pb2.Template) -> dict[str, Any]:
    return {
        "name": t.name,
        "owner": t.owner,
        "created_at": t.created_at.ToDatetime().isoformat() + "Z",
        "config": yaml.safe_load(t.config_yaml) or {},
    }


@template.command("create")
@click.argument("name")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the template as one JSON object.")
@user_errors
def create_command(name: str, file: Path, as_json: bool) -> None:
    """Store FILE (a YAML mapping of config keys) as template NAME. Every user can read
    templates: keep secrets out of them."""
    read_partial(file)  # a mapping, or one clear error before anything is sent
    created = client().create_template(name, file.read_text())
    if as_json:
        echo_json(_template_dict(created))
    else:
        click.echo(f"Created template {created.name}")


@template.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@user_errors
def list_command(as_json: bool) -> None:
    """List the templates, by name."""
    found = [_template_dict(t) for t in client().list_templates()]
    if as_json:
        echo_json(found)
        return
    rows = [[t["name"], t["owner"], ", ".join(t["config"]), t["created_at"]] for t in found]
    click.echo(fmt.table(["NAME", "OWNER", "KEYS", "CREATED"], rows))


@template.command("describe")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@user_errors
def describe_command(name: str, as_json: bool) -> None:
    """Print template NAME's config (YAML)."""
    found = client().get_template(name)
    if as_json:
        echo_json(_template_dict(found))
    else:
        click.echo(found.config_yaml.rstrip())


@template.command("delete")
@click.argument("name")
@user_errors
def delete_command(name: str) -> None:
    """Delete template NAME (its creator or an administrator); experiments created from
    it keep their configs."""
    client().delete_template(name)
    click.echo(f"Deleted template {name}")
