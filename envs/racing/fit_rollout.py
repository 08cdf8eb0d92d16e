"""The dynamics fit's model: a drive log cut into short windows (`make_windows`) and their batched, differentiable
rollout (`rollout`) under many parameter sets at once: the training sim's command map, action delay, servo slew,
gains and trim (`actuator_targets`) and bicycle model (`bicycle_step`, through `fit_step`), compared with the log's
frame-to-frame motions as the planar odometry measures them (`window_losses`). `envs.racing.dynamics_calibration`
runs the fit over it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from envs.param_fit import ParamBox, huber
from envs.racing.calibration_drive import DegenerateLogError, DriveLog
from envs.racing.car import CarSpec
from envs.racing.physics_bicycle import GRAVITY, CarParams, CarState, actuator_targets, bicycle_step

PARAMS = ParamBox(
    names=("motor_gain", "motor_time_constant", "throttle_exponent", "steering_gain", "steering_offset_deg",
           "steering_time_constant", "friction", "servo_slew", "battery_sag_per_minute", "steering_deadband_deg",
           "cornering_stiffness", "max_accel", "max_brake", "turn_drag", "steering_cubic"),
    low=(0.5, 0.03, 0.5, 0.5, -8.0, 0.01, 0.3, 0.0, 0.0, 0.0, 3.0, 1.0, 1.0, 0.0, -0.3),
    high=(1.5, 0.8, 2.0, 1.5, 8.0, 0.3, 2.0, 0.5, 0.2, 4.0, 60.0, 10.0, 15.0, 2.0, 0.3),
)  # fmt: skip
"""fitted parameters and their search boxes; `servo_slew` is the inverse slew rate (s per rad of command, 0 =
unlimited; its gradient is zero where the servo keeps up, so the fit starts it at SLEW_START), the battery sag is the
motor gain lost per minute of the log; the last five describe the car where the training sim's defaults do not
(tyre cornering stiffness, acceleration and braking limits: `CarSpec` fields; `turn_drag` and `steering_cubic`:
`NUISANCE`)"""
SPEC_FIELDS = ("motor_time_constant", "steering_time_constant", "cornering_stiffness", "max_accel", "max_brake")
"""fitted parameters that are `CarSpec` constants in the training sim"""
MOTION_SCALE = (0.01, 0.01, 0.01)
"""residual scale of the frame-to-frame motion: forward (m), left (m), yaw (rad)"""


@dataclass
class Windows:
    """Log windows in one batch: first row `(Nw,)`, measured body velocity at it `(Nw, 3)`, the measured motions
    that count `(Nw, W, 3)`, the segment of each window `(Nw,)`, and the log's commands (rad, m/s) `(T,)`."""

    start: Tensor
    init_velocity: Tensor
    motion: Tensor
    segment: Tensor
    steer: Tensor
    speed: Tensor
    burn_in: int
    length: int


class SpecView:
    """A `CarSpec` whose fitted constants (`SPEC_FIELDS`) are per-env tensors (what `bicycle_step` reads)."""

    def __init__(self, spec: CarSpec, **per_env: Tensor) -> None:
        for name in ("wheelbase", "cg_to_front", "cg_to_rear", "mass", "yaw_inertia", "max_steering", "max_speed",
                     *SPEC_FIELDS):  # fmt: skip
            setattr(self, name, per_env.get(name, getattr(spec, name)))


def frame_motion(before: Tensor, after: Tensor) -> Tensor:
    """Planar poses `(..., 3)` -> the motion between them `(..., 3)`: forward and left displacement in the first
    pose's frame and the wrapped yaw change (the planar odometry's convention)."""
    d = after[..., :2] - before[..., :2]
    c, s = torch.cos(before[..., 2]), torch.sin(before[..., 2])
    dyaw = torch.remainder(after[..., 2] - before[..., 2] + math.pi, 2 * math.pi) - math.pi
    return torch.stack([c * d[..., 0] + s * d[..., 1], -s * d[..., 0] + c * d[..., 1], dyaw], -1)


def body_velocity(motion: Tensor, dt: float) -> Tensor:
    """Frame motions `(..., 3)` -> body-frame speed, lateral speed and yaw rate at mid-interval `(..., 3)`."""
    c, s = torch.cos(-0.5 * motion[..., 2]), torch.sin(-0.5 * motion[..., 2])
    vx = c * motion[..., 0] - s * motion[..., 1]
    vy = s * motion[..., 0] + c * motion[..., 1]
    return torch.stack([vx, vy, motion[..., 2]], -1) / dt


def make_windows(log: DriveLog, valid: np.ndarray, burn_in: int, length: int) -> Windows:
    """Consecutive windows of `burn_in + length` transitions, each starting where the last one's counted motions
    began; a window with any invalid transition (`valid` `(T-1,)` False: a dropped frame, an unknown motion) is
    left out."""
    motion = torch.as_tensor(np.nan_to_num(log.motion), dtype=torch.float32)
    dt = float(np.median(np.diff(log.time)))
    starts, span, n = [], burn_in + length, len(log.motion)
    for a in range(0, n - span + 1, length):
        if valid[a : a + span].all() and (a == 0 or valid[a - 1]):
            starts.append(a)
    if not starts:
        raise DegenerateLogError(f"no stretch of {span} consecutive frames without a gap: nothing to fit")
    start = torch.tensor(starts)
    init = 0.5 * (body_velocity(motion[(start - 1).clamp(min=0)], dt) + body_velocity(motion[start], dt))
    counted = torch.stack([motion[a + burn_in : a + span] for a in starts])
    rows = start + burn_in
    return Windows(
        start, init, counted, torch.as_tensor(log.segment[rows.numpy()]),
        torch.as_tensor(np.radians(log.steering_deg), dtype=torch.float32),
        torch.as_tensor(log.speed, dtype=torch.float32), burn_in, length,
    )  # fmt: skip


