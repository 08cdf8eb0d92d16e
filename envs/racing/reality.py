"""The held-out reality proxy: an env configuration the training never reads, on which the sim-to-real gap is measured.

Dynamics: the contact-wheel Genesis car at a finer physics step, a fixed floor friction and car (with a little
per-lap spread), fixed latencies, and the unmodeled actuation effects (battery sag over the session, servo slew rate
and deadband, DeepRacer's nonlinear throttle map, latency jitter, steering trim). Perception: the Genesis-rendered
3-D scene (barriers, clutter and people-sized objects beyond them, a directional light with baked barrier shadows,
glare patches), an equidistant fisheye lens, and a sensor with vignetting, read and shot noise.

Named variants in the spirit of the DeepRacer experiments: `replica-track` (the training track rebuilt in a room),
`office-corridor` (a carpet floor with tape lines, tiles around it, no barriers, less grip), `sunlight` (low
bright sun: long shadows, strong glare) and `out-of-range` (the replica track with a car outside the `transfer`
preset's ranges: slow actuation, a weak motor, a large steering trim; what a calibration has to find). A variant
sets the fields the command line left at their defaults, so an explicit flag always wins over the variant.

    reality_env_config(policy_env_cfg, RealityConfig(variant="sunlight"))
    reality_env_config(policy_env_cfg, cfg, part="dynamics")  # proxy dynamics, training camera
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import Literal

from envs.config_io import with_variant
from envs.errors import ConfigError, check_range
from envs.racing.config import EnvConfig
from envs.racing.effects import EffectsConfig
from envs.racing.sensor import SensorConfig
from envs.racing.track_texture import SceneConfig

VARIANTS: dict[str, dict[str, object]] = {
    "replica-track": {},
    "office-corridor": {
        "scene.floor": "office",
        "scene.walls": False,
        "scene.clutter": 40,
        "scene.light_elevation_deg": 70.0,
        "scene.glare_patches": 3,
        "friction": 0.8,
    },
    "sunlight": {
        "scene.light_intensity": 1.8,
        "scene.light_elevation_deg": 20.0,
        "scene.ambient": 0.3,
        "scene.shadow_strength": 0.55,
        "scene.glare_patches": 14,
        "scene.glare_strength": 0.8,
    },
    "out-of-range": {"action_latency_ms": 150.0, "motor_gain": 0.7, "effects.steering_offset_deg": 4.0},
}


def _default_effects() -> EffectsConfig:
    return EffectsConfig(
        battery_sag_per_minute=0.03, battery_floor=0.85, servo_rate_dps=360.0, steering_deadband_deg=1.0,
        throttle_exponent=1.2, latency_jitter_ms=20.0, steering_offset_deg=1.0,
    )  # fmt: skip


def _default_scene() -> SceneConfig:
    return SceneConfig(clutter=32, shadow_strength=0.35, glare_patches=6, room_seed=11)


@dataclass(frozen=True)
class RealityConfig:
    """The reality proxy. Every field is settable (`--reality.<field>`); a variant fills the fields left at default."""

    variant: Literal["replica-track", "office-corridor", "sunlight", "out-of-range"] = "replica-track"
    """named proxy: replica-track, office-corridor, sunlight or out-of-range"""
    physics: Literal["genesis", "bicycle"] = "genesis"
    """physics backend of the proxy (the held-out contact-wheel car by default)"""
    substeps: int = 8
    """physics substeps per 15 Hz control step (8 = 1/120 s, finer than training's 1/60 s)"""
    camera: Literal["genesis", "projective"] = "genesis"
    """camera backend of the proxy (the rendered 3-D scene by default)"""
    lens: Literal["fisheye", "pinhole"] = "fisheye"
    """lens model (equidistant fisheye of the calibrated field of view)"""
    camera_pitch_deg: float = 16.0
    """camera tilt as mounted (the calibration says 15)"""
    camera_height: float = 0.102
    """lens height as mounted (m; the calibration says 0.10)"""
    friction: float = 0.9
    """floor friction"""
    mass_scale: float = 1.05
    """car mass relative to nominal (a heavier battery pack)"""
    motor_gain: float = 0.95
    """speed reached per speed command"""
    steering_gain: float = 0.95
    """steering angle reached per command"""
    spread: float = 0.03
    """per-lap relative spread of friction, mass and gains (dust, tyre temperature)"""
    action_latency_ms: float = 50.0
    """action-to-actuator latency (ms), before jitter"""
    camera_latency_ms: float = 45.0
    """age of the camera frame (ms)"""
    effects: EffectsConfig = field(default_factory=_default_effects)
    """unmodeled actuation effects"""
    sensor: SensorConfig = field(default_factory=lambda: SensorConfig(vignetting=0.3, read_noise=2.0, shot_noise=0.4))
    """image sensor defects"""
    scene: SceneConfig = field(default_factory=_default_scene)
    """the room: floor, barriers, clutter, light, shadows, glare"""

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise ConfigError(f"reality.variant={self.variant!r}; use one of {', '.join(VARIANTS)}")
        if self.physics not in ("genesis", "bicycle"):
            raise ConfigError(f"reality.physics={self.physics!r}; use 'genesis' or 'bicycle'")
        if self.camera not in ("genesis", "projective"):
            raise ConfigError(f"reality.camera={self.camera!r}; use 'genesis' or 'projective'")
        if self.lens not in ("fisheye", "pinhole"):
            raise ConfigError(f"reality.lens={self.lens!r}; use 'fisheye' or 'pinhole'")
        check_range("reality.substeps", self.substeps, 1, 64)
        check_range("reality.camera_pitch_deg", self.camera_pitch_deg, -45.0, 80.0)
        check_range("reality.camera_height", self.camera_height, 0.01, 2.0)
        check_range("reality.friction", self.friction, 0.1, 2.0)
        check_range("reality.mass_scale", self.mass_scale, 0.5, 2.0)
        check_range("reality.motor_gain", self.motor_gain, 0.5, 1.5)
        check_range("reality.steering_gain", self.steering_gain, 0.5, 1.5)
        check_range("reality.spread", self.spread, 0.0, 0.3)
        check_range("reality.action_latency_ms", self.action_latency_ms, 0.0, 300.0)
        check_range("reality.camera_latency_ms", self.camera_latency_ms, 0.0, 300.0)

    def resolved(self) -> RealityConfig:
        """This config with its variant's values in every field still at the default."""
        return with_variant(self, VARIANTS[self.variant])


def flatten(obj: object, prefix: str = "") -> dict[str, object]:
    """Every leaf field of a dataclass tree as `dotted.name -> value` (for reports and W&B configs)."""
    out: dict[str, object] = {}
    for f in fields(obj):
        value = getattr(obj, f.name)
        if is_dataclass(value):
            out.update(flatten(value, f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = value
    return out


def reality_env_config(
    base: EnvConfig, cfg: RealityConfig, part: Literal["all", "dynamics", "perception", "none"] = "all"
) -> EnvConfig:
    """The env config of the proxy for a policy trained with `base`.

    `part="dynamics"` takes only the proxy's dynamics (physics, car, action latency, actuation effects) and keeps the
    training camera; `part="perception"` takes only its perception (camera, lens, scene, sensor, camera latency) and
    keeps the training dynamics at their nominal values; `part="none"` is the training sim at nominal values with the
    same episode conditions. Against `none`, the two split the total gap into its dynamics and perception parts.
    """
    if part not in ("all", "dynamics", "perception", "none"):
        raise ConfigError(f"reality part={part!r}; use all, dynamics, perception or none")
    cfg = cfg.resolved()
    rnd = replace(base.randomization, action_noise=False, visual=False, random_start=False)
    out = replace(base, compile=False)
    if part in ("all", "dynamics"):
        spread = lambda v: (v * (1 - cfg.spread), v * (1 + cfg.spread))  # noqa: E731
        rnd = replace(
            rnd, friction=True, friction_range=spread(cfg.friction), mass=True, mass_range=spread(cfg.mass_scale),
            motor_gain=True, motor_gain_range=spread(cfg.motor_gain), steering_gain=True,
            steering_gain_range=spread(cfg.steering_gain), steering_offset=False, rear_grip=False, action_latency=False,
            nominal_action_latency_ms=cfg.action_latency_ms,
        )  # fmt: skip
        out = replace(out, physics=cfg.physics, substeps=cfg.substeps, effects=cfg.effects)
    else:  # training dynamics at their nominal values
        out = replace(out, effects=EffectsConfig())
        rnd = replace(
            rnd, friction=False, mass=False, motor_gain=False, steering_gain=False, steering_offset=False,
            rear_grip=False, action_latency=False,
        )  # fmt: skip
    if part in ("all", "perception") and base.camera != "none":
        optics = replace(base.optics, lens=cfg.lens, pitch_deg=cfg.camera_pitch_deg, height=cfg.camera_height)
        rnd = replace(rnd, camera_latency=False, nominal_camera_latency_ms=cfg.camera_latency_ms)
        out = replace(out, camera=cfg.camera, optics=optics, scene=cfg.scene, sensor=cfg.sensor)
    else:
        rnd = replace(rnd, camera_latency=False)
    return replace(out, randomization=rnd)
