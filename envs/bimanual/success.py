"""Success tests and reward terms of the two-arm tasks, as pure functions of per-step state tensors.

A success is a held state, not a passing one: each step's conditions feed an unbroken-streak counter, and the task
succeeds once the streak reaches `hold_steps` control steps. Flinging the object through the goal window, a touch that
never becomes a grip, or a lift by one arm (the bar tilts, the other gripper is off it) never fills the streak.
Every reward term that pays for grip or height takes the minimum over the two arms, so that one arm doing the work
earns nothing for it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from envs.errors import ConfigError, check_range


@dataclass(frozen=True)
class LiftWindow:
    """What a level two-arm bar lift must hold, and for how long."""

    min_height: float = 0.13
    """lowest height of the bar's centre above the table (m)"""
    max_height: float = 0.20
    """highest height of the bar's centre above the table (m)"""
    max_tilt_deg: float = 10.0
    """largest angle of the bar's long axis from the horizontal (degrees)"""
    hold_steps: int = 20
    """control steps the conditions must hold without a break"""

    def __post_init__(self) -> None:
        check_range("success.min_height", self.min_height, 0.0, 1.0)
        check_range("success.max_height", self.max_height, 0.0, 1.0)
        if not self.min_height < self.max_height:
            raise ConfigError(
                f"success.min_height={self.min_height} must be below success.max_height={self.max_height}"
            )
        check_range("success.max_tilt_deg", self.max_tilt_deg, 0.0, 90.0)
        check_range("success.hold_steps", self.hold_steps, 1, 10_000)


def bar_tilt(quat: Tensor) -> Tensor:
    """Angle `(N,)` (rad) between a bar's long axis (its body x axis) and the horizontal, from wxyz quaternions
    `(N, 4)`."""
    w, x, y, z = quat.unbind(-1)
    axis_z = 2.0 * (x * z - w * y)  # z component of the rotated x axis
    return torch.asin(axis_z.clamp(-1.0, 1.0).abs())


def both_fingers(finger_contact: Tensor) -> Tensor:
    """`(N, 2)` whether each gripper has both fingers on the object, from per-finger contacts `(N, 2 arms, 2 fingers)`
    bool."""
    return finger_contact.all(-1)


def lift_conditions(
    height: Tensor, tilt: Tensor, finger_contact: Tensor, other_contact: Tensor, window: LiftWindow
) -> Tensor:
    """`(N,)` bool: this step the bar's centre `height` `(N,)` is inside the window, its `tilt` `(N,)` (rad) is small
    enough, each gripper has both fingers on it (`finger_contact` `(N, 2, 2)` bool) and it touches nothing else
    (`other_contact` `(N,)` bool: the table, an arm's other links)."""
    in_window = (height >= window.min_height) & (height <= window.max_height)
    level = tilt <= math.radians(window.max_tilt_deg)
    gripped = both_fingers(finger_contact).all(-1)
    return in_window & level & gripped & ~other_contact


def update_streak(streak: Tensor, ok: Tensor) -> Tensor:
    """`(N,)` unbroken count of steps with `ok` `(N,)` bool: one more where it holds, zero where it breaks."""
    return torch.where(ok, streak + 1, torch.zeros_like(streak))


def streak_success(streak: Tensor, hold_steps: int) -> Tensor:
    """`(N,)` bool: the streak `(N,)` has lasted `hold_steps` steps."""
    return streak >= hold_steps


def lift_success_over(
    height: Tensor, tilt: Tensor, finger_contact: Tensor, other_contact: Tensor, window: LiftWindow
) -> Tensor:
    """`(N,)` bool: whether a whole trajectory, time-major (`height`, `tilt`, `other_contact` `(T, N)`,
    `finger_contact` `(T, N, 2, 2)`), ever holds the lift for `hold_steps` steps in a row."""
    streak = torch.zeros(height.shape[1], dtype=torch.long, device=height.device)
    success = torch.zeros(height.shape[1], dtype=torch.bool, device=height.device)
    for t in range(height.shape[0]):
        ok = lift_conditions(height[t], tilt[t], finger_contact[t], other_contact[t], window)
        streak = update_streak(streak, ok)
        success |= streak_success(streak, window.hold_steps)
    return success


# ------------------------------------------------------------------------------------------------ reward terms
def reach_reward(tcp_to_grasp: Tensor, scale: float) -> Tensor:
    """`(N,)` in (0, 1]: `exp(-d / scale)` of the farther arm's TCP distance to its grasp point (`tcp_to_grasp`
    `(N, 2, 3)`), so both arms must come close."""
    return torch.exp(-tcp_to_grasp.norm(dim=-1) / scale).amin(-1)


def grip_reward(finger_contact: Tensor) -> Tensor:
    """`(N,)` in {0, 0.5, 1}: the fraction of fingers on the object of the gripper with fewer (`(N, 2, 2)` bool)."""
    return finger_contact.float().mean(-1).amin(-1)


def lift_reward(end_height: Tensor, finger_contact: Tensor, rest_height: float, target_height: float) -> Tensor:
    """`(N,)` in [0, 1]: per arm, its end of the bar (`end_height` `(N, 2)` m) raised from `rest_height` toward
    `target_height`, counted only while that gripper holds it with both fingers; the minimum over the arms (one arm
    lifting its end earns nothing)."""
    raised = ((end_height - rest_height) / (target_height - rest_height)).clamp(0.0, 1.0)
    return (raised * both_fingers(finger_contact).float()).amin(-1)


def level_penalty(tilt: Tensor, max_tilt: float) -> Tensor:
    """`(N,)` ≥ 0: how far the bar's tilt `(N,)` (rad) exceeds `max_tilt`, in units of `max_tilt`."""
    return ((tilt - max_tilt) / max_tilt).clamp_min(0.0)


def window_overshoot(height: Tensor, max_height: float) -> Tensor:
    """`(N,)` ≥ 0: how far (m) the bar's centre `(N,)` is above the window's top."""
    return (height - max_height).clamp_min(0.0)
