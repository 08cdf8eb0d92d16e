"""The scripted privileged expert of the bar lift: IK waypoints and force-closed fingers, as a policy of the env.

Per env, by its episode step: approach above the bar's grasp points with the fingers open and the hands turned across
the bar, descend to the bar's mid-height, close the fingers with a set force, then raise both TCPs to a fixed height
and hold there. It reads the env's true state (the bar's pose, the controller's targets), not the observations, and
returns the env's normalized `(N, 10)` action, so it drives anything that takes a policy `act(obs)`: the task's
evaluation, a dataset writer, a teacher's warm start.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from einops import rearrange
from torch import Tensor

from envs.bimanual.control import clamp_norm, grasp_yaw, quat_rotate, wrap_angle
from envs.bimanual.env import GRASP_MARGIN, BimanualEnv, bar_ends
from envs.errors import check_range


@dataclass(frozen=True)
class ExpertConfig:
    """Waypoint timing and targets of the scripted lift."""

    approach_steps: int = 40
    """control steps moving above the grasp points, fingers open"""
    descend_steps: int = 20
    """control steps lowering the TCPs to the bar's mid-height"""
    close_steps: int = 10
    """control steps closing the fingers in place (then lift and hold to the episode's end)"""
    approach_height: float = 0.10
    """TCP height above the grasp points while approaching (m)"""
    lift_height: float = 0.125
    """how far above its resting height the bar's centre is raised (m)"""
    finger_force: float = -5.0
    """finger force once closed (N; negative closes)"""
    open_force: float = 1.0
    """finger force while open (N)"""

    def __post_init__(self) -> None:
        check_range("expert.approach_steps", self.approach_steps, 1, 1000)
        check_range("expert.descend_steps", self.descend_steps, 1, 1000)
        check_range("expert.close_steps", self.close_steps, 1, 1000)
        check_range("expert.lift_height", self.lift_height, 0.0, 0.5)
        check_range("expert.finger_force", self.finger_force, -20.0, 0.0)


class ScriptedExpert:
    """`act(obs) -> (N, 10)` actions of the scripted lift for every env of `env`, each at its own episode step."""

    def __init__(self, env: BimanualEnv, cfg: ExpertConfig | None = None) -> None:
        self.env, self.cfg = env, cfg or ExpertConfig()

    def __call__(self, obs=None) -> Tensor:
        return self.act(obs)

    def act(self, obs=None) -> Tensor:
        env, cfg, ctrl = self.env, self.cfg, self.env.ctrl
        if not env._state:
            env.get_observations()
        s = env._state
        pos, quat = s["object_pose"][:, :3], s["object_pose"][:, 3:]
        grasp = bar_ends(pos, quat, env.cfg.bar_length / 2 - GRASP_MARGIN)  # (N, 2, 3)
        axis = quat_rotate(quat, torch.tensor([1.0, 0.0, 0.0]).expand_as(pos))
        yaw = grasp_yaw(torch.atan2(axis[:, 1], axis[:, 0]))  # (N, 2)
        t = env.episode_length_buf[:, None]  # (N, 1)
        approach = t < cfg.approach_steps
        closing = t >= cfg.approach_steps + cfg.descend_steps
        lifting = t >= cfg.approach_steps + cfg.descend_steps + cfg.close_steps
        goal = grasp.clone()
        goal[..., 2] += torch.where(approach, cfg.approach_height, 0.0)
        goal[..., 2] = torch.where(lifting, env.rest_height + cfg.lift_height, goal[..., 2])
        goal_yaw = torch.where(closing, ctrl.target_yaw, yaw)
        force = torch.where(closing, cfg.finger_force, cfg.open_force).expand(-1, 2)
        c = ctrl.cfg
        lo, hi = c.finger_force_range
        per_arm = torch.cat(
            [
                clamp_norm(goal - ctrl.target_pos, c.max_step) / c.max_step,
                (wrap_angle(goal_yaw - ctrl.target_yaw) / c.max_yaw_step).clamp(-1.0, 1.0)[..., None],
                (2.0 * (force - lo) / (hi - lo) - 1.0)[..., None],
            ],
            -1,
        )  # (N, 2, 5)
        return rearrange(per_arm, "n arm k -> n (arm k)").to(env.device)
