"""Actuation and sensing effects: latency ring buffers (in physics substeps) and action noise."""

from __future__ import annotations

import torch
from torch import Tensor


class DelayLine:
    """A per-env delay of a `(N, D)` signal by an integer number of substeps (ring buffer of `capacity` slots).

    `push(v)` stores this substep's value; `read(delay)` returns what was pushed `delay[n]` pushes ago (0 = the value
    just pushed). `fill(v, env_ids)` makes the whole history of those envs equal to `v` (used at reset, so a new
    episode never sees the previous one).
    """

    def __init__(self, num_envs: int, dim: int, capacity: int, device: str | torch.device = "cpu") -> None:
        self.capacity = max(1, int(capacity))
        self.buffer = torch.zeros(self.capacity, num_envs, dim, device=device)  # (D_slots, N, dim)
        self.head = 0  # slot of the most recent push
        self._env_index = torch.arange(num_envs, device=device)

    def push(self, value: Tensor) -> None:
        self.head = (self.head + 1) % self.capacity
        self.buffer[self.head] = value

    def read(self, delay: Tensor) -> Tensor:
        """`(N, dim)` values pushed `delay` pushes ago; delays beyond the capacity are clamped."""
        slot = torch.remainder(self.head - delay.clamp(0, self.capacity - 1), self.capacity)
        return self.buffer[slot, self._env_index]

    def fill(self, value: Tensor, env_ids: Tensor) -> None:
        """Set the whole history of `env_ids` to `value` (`(M, dim)`)."""
        self.buffer[:, env_ids] = value.unsqueeze(0).to(self.buffer.dtype)


def action_noise(
    steer: Tensor, speed: Tensor, scale: Tensor, max_steering: float, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """Uniform noise on the executed action: steering ± scale * max steering, speed × (1 ± scale).

    The DeepRacer team trained with up to 10% action noise; `scale` is per env `(N,)`.
    """
    u = torch.rand(2, steer.shape[0], generator=generator, device=steer.device) * 2.0 - 1.0
    noisy_steer = (steer + u[0] * scale * max_steering).clamp(-max_steering, max_steering)
    return noisy_steer, speed * (1.0 + u[1] * scale)
