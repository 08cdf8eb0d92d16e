"""Optional torch.compile of hot pure functions, with a fallback to eager where no compiler toolchain exists."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TypeVar

import torch

F = TypeVar("F", bound=Callable)


def maybe_compile(fn: F, enabled: bool, fallback: Callable | None = None) -> F:
    """`torch.compile(fn)` with static shapes when `enabled`; if the backend cannot build (e.g. no C++ compiler),
    warn once and run eagerly (`fallback` if given: an eager equivalent of `fn` with the same arguments, for when the
    fused form of `fn` is slow uncompiled). Callers keep shapes fixed per call site, so each compiles once."""
    eager = fallback or fn
    if not enabled:
        return eager
    compiled = torch.compile(fn, dynamic=False)
    current: list[Callable] = [compiled]

    def call(*args, **kwargs):
        try:
            return current[0](*args, **kwargs)
        except torch._dynamo.exc.BackendCompilerFailed as err:  # missing toolchain, unsupported platform
            warnings.warn(
                f"torch.compile unavailable ({err.__class__.__name__}); running {fn.__name__} eagerly", stacklevel=2
            )
            current[0] = eager
            return eager(*args, **kwargs)

    return call  # type: ignore[return-value]
