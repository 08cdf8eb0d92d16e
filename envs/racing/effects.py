"""Actuation and sensing effects: latency ring buffers (in physics substeps), action noise, and the unmodeled
actuation effects of the reality proxy (battery sag, servo slew rate and deadband, throttle map, latency jitter)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from envs.errors import check_range


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


@dataclass(frozen=True)
class EffectsConfig:
    """Actuation effects the training sim leaves out by default; the reality proxy turns them on.

    All zero / one = off, so a training env behaves exactly as before unless an experiment asks for them.
    """

    battery_sag_per_minute: float = 0.0
    """speed gain lost per minute of driving (fraction); the charge runs down over a session, not per episode"""
    battery_floor: float = 0.8
    """the speed gain never falls below this"""
    servo_rate_dps: float = 0.0
    """steering servo slew-rate limit (degrees/s); 0 = unlimited"""
    steering_deadband_deg: float = 0.0
    """steering commands smaller than this (degrees) do not move the servo"""
    throttle_exponent: float = 1.0
    """nonlinear throttle map: speed = max_speed * (command / max_speed) ** exponent (1 = linear)"""
    latency_jitter_ms: float = 0.0
    """extra action latency drawn uniformly in [0, x] ms every control step"""
    steering_offset_deg: float = 0.0
    """steering trim error added on top of the randomization (degrees, + = left)"""
    randomize: bool = False
    """training-time randomization: every env draws each effect's strength uniformly between off and the value above
    at every reset (the battery then starts each episode at a charge between the floor and full, and the trim takes a
    random sign)"""

    def __post_init__(self) -> None:
        check_range("effects.battery_sag_per_minute", self.battery_sag_per_minute, 0.0, 1.0)
        check_range("effects.battery_floor", self.battery_floor, 0.1, 1.0)
        check_range("effects.servo_rate_dps", self.servo_rate_dps, 0.0, 5000.0)
        check_range("effects.steering_deadband_deg", self.steering_deadband_deg, 0.0, 10.0)
        check_range("effects.throttle_exponent", self.throttle_exponent, 0.3, 3.0)
        check_range("effects.latency_jitter_ms", self.latency_jitter_ms, 0.0, 200.0)
        check_range("effects.steering_offset_deg", self.steering_offset_deg, -10.0, 10.0)

    @property
    def active(self) -> bool:
        return replace(self, randomize=False) != EffectsConfig()


def jitter_steps(jitter_ms: float, dt_physics: float) -> int:
    """The most whole physics substeps `effects.latency_jitter_ms` adds to a command's latency (rounded)."""
    return int(round(jitter_ms / 1000.0 / dt_physics))


def mean_jitter_ms(jitter_ms: float, dt_physics: float) -> float:
    """The mean extra action latency of `effects.latency_jitter_ms` at full strength (ms): the env draws 0..k whole
    substeps, k = `jitter_steps`, each equally likely."""
    return 0.5 * jitter_steps(jitter_ms, dt_physics) * 1000.0 * dt_physics


class ActuatorEffects:
    """Per-env state of the unmodeled actuation effects (battery charge used, servo position, effect strengths).

    `command` maps a control-step command through deadband, trim, throttle map and battery gain; `latency` adds the
    jitter; `servo` applies the slew-rate limit every physics substep. With `cfg.randomize`, `reset` draws a strength
    in [0, 1] per env and effect (columns: deadband, trim, throttle, jitter, servo, battery).
    """

    def __init__(
        self, cfg: EffectsConfig, num_envs: int, dt_physics: float, max_speed: float, device: torch.device
    ) -> None:
        self.cfg, self.dt_physics, self.max_speed = cfg, dt_physics, max_speed
        self.servo_angle = torch.zeros(num_envs, device=device)
        self.drive_seconds = torch.zeros(num_envs, device=device)  # session time: never reset between episodes
        self.strength = torch.ones(num_envs, 6, device=device)
        self.trim_sign = torch.ones(num_envs, device=device)
        self.jitter_steps = jitter_steps(cfg.latency_jitter_ms, dt_physics)

    def battery_gain(self) -> Tensor:
        if self.cfg.randomize:
            return 1.0 - (1.0 - self.cfg.battery_floor) * self.strength[:, 5]
        sag = self.cfg.battery_sag_per_minute * self.drive_seconds / 60.0
        return (1.0 - sag).clamp(min=self.cfg.battery_floor)

    def command(self, steer: Tensor, speed: Tensor) -> tuple[Tensor, Tensor]:
        cfg, k = self.cfg, self.strength
        deadband = math.radians(cfg.steering_deadband_deg) * k[:, 0]
        steer = torch.where(steer.abs() < deadband, torch.zeros_like(steer), steer)
        steer = steer + math.radians(cfg.steering_offset_deg) * k[:, 1] * self.trim_sign
        if cfg.throttle_exponent != 1.0:
            exponent = 1.0 + (cfg.throttle_exponent - 1.0) * k[:, 2]
            speed = self.max_speed * (speed / self.max_speed).clamp(min=0.0) ** exponent
        return steer, speed

    def latency(self, latency: Tensor, generator: torch.Generator) -> Tensor:
        if self.jitter_steps == 0:
            return latency
        u = torch.rand(latency.shape, generator=generator, device=latency.device)
        extra = torch.floor(u * (self.jitter_steps * self.strength[:, 3] + 1.0)).long()
        return latency + extra

    def servo(self, steer: Tensor) -> Tensor:
        """Move the servo toward `steer` by at most rate * dt this substep; returns the servo angle."""
        if self.cfg.servo_rate_dps <= 0:
            self.servo_angle = steer.clone()
        else:
            step = math.radians(self.cfg.servo_rate_dps) * self.dt_physics / self.strength[:, 4].clamp(min=1e-3)
            self.servo_angle = self.servo_angle + torch.maximum(torch.minimum(steer - self.servo_angle, step), -step)
        self.drive_seconds += self.dt_physics
        return self.servo_angle

    def reset(self, env_ids: Tensor, generator: torch.Generator | None = None) -> None:
        self.servo_angle[env_ids] = 0.0
        if self.cfg.randomize and generator is not None:
            m = env_ids.numel()
            self.strength[env_ids] = torch.rand(m, 6, generator=generator, device=self.strength.device)
            flip = torch.rand(m, generator=generator, device=self.strength.device) < 0.5
            self.trim_sign[env_ids] = torch.where(flip, -1.0, 1.0)

    def new_session(self) -> None:
        """A freshly charged battery (a new evaluation session)."""
        self.drive_seconds.zero_()

    def state_dict(self) -> dict[str, Tensor]:
        names = ("servo_angle", "drive_seconds", "strength", "trim_sign")
        return {name: getattr(self, name).clone() for name in names}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        for name, value in state.items():
            getattr(self, name).copy_(value)
