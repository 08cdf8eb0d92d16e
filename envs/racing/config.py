"""The racing env's configuration: one frozen dataclass tree, validated on construction, settable from tyro."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from envs.camera_model import CameraConfig
from envs.errors import ConfigError, check_range
from envs.genesis_import import GenesisConfig
from envs.racing.car import MAX_SPEED_PERCENT_RANGE, CarSpec
from envs.racing.effects import EffectsConfig
from envs.racing.randomization import RandomizationConfig
from envs.racing.rewards import RewardConfig, TerminationConfig
from envs.racing.sensor import SensorConfig
from envs.racing.track_texture import SceneConfig


@dataclass(frozen=True)
class ObservationConfig:
    """What the observation groups contain."""

    lookahead_points: int = 10
    """centerline points ahead in the `teacher` group"""
    lookahead_spacing: float = 0.25
    """arc length between lookahead points (m)"""
    proprio_imu: bool = False
    """add a noisy IMU (yaw rate, longitudinal and lateral acceleration) to the `proprio` group"""
    imu_noise: float = 0.05
    """IMU noise standard deviation, relative to the signal scales"""

    def __post_init__(self) -> None:
        check_range("obs.lookahead_points", self.lookahead_points, 1, 64)
        check_range("obs.lookahead_spacing", self.lookahead_spacing, 0.02, 2.0)
        check_range("obs.imu_noise", self.imu_noise, 0.0, 1.0)


@dataclass(frozen=True)
class EnvConfig:
    """The batched racing env: track, backends, control timing, randomization, reward and terminations."""

    num_envs: int = 256
    """parallel envs"""
    track: str = "reinvent2018"
    """built-in track (oval, reinvent2018, technical) or a DeepRacer route .npy path"""
    physics: Literal["bicycle", "genesis"] = "bicycle"
    """car physics backend"""
    camera: Literal["none", "projective", "genesis"] = "none"
    """camera backend; none = state-only (no `camera` group)"""
    action_space: str = "default"
    """named action space (default, console-default, fast-throttle, continuous) or model_metadata.json path"""
    calibration: str = ""
    """calibration JSON (command -> measured steering and speed); empty = identity"""
    max_speed_percent: float = 100.0
    """the car's maximum-speed setting (%), as on the DeepRacer device console: every speed command is scaled by it
    at the car; the policy's previous-action input keeps the command it chose. With
    `randomization.max_speed_percent` training envs draw the setting per env instead, and evaluations drive at this"""
    control_hz: float = 15.0
    """policy rate: one action per camera frame"""
    substeps: int = 4
    """physics substeps per control step"""
    start_points: tuple[float, ...] = (0.0,)
    """start positions as lap fractions when random starts are off (envs take them in turn)"""
    seed: int = 0
    """seed of every random draw in the env"""
    device: str = "cpu"
    """torch device of the env tensors"""
    compile: bool = False
    """torch.compile the per-step physics, projection and observation kernels (worth it at thousands of envs; the
    first build takes a while and is cached afterwards)"""
    car: CarSpec = field(default_factory=CarSpec)
    genesis: GenesisConfig = field(default_factory=GenesisConfig)
    """Genesis engine settings (physics and camera backends `genesis`)"""
    optics: CameraConfig = field(default_factory=CameraConfig)
    scene: SceneConfig = field(default_factory=SceneConfig)
    randomization: RandomizationConfig = field(default_factory=RandomizationConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    termination: TerminationConfig = field(default_factory=TerminationConfig)
    obs: ObservationConfig = field(default_factory=ObservationConfig)
    effects: EffectsConfig = field(default_factory=EffectsConfig)
    """unmodeled actuation effects (all off in the training sim; the reality proxy turns them on)"""
    sensor: SensorConfig = field(default_factory=SensorConfig)
    """image-sensor defects applied after rendering (off in the training sim)"""

    def __post_init__(self) -> None:
        check_range("env.num_envs", self.num_envs, 1, 1_000_000)
        check_range("env.control_hz", self.control_hz, 1.0, 200.0)
        check_range("env.substeps", self.substeps, 1, 64)
        check_range("env.max_speed_percent", self.max_speed_percent, *MAX_SPEED_PERCENT_RANGE)
        if self.physics not in ("bicycle", "genesis"):
            raise ConfigError(f"env.physics={self.physics!r}; use 'bicycle' or 'genesis'")
        if self.camera not in ("none", "projective", "genesis"):
            raise ConfigError(f"env.camera={self.camera!r}; use 'none', 'projective' or 'genesis'")
        if self.physics == "genesis" and self.dt_physics > 1 / 60 + 1e-9:
            raise ConfigError(
                f"env.physics=genesis needs physics substeps of <= 1/60 s (got {self.dt_physics:.4f} s at "
                f"env.substeps={self.substeps}); raise env.substeps or use env.physics=bicycle"
            )
        if self.camera == "genesis" and self.optics.hfov_deg > 150.0:
            raise ConfigError(
                f"env.camera=genesis renders through a pinhole first: optics.hfov_deg <= 150 (got "
                f"{self.optics.hfov_deg}); use env.camera=projective for wider fisheye lenses"
            )
        if self.camera != "genesis" and self.physics != "genesis" and self.genesis != GenesisConfig():
            raise ConfigError(
                "env.genesis.* only applies to the Genesis backends; set env.physics=genesis or env.camera=genesis"
            )
        if not self.start_points or not all(0.0 <= p < 1.0 for p in self.start_points):
            raise ConfigError(f"env.start_points={self.start_points!r}: need one or more lap fractions in [0, 1)")

    @property
    def dt(self) -> float:
        """Control period (s)."""
        return 1.0 / self.control_hz

    @property
    def dt_physics(self) -> float:
        return self.dt / self.substeps

    @property
    def max_episode_length(self) -> int:
        return int(round(self.termination.episode_seconds * self.control_hz))
