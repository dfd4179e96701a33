"""Strict configuration: dataclasses filled from YAML recipes, CLI flags and `a.b=value` overrides.

Every config is a dataclass whose fields carry a one-line docstring right below them
(litgpt style); those docstrings become `--help`. Unknown keys are errors that suggest the
closest valid key, and values are checked against the field's type.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import inspect
import textwrap
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

import yaml

from draftsmith.errors import DraftsmithError

T = TypeVar("T")


# --------------------------------------------------------------------------- field docs
def field_docs(cls: type) -> dict[str, str]:
    """Docstrings written directly below each field of a dataclass (and its bases)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        body = ast.parse(source).body[0].body
        for node, following in zip(body, body[1:]):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                docs[node.target.id] = " ".join(following.value.value.split())
    return docs


def type_name(hint: Any) -> str:
    """A short human name for a type hint, e.g. `int`, `list[int]`, `one of 'a', 'b'`."""
    origin = get_origin(hint)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(hint))
    if origin in (Union, types.UnionType):
        names = [type_name(a) for a in get_args(hint) if a is not type(None)]
        optional = type(None) in get_args(hint)
        return " or ".join(names) + (" or null" if optional else "")
    if origin is not None:
        return f"{origin.__name__}[{', '.join(type_name(a) for a in get_args(hint))}]"
    return getattr(hint, "__name__", str(hint))


# --------------------------------------------------------------------------- building
def _type_error(key: str, hint: Any, value: Any) -> DraftsmithError:
    return DraftsmithError(
        f"Config key '{key}' expects {type_name(hint)}, but got {value!r} "
        f"({type(value).__name__})."
    )


