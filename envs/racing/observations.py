"""Observation terms: pure functions of the env state, each returning `(N, D)` float tensors."""

from __future__ import annotations

import torch
from torch import Tensor

from envs.racing.car import CarSpec
from envs.racing.physics_bicycle import CarState
from envs.racing.track import Track


def teacher_dim(lookahead_points: int) -> int:
    return 2 * lookahead_points + 9


def teacher_observation(
    track: Track,
    state: CarState,
    s: Tensor,
    direction: Tensor,
    offset: Tensor,
    heading_error: Tensor,
    half_width: Tensor,
    prev_action: Tensor,
    obs_cfg,
    spec: CarSpec,
    max_speed: float,
) -> Tensor:
    """Ground truth the real car never sees, in the travel frame, scaled to roughly unit range: `(N, 2K + 9)`.

    Lookahead centerline points in the car frame (divided by the lookahead horizon), lateral offset / half width,
    sin and cos of the heading error, longitudinal and lateral speed / max speed, yaw rate / 5 rad/s, current
    steering angle / max steering, previous normalized action (steering, speed).
    """
    xy = torch.stack([state.x, state.y], -1)
    horizon = obs_cfg.lookahead_points * obs_cfg.lookahead_spacing
    ahead = track.lookahead(xy, state.yaw, s, direction, obs_cfg.lookahead_points, obs_cfg.lookahead_spacing)
    scalars = torch.stack(
        [
            offset / half_width,
            torch.sin(heading_error),
            torch.cos(heading_error),
            state.vx / max_speed,
            state.vy / max_speed,
            state.yaw_rate / 5.0,
            state.steer / spec.max_steering,
        ],
        dim=-1,
    )
    return torch.cat([ahead.reshape(ahead.shape[0], -1) / horizon, scalars, prev_action], dim=-1)


def imu_reading(state: CarState, accel: Tensor, noise: float, generator: torch.Generator) -> Tensor:
    """Noisy IMU `(N, 3)`: yaw rate / 5 rad/s, longitudinal and lateral acceleration / 10 m/s^2."""
    clean = torch.stack([state.yaw_rate / 5.0, accel[:, 0] / 10.0, accel[:, 1] / 10.0], dim=-1)
    return clean + noise * torch.randn(clean.shape, generator=generator, device=clean.device)
