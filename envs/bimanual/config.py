"""Configuration of the two-arm env: the variant, episode timing, the randomized world and the observation groups.

Every randomized quantity is a `(low, high)` range drawn per env at each reset; a range outside what the simulator
accepts (a negative mass, a friction Genesis refuses, a latency longer than its buffer) is refused here, naming the
field. The defaults are the ranges in which the scripted grasp holds the bar.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

from envs.bimanual.look import TRAINING_JITTER, CameraLook, LookJitter
from envs.errors import ConfigError, check_interval, check_range
from envs.genesis_import import GenesisConfig

VARIANTS = ("lift",)
"""task variants this env builds (a level bar lift)"""

BAR_LENGTHS = (0.26, 0.36)
"""bar lengths the lift task allows (m)"""


@dataclass(frozen=True)
class RandomizationConfig:
    """Per-env ranges drawn at every reset (physical units)."""

    object_mass: tuple[float, float] = (0.1, 0.3)
    """bar mass (kg)"""
    com_shift: tuple[float, float] = (-0.02, 0.02)
    """bar centre-of-mass offset along its length (m)"""
    friction: tuple[float, float] = (0.4, 1.2)
    """friction coefficient of the bar and the finger pads (Genesis takes the larger of a pair; both get this value)"""
    gain_scale: tuple[float, float] = (0.9, 1.1)
    """scale of each arm's joint stiffness and damping (drawn per arm)"""
    action_latency: tuple[int, int] = (0, 2)
    """delay of the joint targets and finger forces (physics steps)"""
    camera_latency: tuple[int, int] = (0, 0)
    """delay of the camera image (control steps)"""
    base_offset: float = 0.0
    """largest misplacement of arm 1's base in x and y (m); only 0 for now: moving a fixed base per env needs the
    scene's arms built with Genesis' `batch_fixed_verts`"""
    object_xy: float = 0.04
    """largest offset of the bar's start position from the table centre in x and y (m)"""
    object_yaw: float = 0.3
    """largest start yaw of the bar (rad)"""

    def __post_init__(self) -> None:
        check_interval("randomization.object_mass", self.object_mass, 0.01, 5.0)
        check_interval("randomization.com_shift", self.com_shift, -0.1, 0.1)
        check_interval("randomization.friction", self.friction, 0.05, 3.0)
        check_interval("randomization.gain_scale", self.gain_scale, 0.2, 3.0)
        check_interval("randomization.action_latency", self.action_latency, 0, 100)
        check_interval("randomization.camera_latency", self.camera_latency, 0, 20)
        check_range("randomization.base_offset", self.base_offset, 0.0, 0.0)
        check_range("randomization.object_xy", self.object_xy, 0.0, 0.1)
        check_range("randomization.object_yaw", self.object_yaw, 0.0, 1.0)


@dataclass(frozen=True)
class EffectsConfig:
    """Physics and actuation of the real cell that training does not model; every default is off (the training sim)."""

    contact_timeconst: float = 0.0
    """time constant of every contact's response (s; larger is softer); 0: Genesis' default, as in training"""
    arm_gain: tuple[float, float] = (1.0, 1.0)
    """each arm's joint stiffness and damping, relative to what `randomization.gain_scale` draws"""
    wrist_backlash: float = 0.0
    """play of the wrist joints' gears (rad): their targets follow a reversed command only after this much travel"""
    wrist_deadband: float = 0.0
    """deadband of the wrist servos (rad): a target moves only when the command differs from it by more"""
    wrist_torque_scale: float = 1.0
    """the wrist joints' torque limits relative to the Panda's 12 N·m"""
    payload_force: tuple[float, float] = (0.0, 0.0)
    """vertical force on each arm's hand that its controller does not compensate (N; negative pulls down): a
    payload or gravity-compensation error"""
    latency_jitter: int = 0
    """largest extra delay of a command (physics steps), drawn per command on top of the action latency"""
    drop_prob: float = 0.0
    """probability that a control step's command is lost (the actuators hold the previous one)"""
    base_shift: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """where arm 1's base truly stands, relative to where its controller believes it stands (m, world x y z)"""

    def __post_init__(self) -> None:
        check_range("effects.contact_timeconst", self.contact_timeconst, 0.0, 0.2)
        for i, gain in enumerate(self.arm_gain):
            check_range(f"effects.arm_gain[{i}]", gain, 0.2, 3.0)
        check_range("effects.wrist_backlash", self.wrist_backlash, 0.0, 0.2)
        check_range("effects.wrist_deadband", self.wrist_deadband, 0.0, 0.2)
        check_range("effects.wrist_torque_scale", self.wrist_torque_scale, 0.1, 1.0)
        for i, force in enumerate(self.payload_force):
            check_range(f"effects.payload_force[{i}]", force, -50.0, 50.0)
        check_range("effects.latency_jitter", self.latency_jitter, 0, 100)
        check_range("effects.drop_prob", self.drop_prob, 0.0, 0.9)
        for i, shift in enumerate(self.base_shift):
            check_range(f"effects.base_shift[{i}]", shift, -0.1, 0.1)


