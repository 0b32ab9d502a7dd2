"""The docs site's reference pages, generated from the code at every build.

MkDocs runs `on_files` before it reads the nav, so the pages written here are ordinary
pages of the site (under `reference/`) that no one edits or commits: the experiment
config's keys from the config parser, the daemons' settings from `--help-config`, the
CLI from its click commands, and the HTTP API from the master's OpenAPI document.
Product code is imported inside each generator, through public entry points; the one
import of a master module is in `openapi_document()`.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

# (page path under docs/, its generator); the nav names these paths.
PAGES: dict[str, Callable[[], str]] = {}


def _page(path: str) -> Callable[[Callable[[], str]], Callable[[], str]]:
    def register(generate: Callable[[], str]) -> Callable[[], str]:
        PAGES[path] = generate
        return generate

    return register


def on_files(files: Any, config: Any) -> Any:
    """Add every generated page to the build."""
    from mkdocs.structure.files import File

    for path, generate in PAGES.items():
        files.append(File.generated(config, path, content=generate()))
    return files


def _cell(text: object) -> str:
    """One Markdown table cell: no pipe or newline may break the row."""
    return str(text).replace("|", "\\|").replace("\n", " ").strip()


def _table(head: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return [*lines, ""]


_GENERATED = "*Generated from the code at build time: do not edit.*"

# --- the experiment config ------------------------------------------------------------

_SECTIONS = ("resources", "optimizations", "checkpoint_storage", "environment", "reproducibility")
_PROBE = "zz_unknown_key"
_SEARCHERS = ("single", "grid", "random", "asha", "adaptive_asha", "bayesian", "pbt", "custom")


def _allowed_keys(config: Mapping[str, Any]) -> dict[str, list[str]]:
    """Ask the parser itself which keys each section reads: an unknown key's error lists
    them (`section.zz_unknown_key: unknown key (allowed: a, b, c)`)."""
    from assay.config import parse_config
    from assay.errors import InvalidConfigError

    try:
        parse_config(dict(config))
    except InvalidConfigError as e:
        found: dict[str, list[str]] = {}
        for line in str(e).splitlines():
            where, _, rest = line.strip().removeprefix("- ").partition(": unknown key")
            if where.endswith(_PROBE) and "(allowed: " in rest:
                keys = rest.split("(allowed: ", 1)[1].rstrip(")")
                found[where.removesuffix(_PROBE).rstrip(".")] = keys.split(", ")
        return found
    raise AssertionError("the config parser took an unknown key")


def _probe_config(searcher: str) -> dict[str, Any]:
    searcher_section: dict[str, Any] = {"name": searcher, "metric": "loss", _PROBE: 1}
    searcher_section["max_length"] = {"batches": 64}
    return {
        "entrypoint": "model_def:MyTrial",
        "hyperparameters": {"global_batch_size": 32},
        "searcher": searcher_section,
        _PROBE: 1,
        **{section: {_PROBE: 1} for section in _SECTIONS},
        "optimizations": {_PROBE: 1, "strategy": "fsdp", "fsdp": {_PROBE: 1}},
        "checkpoint_storage": {"type": "shared_fs", _PROBE: 1},
    }


def _fields(cls: type) -> dict[str, tuple[str, str]]:
    """A config dataclass's fields: name -> (type, default), as the parser fills them."""
    out: dict[str, tuple[str, str]] = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            default = repr(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            made = f.default_factory()
            default = "" if dataclasses.is_dataclass(made) else repr(made)
        else:
            default = "required"
        out[f.name] = (str(f.type), default)
    return out


def _key_rows(keys: list[str], fields: dict[str, tuple[str, str]]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for key in keys:
        kind, default = fields.get(key, ("", ""))
        rows.append((f"`{key}`", f"`{kind}`" if kind else "", f"`{default}`" if default else ""))
    return rows


@_page("reference/config-schema.md")
def config_schema_page() -> str:
    """Every key the experiment config parser reads, section by section and searcher by
    searcher, with the type and default of the parsed config's field of that name."""
    import assay.config as c

    sections = _allowed_keys(_probe_config("asha"))
    classes: dict[str, type] = {
        "": c.ExperimentConfig,
        "searcher": c.SearcherConfig,
        "resources": c.ResourcesConfig,
        "optimizations": c.OptimizationsConfig,
        "checkpoint_storage": c.CheckpointStorageConfig,
    }
    head = ("key", "parsed as", "default")
    lines = ["# Experiment config schema", "", _GENERATED, ""]
    lines += [
        "The keys `assay.config.parse_config` reads in each section of an experiment",
        "config, as its unknown-key errors list them, with the type and default of the",
        "parsed `ExperimentConfig` field of the same name where there is one. The",
        "[config reference](config.md) says what each key means.",
        "",
    ]
    for section in ("", *sorted(s for s in sections if s and s != "searcher")):
        lines += [f"## `{section}`" if section else "## Top level", ""]
        cls = classes.get(section)
        lines += _table(head, _key_rows(sections[section], _fields(cls) if cls else {}))
    lines += ["## `searcher`", "", "Each searcher reads the common keys and its own:", ""]
    searcher_fields = _fields(c.SearcherConfig)
    for name in _SEARCHERS:
        keys = _allowed_keys(_probe_config(name)).get("searcher", [])
        lines += [f"### `searcher.name: {name}`", ""]
        lines += _table(head, _key_rows(keys, searcher_fields))
    return "\n".join(lines)


# --- the daemons' settings ------------------------------------------------------------


def _help_config(module: str) -> str:
    """`assay-master --help-config` or `assay-agent --help-config`, run as the installed
    command runs it."""
    done = subprocess.run(
        [sys.executable, "-m", module, "--help-config"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout


def _settings_page(program: str, module: str, intro: str) -> str:
    lines = [f"# `{program}` settings", "", _GENERATED, "", intro, ""]
    lines += [
        f"The output of `{program} --help-config`: every key of the settings file, what it",
        "accepts, its default, its environment variable and its flag. Uncomment a key to set",
        "it. [Master and agent settings](../settings.md) explains them by topic.",
        "",
        "```yaml",
        _help_config(module).rstrip("\n"),
        "```",
        "",
    ]
    return "\n".join(lines)


@_page("reference/master-settings.md")
def master_settings_page() -> str:
    return _settings_page(
        "assay-master",
        "assay.master.main",
        "The master's settings file is `/etc/assay/master.yaml` when installed.",
    )


@_page("reference/agent-settings.md")
def agent_settings_page() -> str:
    return _settings_page(
        "assay-agent",
        "assay.agent.main",
        "An agent's settings file is `/etc/assay/agent.yaml` when installed.",
    )


# --- the CLI ------------------------------------------------------------------------


def _commands(cmd: Any, ctx: Any) -> Iterator[tuple[Any, Any]]:
    """Every command under `cmd`, depth first, with its click context."""
    import click

    yield cmd, ctx
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                yield from _commands(sub, click.Context(sub, info_name=name, parent=ctx))


def _aliases(group: Any, name: str) -> list[str]:
    aliases: dict[str, str] = getattr(group, "aliases", {})
    return sorted(alias for alias, target in aliases.items() if target == name)


def _param_rows(cmd: Any, ctx: Any) -> list[tuple[str, ...]]:
    import click

    rows: list[tuple[str, ...]] = []
    for param in cmd.get_params(ctx):
        if getattr(param, "hidden", False):
            continue
        if isinstance(param, click.Argument):
            name = f"`{param.human_readable_name}`"
            rows.append((name, "argument" + (", required" if param.required else ""), ""))
            continue
        assert isinstance(param, click.Option)
        names = ", ".join(f"`{o}`" for o in [*param.opts, *param.secondary_opts])
        kind = "flag" if param.is_flag else param.type.name
        if param.multiple:
            kind += ", repeatable"
        if param.required:
            kind += ", required"
        rows.append((names, kind, param.help or ""))
    return rows


@_page("reference/cli-commands.md")
def cli_page() -> str:
    """Every `assay` command: its usage line, help and parameters, from click."""
    import click

    from assay.cli.main import cli

    root = click.Context(cli, info_name="assay")
    lines = ["# `assay` commands", "", _GENERATED, ""]
    lines += [
        "Every command of the `assay` CLI, as `assay COMMAND --help` shows it. The",
        "[CLI guide](cli.md) shows them in use.",
        "",
    ]
    for cmd, ctx in _commands(cli, root):
        path = ctx.command_path
        depth = min(path.count(" ") + 1, 4)
        lines += ["#" * depth + f" `{path}`", ""]
        if ctx.parent is not None:
            aliases = _aliases(ctx.parent.command, ctx.info_name)
            if aliases:
                lines += ["Also: " + ", ".join(f"`{a}`" for a in aliases) + ".", ""]
        lines += ["```", " ".join(cmd.collect_usage_pieces(ctx)).join([f"{path} ", ""]), "```"]
        lines += ["", inspect.cleandoc(cmd.help or "").replace("\b\n", ""), ""]
        if not isinstance(cmd, click.Group):
            rows = _param_rows(cmd, ctx)
            if rows:
                lines += _table(("parameter", "kind", "what"), rows)
    return "\n".join(lines)


# --- the HTTP API -------------------------------------------------------------------


def openapi_document() -> dict[str, Any]:
    """The master's OpenAPI document, as `GET /api/v1/openapi.json` serves it."""
    from assay.master.api import openapi_document as build

    return build()


def _schema_text(schema: Mapping[str, Any]) -> str:
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[-1]
    if "enum" in schema:
        return " \\| ".join(str(v) for v in schema["enum"])
    if schema.get("type") == "array":
        return f"list of {_schema_text(schema.get('items', {}))}"
    if "anyOf" in schema:
        return " or ".join(_schema_text(s) for s in schema["anyOf"])
    return str(schema.get("type", "any"))


def _operation_lines(method: str, path: str, op: Mapping[str, Any]) -> list[str]:
    lines = [f"### `{method.upper()} {path}`", "", str(op.get("summary", "")), ""]
    if "x-grpc-method" in op:
        lines += [f"gRPC: `{op['x-grpc-method']}`.", ""]
    if op.get("security") == []:
        lines += ["No session token needed.", ""]
    rows = [
        (
            f"`{p['name']}`",
            p["in"] + (", required" if p.get("required") else ""),
            f"`{_schema_text(p.get('schema', {}))}`",
            p.get("description", ""),
        )
        for p in op.get("parameters", [])
    ]
    if rows:
        lines += _table(("parameter", "in", "type", "notes"), rows)
    body = op.get("requestBody")
    if body:
        schema = body["content"]["application/json"]["schema"]
        fields = sorted(schema.get("properties", {}).items())
        lines += [str(body.get("description", "")), ""]
        if fields:
            lines += _table(
                ("body field", "type"), [(f"`{k}`", f"`{_schema_text(v)}`") for k, v in fields]
            )
    ok = op.get("responses", {}).get("200", {})
    if ok:
        lines += [f"Answers `200` with `{ok.get('description', '')}`.", ""]
    return lines


@_page("reference/http-routes.md")
def http_page() -> str:
    """Every route of the HTTP API with its parameters, from the OpenAPI document."""
    doc = openapi_document()
    lines = ["# HTTP routes", "", _GENERATED, ""]
    lines += [
        str(doc["info"].get("description", "")),
        "The master serves this document at `/api/v1/openapi.json`; the",
        "[HTTP API](http-api.md) page describes the API as a whole. Every route needs a",
        "session token (`authorization: Bearer ...`) unless it says otherwise.",
        "",
        "Errors, on every route:",
        "",
    ]
    responses = doc["components"].get("responses", {})
    lines += _table(
        ("status", "meaning"),
        [(f"`{code}`", str(r.get("description", ""))) for code, r in sorted(responses.items())],
    )
    groups: dict[str, list[tuple[str, str, Mapping[str, Any]]]] = {}
    for path, ops in doc["paths"].items():
        group = path.removeprefix("/api/v1/").split("/", 1)[0]
        groups.setdefault(group, []).extend((m, path, op) for m, op in ops.items())
    for group, ops in groups.items():
        lines += [f"## {group}", ""]
        for method, path, op in ops:
            lines += _operation_lines(method, path, op)
    lines += ["## Schemas", "", "The messages the routes answer with, as JSON Schema:", ""]
    for name, schema in sorted(doc["components"].get("schemas", {}).items()):
        lines += [f"### `{name}`", "", "```json", json.dumps(schema, indent=2), "```", ""]
    return "\n".join(lines)
