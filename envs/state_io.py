"""Helpers for an env's `state_dict` / `load_state_dict`: flat dicts of tensors and ints, checked before restoring.

An env lists its own mutable state (its buffers, the tensor fields of its dataclasses, its RNG); these helpers flatten
dataclasses of tensors under a prefix and refuse a saved state that is missing an entry or has one of another shape,
naming it, before anything is changed.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from envs.errors import ConfigError


def dataclass_state(prefix: str, obj: Any) -> dict[str, Tensor]:
    """Every tensor field of a dataclass instance, cloned, as `{prefix.field: tensor}`."""
    return {f"{prefix}.{name}": getattr(obj, name).clone() for name in obj.__dataclass_fields__}


def load_dataclass_state(prefix: str, obj: Any, state: dict[str, Any]) -> None:
    """Copy `dataclass_state` output back into the dataclass's tensors, in place."""
    for name in obj.__dataclass_fields__:
        getattr(obj, name).copy_(state[f"{prefix}.{name}"])


def substate(prefix: str, state: dict[str, Any]) -> dict[str, Any]:
    """The entries under `prefix.`, the prefix removed (the state of a part that has its own `load_state_dict`)."""
    return {k[len(prefix) + 1 :]: v for k, v in state.items() if k.startswith(prefix + ".")}


def check_state(mine: dict[str, Any], state: dict[str, Any]) -> None:
    """Refuse a saved state that lacks an entry of `mine` (the env's current state) or holds a tensor of another
    shape, naming the entry."""
    missing = set(mine) - set(state)
    if missing:
        raise ConfigError(f"env state is missing {sorted(missing)[:5]} (saved by a different env configuration?)")
    for key, value in state.items():
        ref = mine.get(key)
        if isinstance(ref, Tensor) and (not isinstance(value, Tensor) or value.shape != ref.shape):
            raise ConfigError(f"env state {key!r} has shape {getattr(value, 'shape', None)}, expected {ref.shape}")