def coerce(value: Any, hint: Any, key: str) -> Any:
    """Check `value` against `hint`, converting only where it is lossless (int -> float)."""
    origin = get_origin(hint)
    if hint is Any:
        return value
    if dataclasses.is_dataclass(hint):
        if isinstance(value, hint):
            return value
        if not isinstance(value, dict):
            raise _type_error(key, hint, value)
        return build(hint, value, prefix=key + ".")
    if origin in (Union, types.UnionType):
        args = get_args(hint)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return coerce(value, arg, key)
            except DraftsmithError:
                pass
        raise _type_error(key, hint, value)
    if origin is Literal:
        if value not in get_args(hint):
            raise _type_error(key, hint, value)
        return value
    if origin in (list, tuple):
        if isinstance(value, (str, int, float)) and not isinstance(value, bool) and origin is list:
            value = [value]  # `layers=3` on the command line means `[3]`
        if not isinstance(value, (list, tuple)):
            raise _type_error(key, hint, value)
        (item_hint, *_) = get_args(hint) or (Any,)
        items = [coerce(v, item_hint, f"{key}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise _type_error(key, hint, value)
        return dict(value)
    if hint is bool:
        if not isinstance(value, bool):
            raise _type_error(key, hint, value)
        return value
    if hint is float:
        if isinstance(value, str):  # YAML reads `3e-4` (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                raise _type_error(key, hint, value) from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _type_error(key, hint, value)
        return float(value)
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _type_error(key, hint, value)
        return value
    if hint is str:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)  # `target=0.5b` style names parsed by YAML as numbers
        if not isinstance(value, str):
            raise _type_error(key, hint, value)
        return value
    if hint is Path:
        return Path(coerce(value, str, key))
    if isinstance(hint, type) and not isinstance(value, hint):
        raise _type_error(key, hint, value)
    return value


def unknown_key_error(key: str, valid: list[str], prefix: str = "") -> DraftsmithError:
    """An error for an unknown key that suggests the closest valid one."""
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    hint = f" Did you mean '{prefix}{close[0]}'?" if close else ""
    return DraftsmithError(
        f"Unknown config key '{prefix}{key}'.{hint} Valid keys here: {', '.join(sorted(valid))}."
    )


def build(cls: type[T], data: dict[str, Any] | None, prefix: str = "") -> T:
    """Instantiate dataclass `cls` from a dict, rejecting unknown keys and wrong types."""
    data = dict(data or {})
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for key in data:
        if key not in fields:
            raise unknown_key_error(key, list(fields), prefix)
    kwargs = {name: coerce(value, hints[name], prefix + name) for name, value in data.items()}
    try:
        instance = cls(**kwargs)
    except TypeError as err:  # a required field left out
        raise DraftsmithError(f"Config section '{prefix or cls.__name__}': {err}.") from err
    check = getattr(instance, "validate", None)
    if callable(check):
        check()
    return instance


# --------------------------------------------------------------------------- recipes and overrides
def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """`["train.max_steps=5", "output_dir=x"]` -> nested dict, values parsed as YAML scalars."""
    nested: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise DraftsmithError(
                f"Override '{item}' is not of the form section.field=value "
                "(for example train.max_steps=100)."
            )
        dotted, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        node = nested
        *parents, leaf = dotted.strip().split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise DraftsmithError(f"Override '{item}' sets a field inside a non-section.")
        node[leaf] = value
    return nested


def merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge `update` into a copy of `base`."""
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML recipe; errors name the file and line."""
    path = Path(path)
    if not path.is_file():
        raise DraftsmithError(f"Recipe file '{path}' does not exist. Check the path.")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise DraftsmithError(f"Recipe {where} is not valid YAML: {err}") from err
    if not isinstance(data, dict):
        raise DraftsmithError(f"Recipe '{path}' must be a mapping of sections, not {type(data).__name__}.")
    return data


def load(cls: type[T], recipe: str | Path | None = None, overrides: list[str] = ()) -> T:
    """Build `cls` from an optional YAML recipe plus `a.b=value` overrides (overrides win)."""
    data = read_yaml(recipe) if recipe else {}
    data = merge(data, parse_overrides(list(overrides)))
    where = f" (recipe {recipe})" if recipe else ""
    try:
        return build(cls, data)
    except DraftsmithError as err:
        raise DraftsmithError(f"{err}{where}") from None


def to_dict(config: Any) -> dict[str, Any]:
    """A plain dict (paths as strings) suitable for YAML/JSON and trackers."""

    def plain(value: Any) -> Any:
        if isinstance(value, Path):
            return str(value)
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value

    return plain(dataclasses.asdict(config))


# --------------------------------------------------------------------------- help and flags
def _default_text(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return repr(f.default)
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
        return "(section)" if dataclasses.is_dataclass(value) else repr(value)
    return "required"


def describe(cls: type, prefix: str = "") -> list[str]:
    """One line per field, nested sections flattened as `section.field`, for `--help`."""
    lines = []
    docs = field_docs(cls)
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            lines.append(f"{prefix}{f.name}: {docs.get(f.name, '')}")
            lines.extend(describe(hint, prefix=f"{prefix}{f.name}."))
            continue
        lines.append(
            f"  {prefix}{f.name} ({type_name(hint)}, default {_default_text(f)}): {docs.get(f.name, '')}"
        )
    return lines


def add_arguments(parser: argparse.ArgumentParser, cls: type, positional: tuple[str, ...] = ()) -> None:
    """Add one `--field-name` flag per top-level field of `cls`, help text from its docstring."""
    docs = field_docs(cls)
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            continue
        help_text = f"{docs.get(f.name, '')} [{type_name(hint)}; default {_default_text(f)}]"
        help_text = help_text.replace("%", "%%")
        if f.name in positional:
            parser.add_argument(f.name, help=help_text, nargs="?" if _default_text(f) != "required" else None,
                                default=argparse.SUPPRESS)
            continue
        flag = "--" + f.name.replace("_", "-")
        if hint is bool:
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction,
                                default=argparse.SUPPRESS, help=help_text)
        else:
            nargs = "+" if get_origin(hint) is list else None
            parser.add_argument(flag, dest=f.name, default=argparse.SUPPRESS, nargs=nargs,
                                metavar=f.name.upper(), help=help_text)


def add_command(subparsers: argparse._SubParsersAction, name: str, config: type | None = None, *, summary: str,
                description: str | None = None, **options: Any) -> argparse.ArgumentParser:
    """A subcommand's parser: `summary` is its line in the parent's --help, `description` opens its own; with
    `config`, one flag per field of that dataclass (`add_arguments`). `options` go to argparse's add_parser."""
    parser = subparsers.add_parser(name, help=summary, description=description, **options)
    if config is not None:
        add_arguments(parser, config)
    return parser


def from_flags(cls: type[T], namespace: argparse.Namespace, overrides: list[str] = (),
               recipe: str | Path | None = None) -> T:
    """Build `cls` from parsed flags (strings parsed as YAML scalars), a recipe and overrides."""
    hints = get_type_hints(cls)
    data = read_yaml(recipe) if recipe else {}
    flags: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if not hasattr(namespace, f.name):
            continue
        raw = getattr(namespace, f.name)
        flags[f.name] = _parse_flag(raw, hints[f.name])
    data = merge(merge(data, flags), parse_overrides(list(overrides)))
    return build(cls, data)


def _parse_flag(raw: Any, hint: Any) -> Any:
    if isinstance(raw, list):
        return [_parse_flag(r, typing.Any) for r in raw]
    if not isinstance(raw, str):
        return raw
    if hint is str or (get_origin(hint) in (Union, types.UnionType) and str in get_args(hint)):
        return raw
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw
