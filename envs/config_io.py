"""Frozen dataclass configs <-> plain dicts / YAML text, for checkpoints and run directories (no pickling)."""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

from envs.errors import ConfigError

T = TypeVar("T")


def to_dict(cfg: Any) -> Any:
    """A dataclass tree as nested dicts/lists of primitives."""
    if dataclasses.is_dataclass(cfg):
        return {f.name: to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, (tuple, list)):
        return [to_dict(v) for v in cfg]
    return cfg


def to_yaml(cfg: Any) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def _convert(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, where)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(arg, value, where)
            except (ConfigError, TypeError, ValueError):
                continue
        raise ConfigError(f"{where}: {value!r} matches none of {args}")
    if origin is typing.Literal:
        if value not in typing.get_args(tp):
            raise ConfigError(f"{where}: {value!r} is not one of {typing.get_args(tp)}")
        return value
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v, where) for v in value)
        return tuple(_convert(a, v, where) for a, v in zip(args, value, strict=True))
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if tp in (int, str, bool) and not isinstance(value, tp):
        raise ConfigError(f"{where}: expected {tp.__name__}, got {value!r}")
    return value


def from_dict(cls: type[T], data: Any, where: str = "config") -> T:
    """Rebuild a (nested) dataclass from `to_dict` output; unknown keys are errors, missing keys take defaults."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = set(data) - names
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)}")
    kwargs = {k: _convert(hints[k], v, f"{where}.{k}") for k, v in data.items()}
    return cls(**kwargs)


def from_yaml(cls: type[T], text: str, where: str = "config") -> T:
    return from_dict(cls, yaml.safe_load(text), where)


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write `text` to `path` through a temporary file in the same directory, fsynced, then an atomic rename: a
    reader (or a process killed mid-write) sees the old file or the new one, never a part."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def with_variant(cfg: T, variant: Mapping[str, Any]) -> T:
    """`cfg` with a named variant's values (`dotted.field -> value`) in every field still at its class default, so an
    explicit setting always wins over the variant's."""
    default, out = type(cfg)(), cfg
    for key, value in variant.items():
        if get_dotted(cfg, key) == get_dotted(default, key):
            out = set_dotted(out, key, value)
    return out


def get_dotted(obj: Any, dotted: str) -> Any:
    """The field `a.b.c` of a dataclass tree."""
    for name in dotted.split("."):
        obj = getattr(obj, name)
    return obj


def set_dotted(obj: Any, dotted: str, value: Any) -> Any:
    """A copy of a frozen dataclass tree with the field `a.b.c` set to `value`."""
    head, _, rest = dotted.partition(".")
    if not rest:
        return dataclasses.replace(obj, **{head: value})
    return dataclasses.replace(obj, **{head: set_dotted(getattr(obj, head), rest, value)})