def check_latency_buffer(cfg) -> None:
    """Refuse a two-arm env config whose latency (the drawn action latency plus the effects' jitter) would overrun its
    buffer of `max_latency` physics steps."""
    most = cfg.randomization.action_latency[1] + cfg.effects.latency_jitter
    if most > cfg.max_latency:
        raise ConfigError(
            f"randomization.action_latency={cfg.randomization.action_latency!r} plus effects.latency_jitter="
            f"{cfg.effects.latency_jitter} exceeds the latency buffer (env.max_latency={cfg.max_latency} physics steps)"
        )


@dataclass(frozen=True)
class ObservationConfig:
    """Which observation groups the env offers (every group is computed only when on)."""

    teacher: bool = True
    """privileged state: object pose and velocity, TCP poses, finger widths and forces, grasp vectors, phase"""
    env_factors: bool = True
    """the randomized world, normalized to [-1, 1]"""
    proprio: bool = True
    """what the arms report: previous action, joint positions, gripper widths, an estimated TCP wrench"""
    camera: bool = False
    """one fixed grayscale camera over the table"""
    camera_res: int = 96
    """square image side (pixels)"""
    camera_renderer: Literal["genesis", "raycast"] = "raycast"
    """who renders the camera: 'raycast', the batched torch ray caster of primitives fitted to the arms (fast
    enough for a camera student on a CPU), or 'genesis', Genesis' rasterizer of the arms' visual meshes (a detailed
    look, rendered one env after another and far slower)"""
    joint_noise: float = 0.002
    """standard deviation of the joint encoder noise (rad)"""
    wrench_noise: float = 0.5
    """standard deviation of the wrench estimate's noise (N, N·m)"""
    wrench_gain: tuple[float, float] = (0.5, 1.5)
    """range of the wrench estimate's calibration: a gain per env, arm and axis, drawn at each reset. An estimate from
    joint torques has no trustworthy scale (it moves with the friction and inertia models, and in simulation with the
    physics step), so a student must not learn one"""
    wrench_bias: float = 3.0
    """standard deviation of the wrench estimate's bias at a reset (N, N·m), which then walks"""
    wrench_bias_walk: float = 0.02
    """per-step standard deviation of the random walk of the wrench estimate's bias (N, N·m)"""
    look: CameraLook = field(default_factory=CameraLook)
    """how the camera sees the cell: its true pose, light, table, clutter, lens, sensor noise (training's look by
    default)"""
    look_jitter: LookJitter = field(default_factory=lambda: TRAINING_JITTER)
    """the render's domain randomization: looks drawn around `look` per env group at every full reset of the env
    (the ray caster only; `LookJitter()` turns it off)"""

    def __post_init__(self) -> None:
        check_range("observations.camera_res", self.camera_res, 16, 512)
        if self.camera_renderer not in ("genesis", "raycast"):
            raise ConfigError(f"observations.camera_renderer={self.camera_renderer!r}; use 'genesis' or 'raycast'")
        check_range("observations.joint_noise", self.joint_noise, 0.0, 0.1)
        check_range("observations.wrench_noise", self.wrench_noise, 0.0, 10.0)
        check_range("observations.wrench_bias_walk", self.wrench_bias_walk, 0.0, 1.0)
        check_range("observations.wrench_bias", self.wrench_bias, 0.0, 100.0)
        check_interval("observations.wrench_gain", self.wrench_gain, 0.0, 10.0)


