"""Genesis car backend: a URDF car (generated here) with contact wheels on a ground plane, batched over envs.

Four-wheel (or rear-wheel) velocity drive with an electronic differential and torque limits, the centre of mass near
axle height, front steering hinges under position control with Ackermann geometry (inner and outer angles from the
commanded bicycle angle), per-env friction (wheel friction ratio; the pair friction is the larger of the two geoms,
so the ground's is set below every wheel's), mass and actuator gains from the same randomization as the bicycle
backend. Same interface as `BicyclePhysics`: `reset`,
`set_params`, `step` -> `CarState`, `state_dict` / `load_state_dict`. The first scene build compiles kernels (tens
of seconds, cached under ~/.cache); later builds in the same or another process take seconds.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import fields
from pathlib import Path

import torch
from torch import Tensor

from envs.genesis_import import init_genesis
from envs.racing.car import CarSpec
from envs.racing.physics_bicycle import CarParams, CarState, actuator_targets, load_params

WHEEL_WIDTH = 0.025
WHEEL_MASS = 0.05
KNUCKLE_MASS = 0.01
CHASSIS_SIZE = (0.26, 0.15, 0.05)
# Battery, board and motor sit on the chassis plate: the centre of mass is about at axle height (~4 cm above the
# floor), which keeps the car's rollover threshold (half track / CG height ~2 g) above its grip, as on the real car.
CG_ABOVE_AXLE = 0.008
GROUND_FRICTION = 0.01  # below every wheel's, so the wheel friction sets the pair friction


def car_urdf(spec: CarSpec) -> str:
    """URDF text of a DeepRacer-class car: chassis, two steering knuckles, four continuous wheels.

    The wheels collide as spheres of the wheel radius (one analytic contact each, no chatter; a cylinder costs a
    multi-point convex contact per wheel); the chassis has no collision geometry, since the car's only contacts are
    its tyres on the floor."""
    lf, lr, half = spec.cg_to_front, spec.cg_to_rear, spec.track_width / 2
    r, w = spec.wheel_radius, WHEEL_WIDTH
    chassis_mass = spec.mass - 4 * WHEEL_MASS - 2 * KNUCKLE_MASS  # the whole car weighs spec.mass
    cx, cy, cz = CHASSIS_SIZE
    iz = chassis_mass * (cx**2 + cy**2) / 12
    ix, iy = chassis_mass * (cy**2 + cz**2) / 12, chassis_mass * (cx**2 + cz**2) / 12
    wi = WHEEL_MASS * (3 * r**2 + w**2) / 12
    wa = WHEEL_MASS * r**2 / 2

    def wheel(name: str) -> str:
        return f"""
  <link name="{name}">
    <inertial><mass value="{WHEEL_MASS}"/><inertia ixx="{wi}" iyy="{wa}" izz="{wi}" ixy="0" ixz="0" iyz="0"/></inertial>
    <visual><origin rpy="1.5708 0 0"/><geometry><cylinder radius="{r}" length="{w}"/></geometry></visual>
    <collision><geometry><sphere radius="{r}"/></geometry></collision>
  </link>"""

    def knuckle(name: str) -> str:
        return f"""
  <link name="{name}">
    <inertial><mass value="{KNUCKLE_MASS}"/>
      <inertia ixx="1e-6" iyy="1e-6" izz="1e-6" ixy="0" ixz="0" iyz="0"/></inertial>
  </link>"""

    def joint(name, kind, parent, child, xyz, axis, limit=""):
        return f"""
  <joint name="{name}" type="{kind}">
    <parent link="{parent}"/><child link="{child}"/>
    <origin xyz="{xyz[0]} {xyz[1]} {xyz[2]}"/><axis xyz="{axis}"/>{limit}
  </joint>"""

    steer_limit = '<limit lower="-0.7" upper="0.7" effort="2.0" velocity="10"/>'
    drive_limit = '<limit effort="0.6" velocity="200"/>'
    body = f"""
  <link name="chassis">
    <inertial><origin xyz="0 0 {CG_ABOVE_AXLE}"/><mass value="{chassis_mass}"/>
      <inertia ixx="{ix}" iyy="{iy}" izz="{iz}" ixy="0" ixz="0" iyz="0"/></inertial>
    <visual><origin xyz="0 0 {cz / 2 + 0.01}"/><geometry><box size="{cx} {cy} {cz}"/></geometry></visual>
  </link>"""
    parts = [body]
    for side, y in (("left", half), ("right", -half)):
        parts += [knuckle(f"front_{side}_knuckle"), wheel(f"front_{side}_wheel"), wheel(f"rear_{side}_wheel")]
        parts.append(
            joint(
                f"front_{side}_steer", "revolute", "chassis", f"front_{side}_knuckle", (lf, y, 0), "0 0 1", steer_limit
            )
        )
        parts.append(
            joint(
                f"front_{side}_spin",
                "continuous",
                f"front_{side}_knuckle",
                f"front_{side}_wheel",
                (0, 0, 0),
                "0 1 0",
                drive_limit,
            )
        )
        parts.append(
            joint(f"rear_{side}_spin", "continuous", "chassis", f"rear_{side}_wheel", (-lr, y, 0), "0 1 0", drive_limit)
        )
    return f'<?xml version="1.0"?>\n<robot name="gapbridge_car">{"".join(parts)}\n</robot>\n'


def ackermann(steer: Tensor, spec: CarSpec) -> tuple[Tensor, Tensor]:
    """Left and right wheel angles for a bicycle steering angle (positive = left turn, left wheel inner)."""
    tan = torch.tan(steer)
    half = spec.track_width / 2
    left = torch.atan(spec.wheelbase * tan / (spec.wheelbase - half * tan))
    right = torch.atan(spec.wheelbase * tan / (spec.wheelbase + half * tan))
    return left, right


def differential(speed: Tensor, steer: Tensor, spec: CarSpec) -> Tensor:
    """Wheel angular speeds (rad/s) `(N, 4)` = rear left, rear right, front left, front right, for a rear-axle speed
    and a bicycle steering angle: each wheel rolls at its distance to the kinematic turning centre."""
    tan = torch.tan(steer)
    k = spec.track_width / 2 * tan / spec.wheelbase
    rear_l, rear_r = 1 - k, 1 + k
    front_l, front_r = torch.sqrt(tan * tan + rear_l * rear_l), torch.sqrt(tan * tan + rear_r * rear_r)
    return torch.stack([rear_l, rear_r, front_l, front_r], -1) * (speed / spec.wheel_radius)[:, None]


def yaw_from_quat(q: Tensor) -> Tensor:
    """Yaw of wxyz quaternions `(N, 4)`."""
    w, x, y, z = q.unbind(-1)
    return torch.atan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))


class GenesisPhysics:
    """Batched Genesis car; one scene per env object (built in the constructor)."""

    name = "genesis"

    def __init__(self, cfg, device: torch.device, track=None) -> None:
        self.cfg, self.spec, self.device = cfg, cfg.car, torch.device(device)
        self.num_envs = cfg.num_envs
        self.dt = cfg.dt_physics
        gs = init_genesis(self.device, cfg.genesis)
        self.gs = gs
        # Per-env link masses need batched link info; gains are shared by all envs, so dof info is not batched. Four
        # sphere contacts need no contact pruning. The steering servo never drives the hinges to their limits (the
        # inner Ackermann angle at full lock is ~0.68 rad), so joint-limit rows are left out, and Newton converges on
        # four point contacts in a few iterations (cheaper steps for cars at rest; no measurable change while
        # driving, where the solver already stops early).
        self.scene = gs.Scene(
            sim_options=gs.options.SimOptions(dt=self.dt, substeps=1),
            rigid_options=gs.options.RigidOptions(
                enable_self_collision=False, batch_links_info=True, batch_dofs_info=False, max_collision_pairs=16,
                contact_pruning_tolerance=None, enable_joint_limit=False, iterations=10,
            ),
            show_viewer=False,
        )  # fmt: skip
        self.plane = self.scene.add_entity(gs.morphs.Plane(), material=gs.materials.Rigid(friction=GROUND_FRICTION))
        urdf = Path(tempfile.gettempdir()) / f"gapbridge_car_{os.getpid()}_{id(self)}.urdf"
        urdf.write_text(car_urdf(self.spec))
        self.car = self.scene.add_entity(
            gs.morphs.URDF(file=str(urdf), pos=(0, 0, self.spec.wheel_radius), default_armature=1e-4),
            material=gs.materials.Rigid(friction=1.0),
        )
        self.scene.build(n_envs=self.num_envs)
        urdf.unlink(missing_ok=True)
        names = ("front_left_steer", "front_right_steer", "rear_left_spin", "rear_right_spin", "front_left_spin",
                 "front_right_spin")  # fmt: skip
        j = {name: self.car.get_joint(name).dofs_idx_local[0] for name in names}
        self.steer_dofs = [j["front_left_steer"], j["front_right_steer"]]
        self.steer_qs = [self.car.get_joint(n).qs_idx_local[0] for n in ("front_left_steer", "front_right_steer")]
        self.drive_dofs = [j["rear_left_spin"], j["rear_right_spin"]]
        self.free_dofs = [j["front_left_spin"], j["front_right_spin"]]
        if self.spec.drivetrain == "all":
            self.drive_dofs, self.free_dofs = self.drive_dofs + self.free_dofs, []
        wheels = [self.car.get_link(n) for n in ("front_left_wheel", "front_right_wheel", "rear_left_wheel",
                                                  "rear_right_wheel")]  # fmt: skip
        # The tyres' collision geoms (solver indices), written straight through the solver: the entity's
        # `set_friction_ratio` spreads link values over geoms with an int32 `repeat_interleave`, which is slow on a
        # busy CPU where int64 repeats are not.
        self.wheel_geoms = [g for link in wheels for g in range(link.geom_start, link.geom_end)]
        if len(self.wheel_geoms) != len(wheels):
            raise RuntimeError(f"expected one collision geom per wheel, got {len(self.wheel_geoms)} for 4 wheels")
        self.car.set_dofs_kp(torch.full((2,), 20.0), self.steer_dofs)
        self.car.set_dofs_kv(torch.full((2,), 0.5), self.steer_dofs)
        self.car.set_dofs_kv(torch.full((len(self.drive_dofs),), 0.05), self.drive_dofs)
        # Motor torque as the real drivetrain delivers it: enough for the car's acceleration and braking limits
        # (with a margin), not the unbounded force a stiff velocity servo would apply to a sliding tyre.
        spec = self.spec
        torque = 1.25 * spec.mass * max(spec.max_accel, spec.max_brake) * spec.wheel_radius / len(self.drive_dofs)
        limit = torch.full((len(self.drive_dofs),), torque)
        self.car.set_dofs_force_range(-limit, limit, self.drive_dofs)
        if self.free_dofs:
            self.car.set_dofs_damping(torch.full((len(self.free_dofs),), 1e-4), self.free_dofs)
        # Nominal link masses (every env is still at them here); `set_params` scales them per env.
        self.nominal_masses = self.car.get_links_mass().reshape(-1, self.car.n_links)[0].clone()
        self.car_links = list(range(self.car.link_start, self.car.link_start + self.car.n_links))
        self.params = CarParams.nominal(self.num_envs, self.device)
        self.speed_state = torch.zeros(self.num_envs, device=self.device)  # motor lag state
        self._state: CarState | None = None  # read from the solver on demand (see `state`)

    @property
    def state(self) -> CarState:
        """The planar car state, read from the solver the first time it is asked for after a step."""
        if self._state is None:
            self._state = self._read_state()
        return self._state

    # -------------------------------------------------------------------------------------------- interface
    def reset(self, env_ids: Tensor, x: Tensor, y: Tensor, yaw: Tensor, speed: Tensor) -> None:
        ids = env_ids.to(self.device)
        z = torch.full_like(x, self.spec.wheel_radius + 0.002)
        half = 0.5 * yaw
        # One write of the whole configuration (free base: position, wxyz quaternion; then the joints at zero).
        qpos = torch.zeros(len(ids), self.car.n_qs, device=x.device)
        qpos[:, 0], qpos[:, 1], qpos[:, 2] = x, y, z
        qpos[:, 3], qpos[:, 6] = torch.cos(half), torch.sin(half)
        self.car.set_qpos(qpos, envs_idx=ids, zero_velocity=True)
        self.speed_state[ids] = speed
        self._state = None

    def set_params(self, params: CarParams, env_ids: Tensor) -> None:
        for f in fields(CarParams):
            getattr(self.params, f.name)[env_ids] = getattr(params, f.name)[env_ids]
        ids = env_ids.to(self.device)
        ratio = self.params.friction[ids][:, None].expand(-1, len(self.wheel_geoms))
        self.car.solver.set_geoms_friction_ratio(ratio, self.wheel_geoms, envs_idx=ids)
        # The whole car scales, the inertia of every link with its mass (a heavier car of the same shape), as the
        # bicycle model scales mass and yaw inertia together.
        masses = self.nominal_masses[None, :] * self.params.mass_scale[ids][:, None]
        self.car.solver.set_links_mass(masses, self.car_links, envs_idx=ids, scale_inertia=True)

    def step(self, steer_cmd: Tensor, speed_cmd: Tensor) -> CarState:
        """One physics substep; returns the new state."""
        self.advance(steer_cmd, speed_cmd)
        return self.state

    def advance(self, steer_cmd: Tensor, speed_cmd: Tensor) -> None:
        """One physics substep without reading the state back (the env reads it once per control step)."""
        steer_t, speed_t = actuator_targets(steer_cmd, speed_cmd, self.params, self.spec)
        # The same drivetrain as the bicycle model: first-order lag, acceleration and braking limited.
        spec = self.spec
        accel = ((speed_t - self.speed_state) / spec.motor_time_constant).clamp(-spec.max_brake, spec.max_accel)
        self.speed_state = self.speed_state + accel * self.dt
        left, right = ackermann(steer_t, self.spec)
        wheel_speeds = differential(self.speed_state, steer_t, self.spec)[:, : len(self.drive_dofs)]
        self.car.control_dofs_position(torch.stack([left, right], -1), self.steer_dofs)
        self.car.control_dofs_velocity(wheel_speeds, self.drive_dofs)
        self.scene.step(update_visualizer=False)
        self._state = None

    def pose(self) -> Tensor:
        """`(N, 3)` world pose (x, y, yaw) of every car, without the velocities."""
        qpos = self.car.get_qpos()
        return torch.stack([qpos[:, 0], qpos[:, 1], yaw_from_quat(qpos[:, 3:7])], -1).to(self.device)

    def _read_state(self) -> CarState:
        # Two reads of the solver: the configuration (free base position and wxyz quaternion first, then the joints)
        # and the dof velocities (free base: world linear velocity, then angular velocity; yaw rate about z).
        qpos, qvel = self.car.get_qpos(), self.car.get_dofs_velocity()
        yaw = yaw_from_quat(qpos[:, 3:7])
        c, s = torch.cos(yaw), torch.sin(yaw)
        steer = qpos[:, self.steer_qs].mean(-1)
        return CarState(
            qpos[:, 0].to(self.device), qpos[:, 1].to(self.device), yaw.to(self.device),
            (c * qvel[:, 0] + s * qvel[:, 1]).to(self.device), (-s * qvel[:, 0] + c * qvel[:, 1]).to(self.device),
            qvel[:, 5].to(self.device), steer.to(self.device),
        )  # fmt: skip

    def state_dict(self) -> dict[str, Tensor]:
        return {
            "qpos": self.car.get_qpos().clone(),
            "dofs_vel": self.car.get_dofs_velocity().clone(),
            "speed_state": self.speed_state.clone(),
            **{f"params.{f.name}": getattr(self.params, f.name).clone() for f in fields(CarParams)},
        }

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        load_params(self.params, state)
        self.set_params(self.params, torch.arange(self.num_envs, device=self.device))
        self.car.set_qpos(state["qpos"])
        self.car.set_dofs_velocity(state["dofs_vel"])
        self.speed_state.copy_(state["speed_state"])
        self._state = None

    def close(self) -> None:
        if getattr(self, "scene", None) is not None:
            try:
                self.scene.destroy()
            except Exception:
                pass
            self.scene = None
