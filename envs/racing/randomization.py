"""Domain randomization: per-env sampling at reset, every switch independent, every range settable.

The `env_factors` observation normalizes each sampled factor with fixed bounds (`FACTOR_BOUNDS`), not with the
configured ranges, so a factor means the same thing to a policy whatever ranges an experiment trains with.

The car's maximum-speed setting (the DeepRacer console's) is drawn here too when randomized, but it is no env factor:
it is the operator's choice at the car, applied after the policy, and `FACTOR_NAMES` is the fixed layout every saved
teacher's factor encoder was built for. A teacher sees its effect as a student does, in the speed the car reaches for
the command it chose.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

import torch
from torch import Tensor

from envs.errors import ConfigError, check_interval, check_range
from envs.racing.car import MAX_SPEED_PERCENT_RANGE
from envs.racing.physics_bicycle import CarParams


@dataclass(frozen=True)
class RandomizationConfig:
    """What is randomized per episode. Each switch is independent; off means the nominal value."""

    friction: bool = True
    """randomize tire-ground friction"""
    friction_range: tuple[float, float] = (0.7, 1.2)
    """friction coefficient range (nominal 1.0)"""
    friction_low_share: float = 0.0
    """share of draws taken from the lowest third of `friction_range` instead of all of it (0: uniform): more
    low-grip worlds where a policy fails most, e.g. in a student's DAgger collection (`--dagger.low-grip-share`)"""
    mass: bool = True
    """randomize the car's mass (and yaw inertia with it)"""
    mass_range: tuple[float, float] = (0.85, 1.2)
    """mass scale range"""
    motor_gain: bool = True
    """randomize the speed reached per speed command"""
    motor_gain_range: tuple[float, float] = (0.85, 1.1)
    """motor gain range"""
    max_speed_percent: bool = False
    """draw the car's maximum-speed setting (%, as on the DeepRacer device console) per env at reset from
    `max_speed_percent_range` instead of driving at the fixed `env.max_speed_percent`: one policy for every console
    setting. It scales the speed command at the car, after the policy, as on the car: the previous-action input keeps
    the command the policy chose, and no env factor carries the setting. It stays for the whole episode
    (`redraw_seconds` leaves it); evaluations drive at the fixed `env.max_speed_percent`"""
    max_speed_percent_range: tuple[float, float] = (70.0, 100.0)
    """maximum-speed setting range (%)"""
    steering_gain: bool = True
    """randomize the steering angle reached per command"""
    steering_gain_range: tuple[float, float] = (0.85, 1.1)
    """steering gain range"""
    steering_offset: bool = True
    """randomize a constant steering trim error"""
    steering_offset_deg: float = 2.0
    """steering offset is uniform in [-x, x] degrees"""
    rear_grip: bool = False
    """randomize the balance of grip between the axles (bicycle physics): with less grip at the rear the car
    oversteers and spins beyond its limit, as the contact-wheel car does, instead of the front washing out"""
    rear_grip_range: tuple[float, float] = (0.7, 1.05)
    """rear-axle friction relative to the front's"""
    action_latency: bool = True
    """randomize the delay from action to actuators"""
    action_latency_ms: tuple[float, float] = (0.0, 100.0)
    """action latency range (ms), rounded to physics substeps"""
    nominal_action_latency_ms: float = 33.3
    """action latency when not randomized (ms)"""
    camera_latency: bool = True
    """randomize the age of the camera frame the car sees"""
    camera_latency_ms: tuple[float, float] = (0.0, 67.0)
    """camera latency range (ms), rounded to physics substeps"""
    nominal_camera_latency_ms: float = 33.3
    """camera latency when not randomized (ms)"""
    action_noise: bool = True
    """add noise to every executed action"""
    action_noise_max: float = 0.1
    """per-env noise scale is uniform in [0, x]: steering noise ±x * max steering, speed noise ±x * speed"""
    redraw_seconds: float = 0.0
    """re-draw the car's dynamics (friction, mass, motor and steering gain, steering trim, grip balance) and both
    latencies every this many seconds of an episode, each from its range above (0: once per episode, at reset).
    Worlds that change mid-episode teach a history encoder to follow a change (the mid-episode shift test) rather
    than read the factors from the start of an episode, and show it several worlds per episode"""
    direction: Literal["forward", "reverse", "alternate", "random"] = "alternate"
    """travel direction per episode: fixed, alternating every episode, or a coin flip"""
    random_start: bool = True
    """start anywhere on the loop (off: start points from the env config)"""
    start_offset_frac: float = 0.3
    """random lateral start offset, as a fraction of the half width"""
    start_heading_deg: float = 10.0
    """random start heading error (degrees)"""
    visual: bool = True
    """randomize track, line, ground, wall and background luma, and overall brightness"""
    brightness_range: tuple[float, float] = (0.7, 1.3)
    """overall brightness gain"""
    color_jitter: float = 0.25
    """per-material luma jitter (fraction of the nominal value)"""

    def __post_init__(self) -> None:
        check_interval("randomization.friction_range", self.friction_range, 0.05, 3.0)
        check_range("randomization.friction_low_share", self.friction_low_share, 0.0, 1.0)
        check_interval("randomization.mass_range", self.mass_range, 0.2, 5.0)
        check_interval("randomization.motor_gain_range", self.motor_gain_range, 0.2, 2.0)
        check_interval("randomization.max_speed_percent_range", self.max_speed_percent_range, *MAX_SPEED_PERCENT_RANGE)
        check_interval("randomization.steering_gain_range", self.steering_gain_range, 0.2, 2.0)
        check_range("randomization.steering_offset_deg", self.steering_offset_deg, 0.0, 15.0)
        check_interval("randomization.rear_grip_range", self.rear_grip_range, 0.3, 2.0)
        check_interval("randomization.action_latency_ms", self.action_latency_ms, 0.0, 500.0)
        check_interval("randomization.camera_latency_ms", self.camera_latency_ms, 0.0, 500.0)
        check_range("randomization.nominal_action_latency_ms", self.nominal_action_latency_ms, 0.0, 500.0)
        check_range("randomization.nominal_camera_latency_ms", self.nominal_camera_latency_ms, 0.0, 500.0)
        check_range("randomization.action_noise_max", self.action_noise_max, 0.0, 0.5)
        check_range("randomization.start_offset_frac", self.start_offset_frac, 0.0, 0.9)
        check_range("randomization.start_heading_deg", self.start_heading_deg, 0.0, 45.0)
        check_interval("randomization.brightness_range", self.brightness_range, 0.1, 3.0)
        check_range("randomization.color_jitter", self.color_jitter, 0.0, 0.9)
        check_range("randomization.redraw_seconds", self.redraw_seconds, 0.0, 3600.0)
        if self.direction not in ("forward", "reverse", "alternate", "random"):
            raise ConfigError(f"randomization.direction={self.direction!r}; use forward, reverse, alternate or random")

    def max_latency_ms(self) -> float:
        a = self.action_latency_ms[1] if self.action_latency else self.nominal_action_latency_ms
        c = self.camera_latency_ms[1] if self.camera_latency else self.nominal_camera_latency_ms
        return max(a, c)


