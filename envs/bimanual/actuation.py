"""Actuation effects of real arms that the training sim leaves out, as pure tensor functions the controller applies.

- Backlash (gear play): a joint's target follows the commanded one only once the command has crossed the play; on
  a reversal it stays put until the command has travelled the play's full width (the play operator).
- Deadband: a joint's target moves only when the command differs from it by more than the band.
- Latency jitter: each command arrives after the env's latency plus a random extra delay, drawn per command.
- Dropped commands: a command lost on the way; the actuators hold the previous one.

Each is the identity at zero strength (zero play, band, jitter or drop probability), and draws no random numbers then.
"""

from __future__ import annotations

import torch
from torch import Tensor


def backlash(command: Tensor, output: Tensor, width: float) -> Tensor:
    """The play operator: the output `(...)` moves only as far as keeps it within `width / 2` of the command."""
    half = 0.5 * width
    return torch.minimum(torch.maximum(output, command - half), command + half)


def deadband(command: Tensor, output: Tensor, band: float) -> Tensor:
    """The output `(...)` jumps to the command where they differ by more than `band`, and holds elsewhere."""
    return torch.where((command - output).abs() > band, command, output)


def wrist_element(command: Tensor, output: Tensor, width: float, band: float) -> Tensor:
    """A wrist joint's target `(...)` from the commanded one and its last value: through the gear's play, then the
    servo's deadband."""
    return deadband(backlash(command, output, width), output, band)


def jittered_delay(base: Tensor, jitter: int, generator: torch.Generator | None) -> Tensor:
    """`(N,)` delays of this step's commands: each env's `base` delay plus a uniform extra in [0, `jitter`]."""
    if jitter == 0:
        return base.clone()
    return base + torch.randint(0, jitter + 1, base.shape, generator=generator)


def dropped(num_envs: int, prob: float, generator: torch.Generator | None) -> Tensor:
    """`(N,)` bool: which envs lose this step's command (each with probability `prob`)."""
    if prob == 0.0:
        return torch.zeros(num_envs, dtype=torch.bool)
    return torch.rand(num_envs, generator=generator) < prob


def hold_dropped(command: Tensor, previous: Tensor, drop: Tensor) -> Tensor:
    """`(N, D)` commands that reach the actuators: the previous one `(N, D)` where `drop` `(N,)` lost the new one."""
    return torch.where(drop[:, None], previous, command)
