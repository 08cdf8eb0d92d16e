"""Dynamic single-track (bicycle) car model in pure torch, batched over envs.

Lateral dynamics use linear tire cornering stiffness with smooth friction saturation (tanh, so the force never
exceeds mu * load) and a friction circle that shrinks lateral grip when the drivetrain pushes; below a blend speed
the state is pulled to the kinematic bicycle (slip angles are singular at standstill). The stiff lateral/yaw
subsystem is integrated linearly-implicitly (one 2x2 solve per env), so a 1/60 s substep is stable at any speed.
Steering servo and motor are first-order lags, discretized exactly.

Everything here is a pure function of tensors; `BicyclePhysics` only holds the state between control steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
from torch import Tensor

from envs.jit import maybe_compile
from envs.racing.car import CarSpec

GRAVITY = 9.81


@dataclass
class CarState:
    """Planar car state, each `(N,)`: world pose, body-frame velocities, actual steering angle."""

    x: Tensor
    y: Tensor
    yaw: Tensor
    vx: Tensor  # longitudinal speed (m/s), >= 0
    vy: Tensor  # lateral speed, + left (m/s)
    yaw_rate: Tensor  # rad/s
    steer: Tensor  # actual front-wheel angle (rad)

    @classmethod
    def zeros(cls, num_envs: int, device: str | torch.device = "cpu") -> CarState:
        return cls(*(torch.zeros(num_envs, device=device) for _ in fields(cls)))

    def clone(self) -> CarState:
        return CarState(*(getattr(self, f.name).clone() for f in fields(self)))

    @property
    def speed(self) -> Tensor:
        return torch.hypot(self.vx, self.vy)


@dataclass
class CarParams:
    """Per-env physical parameters `(N,)`, sampled by the randomization at reset."""

    friction: Tensor
    mass_scale: Tensor
    motor_gain: Tensor
    steering_gain: Tensor
    steering_offset: Tensor  # radians
    rear_grip: Tensor  # rear-axle friction relative to the front's: < 1 makes the car oversteer at the limit

    @classmethod
    def nominal(cls, num_envs: int, device: str | torch.device = "cpu") -> CarParams:
        one = torch.ones(num_envs, device=device)
        zero = torch.zeros(num_envs, device=device)
        return cls(one.clone(), one.clone(), one.clone(), one.clone(), zero, one.clone())


def load_params(params: CarParams, state: dict[str, Tensor]) -> None:
    """Copy the `params.<field>` entries of a state dict into `params`."""
    for f in fields(CarParams):
        getattr(params, f.name).copy_(state[f"params.{f.name}"])


def actuator_targets(steer_cmd: Tensor, speed_cmd: Tensor, params: CarParams, spec: CarSpec) -> tuple[Tensor, Tensor]:
    """Commanded (steering, speed) -> servo and motor targets after per-car gains and offset."""
    limit = spec.max_steering
    steer = (params.steering_gain * steer_cmd + params.steering_offset).clamp(-limit, limit)
    return steer, params.motor_gain * speed_cmd


def kinematic_lateral(vx: Tensor, steer: Tensor, spec: CarSpec) -> tuple[Tensor, Tensor]:
    """Kinematic bicycle lateral speed and yaw rate at the centre of gravity for longitudinal speed vx."""
    tan_d = torch.tan(steer)
    return vx * tan_d * (spec.cg_to_rear / spec.wheelbase), vx * tan_d / spec.wheelbase


def lag_decay(dt: float, time_constant: float | Tensor) -> float | Tensor:
    """exp(-dt / tau): what is left of a first-order lag's error after `dt`; a tensor of per-env time constants
    (the dynamics fit's) gives a tensor."""
    if isinstance(time_constant, Tensor):
        return torch.exp(-dt / time_constant)
    return math.exp(-dt / time_constant)


def bicycle_step(
    state: CarState,
    steer_target: Tensor,
    speed_target: Tensor,
    params: CarParams,
    spec: CarSpec,
    dt: float,
    blend_speeds: tuple[float, float] = (0.25, 0.75),
) -> CarState:
    """Advance the car by one physics substep of `dt` seconds; returns a new state."""
    lf, lr = spec.cg_to_front, spec.cg_to_rear
    mass = spec.mass * params.mass_scale
    inertia = spec.yaw_inertia * params.mass_scale
    grip = params.friction * GRAVITY  # max tire acceleration (mu g)

    # Actuators: exact first-order lags.
    steer = steer_target + (state.steer - steer_target) * lag_decay(dt, spec.steering_time_constant)
    accel = ((speed_target - state.vx) / spec.motor_time_constant).clamp(-spec.max_brake, spec.max_accel)
    accel = torch.maximum(torch.minimum(accel, grip), -grip)

    # Axle loads and the lateral grip left after the longitudinal force (friction circle, per axle: the drive and
    # brake forces are shared equally, and the rear axle's friction is `rear_grip` times the front's).
    load_f, load_r = mass * GRAVITY * lr / spec.wheelbase, mass * GRAVITY * lf / spec.wheelbase
    fmax_f = params.friction * load_f * torch.sqrt(1.0 - (accel / grip).square().clamp(max=0.99))
    grip_r = grip * params.rear_grip
    fmax_r = params.friction * params.rear_grip * load_r * torch.sqrt(1.0 - (accel / grip_r).square().clamp(max=0.99))
    c_f, c_r = spec.cornering_stiffness * load_f, spec.cornering_stiffness * load_r

    vx = state.vx.clamp(min=0.05)
    vy, r = state.vy, state.yaw_rate
    uf, ur = vy + lf * r, vy - lr * r
    alpha_f = steer - torch.atan2(uf, vx)
    alpha_r = -torch.atan2(ur, vx)
    th_f = torch.tanh(c_f * alpha_f / fmax_f)
    th_r = torch.tanh(c_r * alpha_r / fmax_r)
    fy_f, fy_r = fmax_f * th_f, fmax_r * th_r
    k_f, k_r = c_f * (1.0 - th_f.square()), c_r * (1.0 - th_r.square())  # local tire slopes dF/dalpha
    g_f, g_r = vx / (vx.square() + uf.square()), vx / (vx.square() + ur.square())  # -dalpha/du
    cos_d = torch.cos(steer)

    # f(vy, r) and its Jacobian; one linearly-implicit Euler step (I - dt J) delta = dt f.
    f1 = (fy_f * cos_d + fy_r) / mass - state.vx * r
    f2 = (lf * fy_f * cos_d - lr * fy_r) / inertia
    kf_c = k_f * cos_d
    j11 = -(kf_c * g_f + k_r * g_r) / mass
    j12 = (-kf_c * lf * g_f + k_r * lr * g_r) / mass - state.vx
    j21 = (-lf * kf_c * g_f + lr * k_r * g_r) / inertia
    j22 = -(lf * lf * kf_c * g_f + lr * lr * k_r * g_r) / inertia
    a, b, c, d = 1.0 - dt * j11, -dt * j12, -dt * j21, 1.0 - dt * j22
    det = a * d - b * c
    vy_dyn = vy + dt * (d * f1 - b * f2) / det
    r_dyn = r + dt * (a * f2 - c * f1) / det

    new_vx = (state.vx + dt * (accel - fy_f * torch.sin(steer) / mass + vy * r)).clamp(min=0.0)

    # Blend toward the kinematic model at low speed.
    w = ((new_vx - blend_speeds[0]) / (blend_speeds[1] - blend_speeds[0])).clamp(0.0, 1.0)
    vy_kin, r_kin = kinematic_lateral(new_vx, steer, spec)
    new_vy = w * vy_dyn + (1.0 - w) * vy_kin
    new_r = w * r_dyn + (1.0 - w) * r_kin

    # Semi-implicit position update with the new velocities.
    yaw_mid = state.yaw + 0.5 * dt * new_r
    cy, sy = torch.cos(yaw_mid), torch.sin(yaw_mid)
    x = state.x + dt * (new_vx * cy - new_vy * sy)
    y = state.y + dt * (new_vx * sy + new_vy * cy)
    yaw = torch.remainder(state.yaw + dt * new_r + math.pi, 2.0 * math.pi) - math.pi
    return CarState(x, y, yaw, new_vx, new_vy, new_r, steer)


class BicyclePhysics:
    """The fast physics backend: holds the batched `CarState` and steps it with `bicycle_step`."""

    name = "bicycle"

    def __init__(
        self, num_envs: int, spec: CarSpec, dt: float, device: str | torch.device = "cpu", compile: bool = False
    ) -> None:
        self.num_envs, self.spec, self.dt, self.device = num_envs, spec, dt, torch.device(device)
        self._step = maybe_compile(bicycle_step, compile)
        self.state = CarState.zeros(num_envs, self.device)
        self.params = CarParams.nominal(num_envs, self.device)

    def reset(self, env_ids: Tensor, x: Tensor, y: Tensor, yaw: Tensor, speed: Tensor) -> None:
        """Place `env_ids` (long `(M,)`) at the given poses (each `(M,)`), driving straight at `speed`."""
        zero = torch.zeros_like(x)
        new = CarState(x, y, yaw, speed, zero, zero, zero)
        for f in fields(CarState):
            getattr(self.state, f.name)[env_ids] = getattr(new, f.name)

    def set_params(self, params: CarParams, env_ids: Tensor) -> None:
        """Take the physical parameters of `env_ids` from `params` (full `(N,)` tensors)."""
        for f in fields(CarParams):
            getattr(self.params, f.name)[env_ids] = getattr(params, f.name)[env_ids]

    def state_dict(self) -> dict[str, Tensor]:
        out = {f"state.{f.name}": getattr(self.state, f.name).clone() for f in fields(CarState)}
        out.update({f"params.{f.name}": getattr(self.params, f.name).clone() for f in fields(CarParams)})
        return out

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        self.state = CarState(*(state[f"state.{f.name}"].clone() for f in fields(CarState)))
        load_params(self.params, state)

    def step(self, steer_cmd: Tensor, speed_cmd: Tensor) -> CarState:
        """One physics substep from commanded (post-latency) steering and speed."""
        steer_t, speed_t = actuator_targets(steer_cmd, speed_cmd, self.params, self.spec)
        self.state = self._step(self.state, steer_t, speed_t, self.params, self.spec, self.dt)
        return self.state

    advance = step

    def pose(self) -> Tensor:
        """`(N, 3)` world pose (x, y, yaw)."""
        return torch.stack([self.state.x, self.state.y, self.state.yaw], dim=-1)