def fit_step(
    state: CarState, steer_t: Tensor, speed_t: Tensor, params: CarParams, spec: SpecView, dt: float, turn_drag: Tensor
) -> CarState:
    """`bicycle_step` where only the share `turn_drag` `(N,)` of the speed change the lateral dynamics cause (the
    front tyre's drag, the centripetal coupling) reaches the speed: below 1 for a drivetrain that holds its wheels'
    speed through a turn (a velocity-controlled motor), 1 = the bicycle model exactly."""
    new = bicycle_step(state, steer_t, speed_t, params, spec, dt)
    grip = params.friction * GRAVITY
    accel = ((speed_t - state.vx) / spec.motor_time_constant).clamp(-spec.max_brake, spec.max_accel)
    accel = torch.maximum(torch.minimum(accel, grip), -grip)
    lateral = torch.where(new.vx > 0, new.vx - state.vx - dt * accel, torch.zeros_like(new.vx))
    dvx = (turn_drag - 1.0) * lateral
    yaw_mid = state.yaw + 0.5 * dt * new.yaw_rate
    return CarState(new.x + dt * dvx * torch.cos(yaw_mid), new.y + dt * dvx * torch.sin(yaw_mid), new.yaw,
                    (new.vx + dvx).clamp(min=0.0), new.vy, new.yaw_rate, new.steer)  # fmt: skip


def rollout(values: Tensor, latency: Tensor, win: Windows, spec: CarSpec, substeps: int, dt: float) -> Tensor:
    """Predicted frame motions `(P, Nw, W, 3)` of every window under P parameter sets `values` `(P, D)` (physical,
    in `PARAMS` order) with loop latencies `latency` `(P,)` (long, substeps of `dt` seconds)."""
    p_sets, n_win, steps = values.shape[0], len(win.start), (win.burn_in + win.length) * substeps
    v = {name: values[:, i] for i, name in enumerate(PARAMS.names)}
    sub = win.start[None, :, None] * substeps + torch.arange(steps)[None, None, :]  # (1, Nw, M)
    idx = torch.div(sub - latency[:, None, None], substeps, rounding_mode="floor")  # (P, Nw, M)
    known = idx >= 0  # before the log: at rest
    steer = torch.where(known, win.steer[idx.clamp(min=0)], 0.0)
    speed = torch.where(known, win.speed[idx.clamp(min=0)], 0.0)
    deadband = torch.deg2rad(v["steering_deadband_deg"])[:, None, None]
    steer = torch.where(steer.abs() < deadband, torch.zeros_like(steer), steer)
    exponent = v["throttle_exponent"][:, None, None]
    speed = spec.max_speed * (speed / spec.max_speed).clamp(min=1e-6) ** exponent
    steer, speed = steer.flatten(0, 1), speed.flatten(0, 1)  # (N, M), N = P * Nw, set-major

    per_env = {k: t.repeat_interleave(n_win) for k, t in v.items()}
    ones = torch.ones_like(per_env["motor_gain"])
    params = CarParams(
        per_env["friction"], ones, per_env["motor_gain"], per_env["steering_gain"],
        torch.deg2rad(per_env["steering_offset_deg"]), ones,
    )  # fmt: skip
    view = SpecView(spec, **{name: per_env[name] for name in SPEC_FIELDS})
    slew_step = dt / per_env["servo_slew"].clamp(min=1e-4)
    cubic = per_env["steering_cubic"] / spec.max_steering**2
    minutes = idx.clamp(min=0).to(values.dtype) * (dt * substeps / 60.0)  # (P, Nw, M) the command's log time
    speed = speed * (1.0 - v["battery_sag_per_minute"][:, None, None] * minutes).flatten(0, 1)
    init = win.init_velocity.repeat(p_sets, 1)
    zero = torch.zeros_like(ones)
    servo = steer[:, 0]
    first_target, _ = actuator_targets(servo, speed[:, 0], params, view)
    state = CarState(zero, zero, zero, init[:, 0].clamp(min=0.0), init[:, 1], init[:, 2], first_target)
    poses = [torch.stack([zero, zero, zero], -1)]
    for m in range(steps):
        servo = servo + torch.maximum(torch.minimum(steer[:, m] - servo, slew_step), -slew_step)
        steer_t, speed_t = actuator_targets(servo * (1.0 + cubic * servo.square()), speed[:, m], params, view)
        state = fit_step(state, steer_t, speed_t, params, view, dt, per_env["turn_drag"])
        if (m + 1) % substeps == 0:
            poses.append(torch.stack([state.x, state.y, state.yaw], -1))
    track = torch.stack(poses[win.burn_in :], 1)  # (N, W + 1, 3)
    pred = frame_motion(track[:, :-1], track[:, 1:])
    return pred.reshape(p_sets, n_win, win.length, 3)


def window_losses(pred: Tensor, win: Windows) -> Tensor:
    """`(P, Nw)` mean Huber loss of each window's motion residual in units of MOTION_SCALE."""
    scale = torch.tensor(MOTION_SCALE)
    return huber((pred - win.motion[None]) / scale, 3.0).sum(-1).mean(-1)
