"""A scripted privileged driver: pure pursuit on the `teacher` group's lookahead points with a curvature speed plan.

It needs no training and drives every track in both directions, so it is the baseline every learned policy is
compared with and the driver of the scripted demo and backend checks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from envs.racing.car import ActionSpace, CarSpec
from envs.racing.randomization import FACTOR_NAMES, denormalize_factor

GRAVITY = 9.81


@dataclass(frozen=True)
class PurePursuitConfig:
    """Gains of the scripted driver."""

    lookahead_base: float = 0.35
    """pursuit distance at standstill (m)"""
    lookahead_gain: float = 0.25
    """extra pursuit distance per m/s (m)"""
    friction: float = 1.0
    """friction the speed plan assumes"""
    grip_margin: float = 0.8
    """fraction of the friction limit the speed plan uses"""
    brake: float = 3.0
    """deceleration the speed plan assumes (m/s^2)"""


class PurePursuitDriver:
    """Maps `teacher` observations to actions of the env's action space."""

    def __init__(
        self,
        action_space: ActionSpace,
        spec: CarSpec,
        lookahead_points: int,
        lookahead_spacing: float,
        cfg: PurePursuitConfig | None = None,
    ) -> None:
        self.space, self.spec, self.cfg = action_space, spec, cfg or PurePursuitConfig()
        self.k, self.spacing = lookahead_points, lookahead_spacing
        self.max_speed = action_space.max_speed

    def targets(
        self, teacher_obs: Tensor, friction: Tensor | float | None = None, latency: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Desired (steering rad, speed m/s) per env `(N,)`.

        `friction` (per env) overrides the configured one; `latency` (seconds per env) shifts the lookahead points
        into the pose the car will have when the command takes effect.
        """
        cfg, k = self.cfg, self.k
        horizon = k * self.spacing
        pts = teacher_obs[:, : 2 * k].reshape(-1, k, 2) * horizon  # (N, K, 2) car frame
        speed = teacher_obs[:, 2 * k + 3] * self.max_speed
        if latency is not None:
            yaw_rate = teacher_obs[:, 2 * k + 5] * 5.0
            turn = (yaw_rate * latency)[:, None]
            travel = (speed * latency)[:, None]
            shifted = pts - torch.stack([travel * torch.cos(turn / 2), travel * torch.sin(turn / 2)], -1)
            c, s = torch.cos(turn), torch.sin(turn)
            pts = torch.stack(
                [c * shifted[..., 0] + s * shifted[..., 1], -s * shifted[..., 0] + c * shifted[..., 1]], -1
            )
        ld = cfg.lookahead_base + cfg.lookahead_gain * speed
        idx = (ld / self.spacing - 1.0).round().long().clamp(0, k - 1)
        target = pts.gather(1, idx[:, None, None].expand(-1, 1, 2)).squeeze(1)
        dist2 = target.square().sum(-1).clamp(min=1e-4)
        curvature = 2.0 * target[:, 1] / dist2
        steer = torch.atan(self.spec.wheelbase * curvature)

        # Speed plan: friction-limited speed at each lookahead point, reachable by braking from here.
        seg = pts[:, 1:] - pts[:, :-1]
        heading = torch.atan2(seg[..., 1], seg[..., 0])
        turn = torch.remainder(heading[:, 1:] - heading[:, :-1] + math.pi, 2 * math.pi) - math.pi
        kappa = (turn.abs() / self.spacing).clamp(min=1e-3)  # (N, K-2)
        mu = cfg.friction if friction is None else friction
        mu = mu[:, None] if isinstance(mu, Tensor) else mu
        v_corner = torch.sqrt(cfg.grip_margin * mu * GRAVITY / kappa)
        # Conservative: the curvature at lookahead point j is treated as if it started j spacings earlier.
        dist = torch.arange(0, k - 2, device=pts.device, dtype=pts.dtype) * self.spacing
        v_allowed = torch.sqrt(v_corner.square() + 2.0 * cfg.brake * dist[None, :])
        v_target = v_allowed.min(dim=1).values.clamp(max=self.max_speed)
        return steer.clamp(-self.spec.max_steering, self.spec.max_steering), v_target

    def act(self, obs) -> Tensor:
        """Actions `(N, num_actions)` from the env's observations: the `teacher` group, and the true friction and
        action latency from `env_factors` when present (the driver is privileged)."""
        friction = latency = None
        if "env_factors" in obs.keys():
            factors = obs["env_factors"]
            friction = denormalize_factor("friction", factors[:, FACTOR_NAMES.index("friction")])
            latency = denormalize_factor("action_latency", factors[:, FACTOR_NAMES.index("action_latency")])
        steer, speed = self.targets(obs["teacher"], friction, latency)
        if self.space.kind == "continuous":
            lo, hi = (math.radians(v) for v in self.space.steering_range)
            a0 = (steer - lo) / (hi - lo) * 2.0 - 1.0
            s_lo, s_hi = self.space.speed_range
            a1 = (speed - s_lo) / (s_hi - s_lo) * 2.0 - 1.0
            return torch.stack([a0, a1], -1).clamp(-1.0, 1.0)
        table = self.space.table(steer.device)  # (A, 2)
        # Nearest steering angle first; among those, the fastest speed not above the plan (else the slowest).
        d_steer = (table[None, :, 0] - steer[:, None]).abs()
        best_steer = d_steer.min(dim=1, keepdim=True).values
        steer_ok = d_steer <= best_steer + 1e-6
        speed_ok = table[None, :, 1] <= speed[:, None] + 1e-6
        score = (
            table[None, :, 1] + 100.0 * (steer_ok & speed_ok) - 1000.0 * ~steer_ok - table[None, :, 1] * 2 * ~speed_ok
        )
        return score.argmax(dim=1, keepdim=True).float()


def pure_pursuit_cars(env_cfg, envs: int, seed: int = 0, cfg: PurePursuitConfig | None = None):
    """`envs` cars of `env_cfg`'s camera world (the ray-cast camera, eager kernels, seeded) and the pure-pursuit
    driver for them: the drive on which odometry's errors are measured."""
    from dataclasses import replace

    from envs.racing.env import RacingEnv

    env = RacingEnv(replace(env_cfg, num_envs=envs, camera="projective", compile=False, seed=seed))
    driver = PurePursuitDriver(
        env.action_space, env.cfg.car, env.cfg.obs.lookahead_points, env.cfg.obs.lookahead_spacing, cfg
    )
    return env, driver
