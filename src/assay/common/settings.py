"""The daemons' settings (`assay-master`, `assay-agent`), each key defined once.

A daemon's settings are a frozen dataclass whose fields are made by `setting()`: the field
carries its default, the values it accepts and its help. Everything else comes from that
one definition: the validation of the YAML file, the ASSAY_* environment variables, the
command-line flags, and the reference that `--help-config` prints. A value is taken from
the first of: the flag, the environment variable, the file, the default.
"""

from __future__ import annotations

import abc
import dataclasses
import difflib
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import yaml

from assay.errors import AssayError

if TYPE_CHECKING:
    import click

_T = TypeVar("_T")
_F = TypeVar("_F", bound=Callable[..., Any])
_KEY = "assay.setting"


class SettingsError(AssayError):
    """A daemon's settings are invalid: the message names the key, where it came from,
    and what it accepts."""


# --- kinds of values --------------------------------------------------------------------


class Kind(abc.ABC):
    """What a key accepts. `parse` takes a YAML value or an environment/flag string and
    returns the typed value, or raises ValueError."""

    @property
    @abc.abstractmethod
    def accepts(self) -> str:
        """What the key takes, for messages and the reference: "an integer, at least 1"."""

    @property
    def metavar(self) -> str:
        return "VALUE"

    @abc.abstractmethod
    def parse(self, value: object) -> object: ...