FACTOR_NAMES = (
    "friction",
    "mass_scale",
    "motor_gain",
    "steering_gain",
    "steering_offset",
    "action_latency",
    "camera_latency",
    "action_noise",
    "battery",
)
FACTOR_BOUNDS: dict[str, tuple[float, float]] = {
    "friction": (0.3, 1.5),
    "mass_scale": (0.5, 1.5),
    "motor_gain": (0.5, 1.5),
    "steering_gain": (0.5, 1.5),
    "steering_offset": (-math.radians(10.0), math.radians(10.0)),
    "action_latency": (0.0, 0.2),  # seconds
    "camera_latency": (0.0, 0.2),  # seconds
    "action_noise": (0.0, 0.2),
    "battery": (0.5, 1.0),
}
"""fixed normalization bounds: each factor maps linearly onto [-1, 1]"""


def uniform(low: float, high: float, n: int, generator: torch.Generator, device: torch.device) -> Tensor:
    return low + (high - low) * torch.rand(n, generator=generator, device=device)


@dataclass
class WorldSample:
    """Everything the randomization draws for N envs at reset (tensors `(N,)`)."""

    params: CarParams
    action_latency: Tensor  # long, substeps
    camera_latency: Tensor  # long, substeps
    action_noise: Tensor  # noise scale
    battery: Tensor  # speed gain of the battery (1 = full; the training sim keeps it at 1)
    max_speed_percent: Tensor  # the car's maximum-speed setting (%): the fixed one, or a draw per env