def exact_sensors(obs: ObservationConfig) -> ObservationConfig:
    """`obs` with the readings' calibration exact and the training look fixed (no `look_jitter`): a nominal world's,
    and the reality proxy's own."""
    return replace(obs, wrench_gain=(1.0, 1.0), look_jitter=LookJitter())


@dataclass(frozen=True)
class BimanualConfig:
    """A batched two-arm env."""

    num_envs: int = 64
    """the number of parallel environments"""
    seed: int = 0
    """seed of the env's generator (start poses, randomization, sensor noise)"""
    device: str = "cpu"
    """torch device of the simulation and the observations"""
    variant: str = "lift"
    """the task: 'lift' (a level two-arm bar lift)"""
    episode_seconds: float = 8.0
    """episode length (s)"""
    dt: float = 0.01
    """physics step (s)"""
    decimation: int = 5
    """physics steps per control step (20 Hz control at the defaults)"""
    bar_length: float = 0.30
    """the bar's length (m): one per scene, Genesis cannot resize a geometry per env"""
    bar_section: float = 0.04
    """the bar's square cross-section side (m)"""
    max_latency: int = 4
    """capacity of the action latency buffer (physics steps): the most `randomization.action_latency` may draw"""
    randomization: RandomizationConfig = field(default_factory=RandomizationConfig)
    """per-env ranges"""
    observations: ObservationConfig = field(default_factory=ObservationConfig)
    """observation groups"""
    effects: EffectsConfig = field(default_factory=EffectsConfig)
    """the real cell's physics and actuation effects (all off in training)"""
    error_speed: float = 20.0
    """a body speed above this (m/s, rad/s) counts as an exploded simulation and resets the env"""
    genesis: GenesisConfig = field(default_factory=GenesisConfig)
    """engine settings, fixed by the first Genesis scene of a process"""

    def __post_init__(self) -> None:
        check_range("env.num_envs", self.num_envs, 1, 65536)
        if self.variant not in VARIANTS:
            raise ConfigError(f"env.variant={self.variant!r} is unknown; known variants: {', '.join(VARIANTS)}")
        check_range("env.episode_seconds", self.episode_seconds, 0.5, 120.0)
        check_range("env.dt", self.dt, 1e-4, 0.02)
        check_range("env.decimation", self.decimation, 1, 50)
        check_range("env.bar_length", self.bar_length, *BAR_LENGTHS)
        check_range("env.bar_section", self.bar_section, 0.02, 0.06)
        check_range("env.max_latency", self.max_latency, 0, 100)
        check_range("env.error_speed", self.error_speed, 1.0, 1000.0)
        check_latency_buffer(self)
        if self.randomization.camera_latency[1] > 0 and not self.observations.camera:
            raise ConfigError("randomization.camera_latency needs observations.camera=True")

    @property
    def control_dt(self) -> float:
        """seconds per control step"""
        return self.dt * self.decimation

    @property
    def max_episode_length(self) -> int:
        """control steps per episode"""
        return round(self.episode_seconds / self.control_dt)


def nominal(cfg: Any, object_mass: float = 0.2) -> Any:
    """A two-arm env config `cfg` (the lift's or a variant's) with every randomized factor at its nominal value, the
    object `object_mass` kg (the object's start pose still drawn)."""
    rnd = replace(
        cfg.randomization, object_mass=(object_mass, object_mass), com_shift=(0.0, 0.0), friction=(0.8, 0.8),
        gain_scale=(1.0, 1.0), action_latency=(0, 0), camera_latency=(0, 0), base_offset=0.0,
    )  # fmt: skip
    return replace(cfg, randomization=rnd, observations=exact_sensors(cfg.observations))