@dataclass(frozen=True)
class Integer(Kind):
    minimum: int | None = None
    maximum: int | None = None

    @property
    def accepts(self) -> str:
        if self.minimum is not None and self.maximum is not None:
            return f"an integer from {self.minimum} to {self.maximum}"
        if self.minimum is not None:
            return f"an integer, at least {self.minimum}"
        return "an integer"

    @property
    def metavar(self) -> str:
        return "INTEGER"

    def parse(self, value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise ValueError
        number = int(value)  # ValueError for text that is not an integer
        if self.minimum is not None and number < self.minimum:
            raise ValueError
        if self.maximum is not None and number > self.maximum:
            raise ValueError
        return number


@dataclass(frozen=True)
class Seconds(Kind):
    """A duration in seconds (a float): `positive` refuses 0, otherwise 0 is the least."""

    positive: bool = True

    @property
    def accepts(self) -> str:
        return f"a number of seconds, {'more than 0' if self.positive else '0 or more'}"

    @property
    def metavar(self) -> str:
        return "SECONDS"

    def parse(self, value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise ValueError
        number = float(value)
        if not number >= 0 or (self.positive and number == 0):  # NaN fails `>= 0` too
            raise ValueError
        return number


@dataclass(frozen=True)
class Boolean(Kind):
    @property
    def accepts(self) -> str:
        return "true or false"

    def parse(self, value: object) -> bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise ValueError


@dataclass(frozen=True)
class Text(Kind):
    """A string; `form` says what it holds in messages and the reference (HOST:PORT)."""

    form: str = "a string"
    shape: str = "TEXT"

    @property
    def accepts(self) -> str:
        return self.form

    @property
    def metavar(self) -> str:
        return self.shape

    def parse(self, value: object) -> str:
        # Not a number turned back into text: YAML reads `join_token: 0123` as 83.
        if not isinstance(value, str):
            raise ValueError
        return value


def _path(value: object) -> Path:
    if not isinstance(value, str | Path) or not str(value):
        raise ValueError
    return Path(value).expanduser()


@dataclass(frozen=True)
class Directory(Kind):
    @property
    def accepts(self) -> str:
        return "a directory path"

    @property
    def metavar(self) -> str:
        return "DIR"

    def parse(self, value: object) -> Path:
        return _path(value)


@dataclass(frozen=True)
class FilePath(Kind):
    """A path to a file (whether it can be read or written is checked where it is used);
    `form` says what it holds in messages and the reference."""

    form: str = "a file path"

    @property
    def accepts(self) -> str:
        return self.form

    @property
    def metavar(self) -> str:
        return "FILE"

    def parse(self, value: object) -> Path:
        return _path(value)


@dataclass(frozen=True)
class Choice(Kind):
    values: tuple[str, ...]

    @property
    def accepts(self) -> str:
        return "one of " + ", ".join(self.values)

    @property
    def metavar(self) -> str:
        return "[" + "|".join(self.values) + "]"

    def parse(self, value: object) -> str:
        if not isinstance(value, str):
            raise ValueError
        match = [v for v in self.values if v.lower() == value.strip().lower()]
        if not match:
            raise ValueError
        return match[0]


# --- the definition of a key ------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    """One key: its name in the file, its variable, its flag, what it takes and why."""

    name: str
    kind: Kind
    help: str
    default: object
    default_text: str | None
    env: str
    required: bool
    secret: bool

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def describe_default(self) -> str:
        if self.default_text is not None:
            return self.default_text
        if self.default is None:
            return "none"
        return _yaml_scalar(self.default)


@dataclass(frozen=True)
class _Spec:
    kind: Kind
    help: str
    default_text: str | None
    env: str | None
    required: bool
    secret: bool


def setting(
    default: object = None,
    *,
    kind: Kind,
    help: str,
    factory: Callable[[], object] | None = None,
    default_text: str | None = None,
    env: str | None = None,
    required: bool = False,
    secret: bool = False,
) -> Any:
    """A dataclass field that is also a settings key. `env` defaults to ASSAY_<NAME>;
    `default_text` says in words what the default is where the value cannot (None, or a
    `factory`); `secret` values are hidden in messages and printed settings."""
    metadata = {_KEY: _Spec(kind, help, default_text, env, required, secret)}
    if required:  # no default: the dataclass takes it as an argument
        return dataclasses.field(metadata=metadata)
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def settings_of(cls: type[Any]) -> list[Setting]:
    """The keys of a settings dataclass, in the order they are declared."""
    out = []
    for f in dataclasses.fields(cls):
        spec = f.metadata.get(_KEY)
        if not isinstance(spec, _Spec):
            continue
        default: object = None if f.default is dataclasses.MISSING else f.default
        out.append(
            Setting(
                name=f.name,
                kind=spec.kind,
                help=spec.help,
                default=default,
                default_text=spec.default_text,
                env=spec.env or "ASSAY_" + f.name.upper(),
                required=spec.required,
                secret=spec.secret,
            )
        )
    return out


# --- loading ----------------------------------------------------------------------------


def load_settings(
    cls: type[_T],
    *,
    file: Path | None,
    flags: Mapping[str, object],
    env: Mapping[str, str],
) -> _T:
    """Merge defaults < file < environment < flags into `cls`; raise `SettingsError` for
    an unreadable file, an unknown key, a value of the wrong kind or a missing key."""
    keys = {s.name: s for s in settings_of(cls)}
    values: dict[str, object] = {}
    if file is not None:
        for key, value in _read(file).items():
            if key not in keys:
                raise SettingsError(_unknown(key, f"in {file}", keys))
            if value is not None:  # `key:` or `key: null` leaves the default
                values[key] = _parse(keys[key], value, f"{key} in {file}")
    for s in keys.values():
        text = env.get(s.env, "")
        if text != "":
            values[s.name] = _parse(s, text, f"{s.env} in the environment")
    for key, value in flags.items():
        if value is not None:
            values[key] = _parse(keys[key], value, keys[key].flag)
    for s in keys.values():
        if s.required and s.name not in values:
            where = f"in {file}" if file is not None else "in the config file (--config)"
            raise SettingsError(f"{s.name} is not set: set it {where}, {s.env} or {s.flag}")
    return cls(**values)


def _read(file: Path) -> Mapping[str, object]:
    try:
        data = yaml.safe_load(file.read_text())
    except OSError as e:
        raise SettingsError(f"cannot read {file}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise SettingsError(f"{file} is not valid YAML: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, Mapping) or not all(isinstance(k, str) for k in data):
        raise SettingsError(f"{file} must be a mapping of keys to values (key: value lines)")
    return data


def _unknown(key: str, where: str, keys: Mapping[str, Setting]) -> str:
    close = difflib.get_close_matches(key, keys, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown key {key!r} {where}{hint}; known keys: {', '.join(keys)}"


def _parse(s: Setting, value: object, where: str) -> object:
    try:
        return s.kind.parse(value)
    except ValueError:
        shown = "<hidden>" if s.secret else repr(value)
        hint = ""
        if isinstance(s.kind, Text) and isinstance(value, int | float):
            hint = " (YAML read a number: put the value in quotes)"
        raise SettingsError(f"{where}: expected {s.kind.accepts}, got {shown}{hint}") from None


# --- what a user reads ------------------------------------------------------------------


def reference(cls: type[Any], *, program: str, path: str) -> str:
    """Every key with what it accepts, its default, its variable and its flag, as a YAML
    file whose lines are all comments (so it can start a config file)."""
    lines = [
        f"# {program} settings: {path}, or the file given with --config.",
        "# A value comes from the first of: the command-line flag, the ASSAY_* environment",
        "# variable, this file, the default. Unknown keys and values of the wrong kind stop",
        f"# {program} at start with a message that names them.",
    ]
    for s in settings_of(cls):
        title = f"{s.name} (required)" if s.required else s.name
        default = "" if s.required else f" Default: {s.describe_default()}."
        facts = f"Accepts {s.kind.accepts}.{default} Environment: {s.env}. Flag: {s.flag}."
        lines.append("")
        lines += textwrap.wrap(
            f"{title}: {s.help}", 88, initial_indent="# ", subsequent_indent="#   "
        )
        lines += textwrap.wrap(facts, 88, initial_indent="#   ", subsequent_indent="#   ")
        shown = "" if s.default is None else " " + _yaml_scalar(s.default)
        lines.append(f"#{s.name}:{shown}")
    return "\n".join(lines) + "\n"


def effective(config: object) -> str:
    """The merged settings as YAML, secrets hidden (for `--check-config`)."""
    data: dict[str, object] = {}
    for s in settings_of(type(config)):
        value = getattr(config, s.name)
        if s.secret and value is not None:
            value = "<hidden>"
        data[s.name] = str(value) if isinstance(value, Path) else value
    return yaml.safe_dump(data, sort_keys=False)


def _yaml_scalar(value: object) -> str:
    plain = str(value) if isinstance(value, Path) else value
    return yaml.safe_dump(plain, default_flow_style=True).splitlines()[0].removesuffix(" ...")


def click_options(cls: type[Any]) -> Callable[[_F], _F]:
    """One option per key (value None when not given, so lower layers show through).
    click is imported here, not with the module: the SDK reads TLS settings through this
    module and never loads click."""
    import click

    def decorate(command: _F) -> _F:
        for s in reversed(settings_of(cls)):
            default = "required" if s.required else f"default: {s.describe_default()}"
            text = f"{s.help} [{default}; env {s.env}]"
            if isinstance(s.kind, Boolean):
                decl = f"{s.flag}/--no-{s.flag[2:]}"
                command = click.option(decl, s.name, default=None, help=text)(command)
            else:
                command = click.option(
                    s.flag, s.name, metavar=s.kind.metavar, default=None, help=text
                )(command)
        return command

    return decorate


def help_config_option(cls: type[Any], *, program: str, path: str) -> Callable[[_F], _F]:
    """`--help-config`: print `reference()` and exit."""
    import click

    def show(ctx: click.Context, param: click.Parameter, value: bool) -> None:
        if value and not ctx.resilient_parsing:
            click.echo(reference(cls, program=program, path=path), nl=False)
            ctx.exit()

    return click.option(
        "--help-config",
        is_flag=True,
        expose_value=False,
        is_eager=True,
        callback=show,
        help=f"Show every key of {path} with its default, and exit.",
    )


__all__ = [
    "Boolean",
    "Choice",
    "Directory",
    "Integer",
    "Kind",
    "Seconds",
    "Setting",
    "SettingsError",
    "Text",
    "click_options",
    "effective",
    "help_config_option",
    "load_settings",
    "reference",
    "setting",
    "settings_of",
]
