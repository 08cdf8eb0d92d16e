"""Reward and termination terms: pure functions of tensors, combined by weights from `RewardConfig`."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from envs.errors import check_range


@dataclass(frozen=True)
class RewardConfig:
    """Weights of the reward terms; the total is their weighted sum per control step."""

    centerline: float = 0.0
    """weight of DeepRacer's default centerline reward (1.0 / 0.5 / 0.1 / 1e-3 by distance from center)"""
    progress: float = 1.0
    """weight of the progress reward: metres advanced along the travel direction, divided by (max speed * dt)"""
    speed: float = 0.0
    """weight of speed / max speed"""
    offtrack: float = -50.0
    """reward on the step the car leaves the track"""
    steering_rate: float = 0.0
    """weight of the squared change of the normalized steering command (smoothness)"""
    edge: float = 0.5
    """weight of the edge penalty: quadratic in how far the car is beyond `edge_start` of the half width"""
    edge_start: float = 0.7
    """fraction of the half width where the edge penalty starts (margin kept for noise, latency and a student)"""
    deepracer_function: str = ""
    """path to a DeepRacer console reward file (`def reward_function(params)`); when set it replaces the terms
    above, run unchanged once per env and step (slow: for porting and checking reward functions)"""

    def __post_init__(self) -> None:
        for name in ("centerline", "progress", "speed", "steering_rate"):
            check_range(f"reward.{name}", getattr(self, name), -100.0, 100.0)
        check_range("reward.offtrack", self.offtrack, -1000.0, 0.0)
        check_range("reward.edge", self.edge, 0.0, 100.0)
        check_range("reward.edge_start", self.edge_start, 0.0, 1.0)


@dataclass(frozen=True)
class TerminationConfig:
    """When an episode ends."""

    episode_seconds: float = 20.0
    """time limit (truncation, not a failure)"""
    laps: int = 0
    """end the episode (successfully) after this many laps; 0 = run to the time limit"""
    stuck_seconds: float = 2.0
    """terminate when the car has made less than `stuck_distance` progress for this long"""
    stuck_distance: float = 0.1
    """metres of progress that count as moving"""

    def __post_init__(self) -> None:
        check_range("termination.episode_seconds", self.episode_seconds, 0.5, 3600.0)
        check_range("termination.laps", self.laps, 0, 1000)
        check_range("termination.stuck_seconds", self.stuck_seconds, 0.2, 600.0)
        check_range("termination.stuck_distance", self.stuck_distance, 0.0, 10.0)


def centerline_reward(distance_from_center: Tensor, track_width: Tensor) -> Tensor:
    """DeepRacer's default reward: 1.0 within 10% of the width, 0.5 within 25%, 0.1 within 50%, else 1e-3."""
    d = distance_from_center.abs()
    reward = torch.full_like(d, 1e-3)
    reward = torch.where(d <= 0.5 * track_width, torch.full_like(d, 0.1), reward)
    reward = torch.where(d <= 0.25 * track_width, torch.full_like(d, 0.5), reward)
    return torch.where(d <= 0.1 * track_width, torch.ones_like(d), reward)


def progress_reward(delta_distance: Tensor, max_speed: float, dt: float) -> Tensor:
    """Metres advanced along the travel direction this step, normalized so driving at max speed gives 1."""
    return delta_distance / (max_speed * dt)


def speed_reward(speed: Tensor, max_speed: float) -> Tensor:
    return speed / max_speed


def steering_rate_penalty(steer_norm: Tensor, prev_steer_norm: Tensor) -> Tensor:
    return -(steer_norm - prev_steer_norm).square()


def edge_penalty(offset: Tensor, half_width: Tensor, start: float) -> Tensor:
    """0 inside `start` of the half width, growing quadratically to 1 at the edge (and beyond)."""
    excess = ((offset.abs() / half_width - start) / max(1.0 - start, 1e-6)).clamp(min=0.0)
    return -excess.square()


def is_offtrack(offset: Tensor, half_width: Tensor, car_half_track: float) -> Tensor:
    """DeepRacer's off-track: all four wheels outside the borders (the centre beyond the border by half a track)."""
    return offset.abs() - car_half_track > half_width


def total_reward(
    cfg: RewardConfig,
    delta_distance: Tensor,
    offset: Tensor,
    half_width: Tensor,
    speed: Tensor,
    offtrack: Tensor,
    steer_norm: Tensor,
    prev_steer_norm: Tensor,
    max_speed: float,
    dt: float,
) -> Tensor:
    reward = cfg.progress * progress_reward(delta_distance, max_speed, dt)
    if cfg.centerline:
        reward = reward + cfg.centerline * centerline_reward(offset, 2.0 * half_width)
    if cfg.speed:
        reward = reward + cfg.speed * speed_reward(speed, max_speed)
    if cfg.steering_rate:
        reward = reward + cfg.steering_rate * steering_rate_penalty(steer_norm, prev_steer_norm)
    if cfg.edge:
        reward = reward + cfg.edge * edge_penalty(offset, half_width, cfg.edge_start)
    return torch.where(offtrack, torch.full_like(reward, cfg.offtrack), reward)