def sample_world(
    cfg: RandomizationConfig,
    n: int,
    dt_physics: float,
    generator: torch.Generator,
    device: torch.device,
    max_speed_percent: float = 100.0,
) -> WorldSample:
    """Draw car parameters, latencies, noise scales and speed settings for `n` envs (`max_speed_percent`: the fixed
    setting, when `cfg.max_speed_percent` does not draw one)."""

    def pick(switch: bool, rng: tuple[float, float], nominal: float) -> Tensor:
        if switch:
            return uniform(rng[0], rng[1], n, generator, device)
        return torch.full((n,), float(nominal), device=device)

    off = math.radians(cfg.steering_offset_deg)
    params = CarParams(
        friction=pick(cfg.friction, cfg.friction_range, 1.0),
        mass_scale=pick(cfg.mass, cfg.mass_range, 1.0),
        motor_gain=pick(cfg.motor_gain, cfg.motor_gain_range, 1.0),
        steering_gain=pick(cfg.steering_gain, cfg.steering_gain_range, 1.0),
        steering_offset=pick(cfg.steering_offset, (-off, off), 0.0),
        rear_grip=pick(cfg.rear_grip, cfg.rear_grip_range, 1.0),
    )
    act_ms = pick(cfg.action_latency, cfg.action_latency_ms, cfg.nominal_action_latency_ms)
    cam_ms = pick(cfg.camera_latency, cfg.camera_latency_ms, cfg.nominal_camera_latency_ms)
    to_steps = lambda ms: torch.round(ms / (1000.0 * dt_physics)).long()  # noqa: E731
    noise = pick(cfg.action_noise, (0.0, cfg.action_noise_max), 0.0)
    # Drawn after the car's factors, so those of a seeded draw are the same with and without it.
    setting = pick(cfg.max_speed_percent, cfg.max_speed_percent_range, max_speed_percent)
    if cfg.friction and cfg.friction_low_share > 0:
        # Drawn last, so every other factor of a seeded draw is the same with and without it.
        lo, hi = cfg.friction_range
        low = uniform(lo, lo + (hi - lo) / 3.0, n, generator, device)
        use_low = uniform(0.0, 1.0, n, generator, device) < cfg.friction_low_share
        params = replace(params, friction=torch.where(use_low, low, params.friction))
    return WorldSample(params, to_steps(act_ms), to_steps(cam_ms), noise, torch.ones(n, device=device), setting)


def env_factors(world: WorldSample, dt_physics: float) -> Tensor:
    """The `env_factors` observation `(N, 9)`: every randomized quantity of the car and its timing, normalized to
    [-1, 1] by FACTOR_BOUNDS (the speed setting is none: see the module docstring)."""
    raw = {
        "friction": world.params.friction,
        "mass_scale": world.params.mass_scale,
        "motor_gain": world.params.motor_gain,
        "steering_gain": world.params.steering_gain,
        "steering_offset": world.params.steering_offset,
        "action_latency": world.action_latency.float() * dt_physics,
        "camera_latency": world.camera_latency.float() * dt_physics,
        "action_noise": world.action_noise,
        "battery": world.battery,
    }
    cols = [
        2.0 * (raw[k] - FACTOR_BOUNDS[k][0]) / (FACTOR_BOUNDS[k][1] - FACTOR_BOUNDS[k][0]) - 1.0 for k in FACTOR_NAMES
    ]
    return torch.stack(cols, dim=-1)


def denormalize_factor(name: str, value: Tensor) -> Tensor:
    """Inverse of the `env_factors` normalization for one factor."""
    lo, hi = FACTOR_BOUNDS[name]
    return lo + (value + 1.0) * 0.5 * (hi - lo)


def sample_directions(
    cfg: RandomizationConfig, previous: Tensor, generator: torch.Generator, first: bool = False
) -> Tensor:
    """Travel direction per env (+1 forward, -1 reversed) for the episodes starting now."""
    n, device = previous.shape[0], previous.device
    if cfg.direction == "forward":
        return torch.ones(n, device=device)
    if cfg.direction == "reverse":
        return -torch.ones(n, device=device)
    if cfg.direction == "random" or first:
        if cfg.direction == "alternate":  # first episode: half the envs each way, so both are always trained
            return torch.where(torch.arange(n, device=device) % 2 == 0, 1.0, -1.0)
        return torch.where(torch.rand(n, generator=generator, device=device) < 0.5, 1.0, -1.0)
    return -previous


@dataclass
class VisualSample:
    """Per-env scene luma (0-255 scale) for the camera, `(N,)` each."""

    asphalt: Tensor
    line: Tensor
    ground: Tensor
    wall: Tensor
    sky: Tensor
    brightness: Tensor


NOMINAL_LUMA = {"asphalt": 60.0, "line": 225.0, "ground": 120.0, "wall": 185.0, "sky": 200.0}


def sample_visuals(cfg: RandomizationConfig, n: int, generator: torch.Generator, device: torch.device) -> VisualSample:
    def jitter(nominal: float) -> Tensor:
        if not cfg.visual:
            return torch.full((n,), nominal, device=device)
        j = cfg.color_jitter
        return nominal * uniform(1.0 - j, 1.0 + j, n, generator, device)

    lumas = {k: jitter(v) for k, v in NOMINAL_LUMA.items()}
    bright = uniform(*cfg.brightness_range, n, generator, device) if cfg.visual else torch.ones(n, device=device)
    return VisualSample(**lumas, brightness=bright)
