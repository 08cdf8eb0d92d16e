"""The two-arm tasks' held-out reality proxy: an env configuration training never reads, on which the gap is measured.

Dynamics: a finer physics step (the control step stays the policy's) and another contact softness; one arm's servo
gain outside the training range; gear backlash and a deadband on the wrist joints' targets; lower wrist torque
limits; an uncompensated vertical force on each hand (a payload or gravity-compensation error); a command latency
that jitters per command, with occasional dropped commands (the previous one held); arm 1's base standing away from
where its controller believes it is; an object heavier than the training's middle, its centre of mass beyond the
training range, and slippery finger pads. Perception: the camera shifted and turned from where training renders it,
another light, another table (colour and grain), clutter beside the work area, lens distortion, sensor noise, a
camera latency, and optionally Genesis' rasterizer of the arms' meshes instead of the training's ray caster.

Named variants: `replica-cell` (the everyday cell: a moderate dose of everything), then one stressed family each:
`heavy-slippery` (the object), `miscalibrated` (base, camera, one arm's gain, the payload compensation), `laggy`
(latency, jitter, drops, camera latency), `worn-wrist` (backlash, deadband, torque), `bright-clutter` (the look),
and `rasterized` (the replica cell rendered by Genesis' rasterizer). A variant sets the fields the command line left
at their defaults, so an explicit flag always wins over the variant.

    reality_env_config(policy_env_cfg, ArmRealityConfig(variant="laggy"))
    reality_env_config(policy_env_cfg, cfg, part="perception")  # proxy camera, training dynamics at nominal values
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from envs.bimanual.config import EffectsConfig, exact_sensors
from envs.bimanual.look import CameraLook
from envs.config_io import with_variant
from envs.errors import ConfigError, check_range

PARTS = ("all", "dynamics", "perception", "none")
"""what of the proxy an env config takes (against `none`, `dynamics` and `perception` split the gap)"""

# fmt: off
VARIANTS: dict[str, dict[str, object]] = {
    "replica-cell": {},
    "heavy-slippery": {"mass_scale": 1.5, "friction": 0.35, "com_shift": 1.6, "contact_timeconst": 0.03},
    "miscalibrated": {
        "arm_gain": (1.0, 0.7), "payload_force": (-6.0, 4.0), "base_shift": (0.015, -0.012, 0.004),
        "look.camera_shift": (0.03, -0.025, 0.02), "look.camera_rotation_deg": (2.5, -2.0, 1.5),
    },
    "laggy": {"action_latency_ms": 40.0, "latency_jitter_ms": 30.0, "drop_prob": 0.1, "camera_latency": 2},
    "worn-wrist": {"wrist_backlash_deg": 1.5, "wrist_deadband_deg": 0.8, "wrist_torque_scale": 0.5},
    "bright-clutter": {
        "look.light": (0.9, -0.1, 0.5), "look.light_intensity": 1.6, "look.ambient": 0.45, "look.table_texture": 0.35,
        "look.table_color": (0.7, 0.62, 0.5), "look.clutter": 8, "look.distortion": -0.12, "look.noise": 6.0,
    },
    "rasterized": {"renderer": "genesis"},
}
# fmt: on


def _replica_look() -> CameraLook:
    return CameraLook(
        camera_shift=(0.01, -0.008, 0.006), camera_rotation_deg=(0.8, -0.6, 0.5), light=(0.45, -0.35, 1.0),
        light_intensity=1.1, ambient=0.32, table_color=(0.5, 0.43, 0.36), table_texture=0.12, background=0.55,
        clutter=3, clutter_seed=5, distortion=-0.04, noise=2.0,
    )  # fmt: skip


@dataclass(frozen=True)
class ArmRealityConfig:
    """The two-arm reality proxy. Every field is settable (`--reality.<field>`); a variant fills those at default."""

    variant: Literal[
        "replica-cell", "heavy-slippery", "miscalibrated", "laggy", "worn-wrist", "bright-clutter", "rasterized"
    ] = "replica-cell"
    """named proxy: replica-cell, heavy-slippery, miscalibrated, laggy, worn-wrist, bright-clutter or rasterized"""
    dt: float = 0.005
    """physics step (s; training's is 0.01); the control step stays the policy's, so it must divide it"""
    contact_timeconst: float = 0.015
    """time constant of every contact's response (s; larger is softer; training's is Genesis' floor, twice its step)"""
    arm_gain: tuple[float, float] = (1.0, 0.85)
    """each arm's joint stiffness and damping relative to nominal (training draws each in 0.9-1.1)"""
    wrist_backlash_deg: float = 0.3
    """play of the wrist joints' gears (degrees)"""
    wrist_deadband_deg: float = 0.15
    """deadband of the wrist servos (degrees)"""
    wrist_torque_scale: float = 0.8
    """the wrist joints' torque limits relative to the Panda's 12 N·m"""
    payload_force: tuple[float, float] = (-2.0, 1.0)
    """uncompensated vertical force on each arm's hand (N; negative pulls down)"""
    action_latency_ms: float = 15.0
    """command latency before jitter (ms; training draws 0-20)"""
    latency_jitter_ms: float = 10.0
    """largest extra latency of a command, drawn per command (ms)"""
    drop_prob: float = 0.02
    """probability that a control step's command is lost (the previous one held)"""
    base_shift: tuple[float, float, float] = (0.006, -0.005, 0.0)
    """where arm 1's base truly stands relative to where its controller believes (m; training's is exact)"""
    mass_scale: float = 1.2
    """the object's mass relative to the middle of the training range"""
    com_shift: float = 1.25
    """the object's centre-of-mass offset along its x axis, as a multiple of the training range's largest offset
    (beyond 1: outside what training drew)"""
    friction: float = 0.6
    """finger pad and object friction (training draws 0.4-1.2)"""
    renderer: Literal["raycast", "genesis"] = "raycast"
    """who renders the camera: the training's ray caster, or Genesis' rasterizer of the arms' meshes"""
    camera_latency: int = 0
    """age of the camera image (control steps)"""
    look: CameraLook = field(default_factory=_replica_look)
    """the camera's true pose, the light, the table, clutter, the lens and the sensor"""

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise ConfigError(f"reality.variant={self.variant!r}; use one of {', '.join(VARIANTS)}")
        if self.renderer not in ("raycast", "genesis"):
            raise ConfigError(f"reality.renderer={self.renderer!r}; use 'raycast' or 'genesis'")
        check_range("reality.dt", self.dt, 1e-3, 0.01)
        check_range("reality.contact_timeconst", self.contact_timeconst, 0.0, 0.1)
        for i, gain in enumerate(self.arm_gain):
            check_range(f"reality.arm_gain[{i}]", gain, 0.3, 2.0)
        check_range("reality.wrist_backlash_deg", self.wrist_backlash_deg, 0.0, 5.0)
        check_range("reality.wrist_deadband_deg", self.wrist_deadband_deg, 0.0, 5.0)
        check_range("reality.wrist_torque_scale", self.wrist_torque_scale, 0.2, 1.0)
        for i, force in enumerate(self.payload_force):
            check_range(f"reality.payload_force[{i}]", force, -20.0, 20.0)
        check_range("reality.action_latency_ms", self.action_latency_ms, 0.0, 200.0)
        check_range("reality.latency_jitter_ms", self.latency_jitter_ms, 0.0, 100.0)
        check_range("reality.drop_prob", self.drop_prob, 0.0, 0.5)
        for i, shift in enumerate(self.base_shift):
            check_range(f"reality.base_shift[{i}]", shift, -0.05, 0.05)
        check_range("reality.mass_scale", self.mass_scale, 0.2, 5.0)
        check_range("reality.com_shift", self.com_shift, -3.0, 3.0)
        check_range("reality.friction", self.friction, 0.05, 2.0)
        check_range("reality.camera_latency", self.camera_latency, 0, 10)

    def resolved(self) -> ArmRealityConfig:
        """This config with its variant's values in every field still at the default."""
        return with_variant(self, VARIANTS[self.variant])


def _steps(ms: float, dt: float) -> int:
    return round(ms / 1000.0 / dt)


def reality_env_config(base: Any, cfg: ArmRealityConfig, part: str = "all") -> Any:
    """The env config of the proxy for a policy trained with `base` (a two-arm task's env config: the bar lift's or
    the handover's).

    Every randomized factor is fixed at the proxy's value (the object's start pose is still drawn per episode).
    `part="dynamics"` takes only the proxy's dynamics (physics step, contacts, actuation, base, object) and keeps the
    training camera and look; `part="perception"` takes only its perception (renderer, look, camera latency) and keeps
    the training dynamics at their nominal values (the middle of each range, no latency); `part="none"` is the
    training sim at nominal values. Against `none`, the two split the total gap into its dynamics and perception.
    """
    if part not in PARTS:
        raise ConfigError(f"reality part={part!r}; use all, dynamics, perception or none")
    cfg = cfg.resolved()
    rnd = base.randomization
    middle = lambda r: (0.5 * (r[0] + r[1]),) * 2  # noqa: E731
    rnd = replace(
        rnd, object_mass=middle(rnd.object_mass), com_shift=(0.0, 0.0), friction=middle(rnd.friction),
        gain_scale=(1.0, 1.0), action_latency=(0, 0), camera_latency=(0, 0), base_offset=0.0,
    )  # fmt: skip
    changes: dict[str, Any] = {"effects": EffectsConfig(), "max_latency": base.max_latency}
    obs = replace(exact_sensors(base.observations), look=CameraLook())  # its own look (one) and wrench estimate
    if part in ("all", "dynamics"):
        decimation = round(base.control_dt / cfg.dt)
        if decimation < 1 or not math.isclose(decimation * cfg.dt, base.control_dt, rel_tol=1e-9, abs_tol=1e-12):
            raise ConfigError(
                f"reality.dt={cfg.dt} does not divide the policy's control step ({base.control_dt} s); pick a step "
                "that does"
            )
        latency, jitter = _steps(cfg.action_latency_ms, cfg.dt), _steps(cfg.latency_jitter_ms, cfg.dt)
        widest = max(abs(v) for v in base.randomization.com_shift)
        mass = cfg.mass_scale * rnd.object_mass[0]
        rnd = replace(
            rnd, object_mass=(mass, mass), com_shift=(cfg.com_shift * widest,) * 2, friction=(cfg.friction,) * 2,
            action_latency=(latency, latency),
        )  # fmt: skip
        effects = EffectsConfig(
            contact_timeconst=cfg.contact_timeconst, arm_gain=cfg.arm_gain,
            wrist_backlash=math.radians(cfg.wrist_backlash_deg), wrist_deadband=math.radians(cfg.wrist_deadband_deg),
            wrist_torque_scale=cfg.wrist_torque_scale, payload_force=cfg.payload_force, latency_jitter=jitter,
            drop_prob=cfg.drop_prob, base_shift=cfg.base_shift,
        )  # fmt: skip
        changes.update(dt=cfg.dt, decimation=decimation, max_latency=latency + jitter, effects=effects)
    if part in ("all", "perception") and base.observations.camera:
        obs = replace(obs, camera_renderer=cfg.renderer, look=cfg.look)
        rnd = replace(rnd, camera_latency=(cfg.camera_latency,) * 2)
    return replace(base, randomization=rnd, observations=obs, **changes)
