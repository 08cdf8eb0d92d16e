"""Success test and reward terms of the two-arm cube handover, as pure functions of per-step state tensors.

Arm 0 (at -x) is the giver: the cube starts on its side. Arm 1 (at +x) is the receiver. A step meets the handover's
conditions when the cube's centre is inside the goal region (a box on the receiver's side, at least 0.10 m above the
table), the receiver has both fingers on it, the giver has let go (no finger on the cube and its gripper open at
least `min_giver_open`) and the cube touches nothing else (the table, any arm's other links). As for the lift, the
conditions feed an unbroken-streak counter, and the handover succeeds once the streak has lasted the hold time. A touch
by the receiver, a cube the giver still holds (or barely lets go of), one thrown through the region, one held by the
giver alone or one resting on the table never fills the streak.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from envs.bimanual.success import update_streak
from envs.errors import check_interval, check_range

GIVER, RECEIVER = 0, 1
"""arm indices: arm 0 (at -x) gives, arm 1 (at +x) receives"""


@dataclass(frozen=True)
class HandoverGoal:
    """Where the receiver must hold the cube, how far the giver must have let go, and for how long. Coordinates are the
    world's: the table centre at the origin, the giver's base at -x, the receiver's at +x, z up from the table top."""

    x: tuple[float, float] = (0.0, 0.20)
    """the goal region's extent along x (m): on the receiver's side of the table centre"""
    y: tuple[float, float] = (-0.12, 0.12)
    """the goal region's extent along y (m)"""
    z: tuple[float, float] = (0.10, 0.25)
    """the goal region's extent in height above the table (m); it starts at least 0.10 m up"""
    min_giver_open: float = 0.03
    """the giver's gripper opening (the sum of its two finger joints, m) once it has let go"""
    hold_seconds: float = 1.0
    """how long the conditions must hold without a break (s)"""

    def __post_init__(self) -> None:
        check_interval("goal.x", self.x, 0.0, 0.4)
        check_interval("goal.y", self.y, -0.3, 0.3)
        check_interval("goal.z", self.z, 0.10, 0.5)
        check_range("goal.min_giver_open", self.min_giver_open, 0.03, 0.075)
        check_range("goal.hold_seconds", self.hold_seconds, 0.05, 10.0)

    @property
    def centre(self) -> tuple[float, float, float]:
        """the goal region's centre (m)"""
        return tuple(0.5 * (lo + hi) for lo, hi in (self.x, self.y, self.z))

    def bounds(self) -> Tensor:
        """`(2, 3)` the region's lower and upper corners (m)."""
        return torch.tensor([self.x, self.y, self.z]).T


def in_goal(pos: Tensor, goal: HandoverGoal) -> Tensor:
    """`(N,)` bool: each cube centre `(N, 3)` is inside the goal region (edges included)."""
    box = goal.bounds().to(pos)
    return ((pos >= box[0]) & (pos <= box[1])).all(-1)


def giver_released(giver_touch: Tensor, giver_open: Tensor, min_open: float) -> Tensor:
    """`(N,)` bool: the giver has let go: neither finger touches the cube (`giver_touch` `(N, 2)` bool) and its gripper
    is open at least `min_open` (`giver_open` `(N,)` m)."""
    return ~giver_touch.any(-1) & (giver_open >= min_open)


def handover_conditions(
    pos: Tensor, finger_touch: Tensor, giver_open: Tensor, other_touch: Tensor, goal: HandoverGoal
) -> Tensor:
    """`(N,)` bool: this step the cube's centre `pos` `(N, 3)` is in the goal region, the receiver has both fingers on
    it (`finger_touch` `(N, 2 arms, 2 fingers)` bool, giver first), the giver has let go (no finger on it and
    `giver_open` `(N,)` at least `goal.min_giver_open`) and the cube touches nothing else (`other_touch` `(N,)`)."""
    held = finger_touch[:, RECEIVER].all(-1)
    released = giver_released(finger_touch[:, GIVER], giver_open, goal.min_giver_open)
    return in_goal(pos, goal) & held & released & ~other_touch


def handover_success_over(
    pos: Tensor, finger_touch: Tensor, giver_open: Tensor, other_touch: Tensor, goal: HandoverGoal, hold_steps: int
) -> Tensor:
    """`(N,)` bool: whether a whole trajectory, time-major (`pos` `(T, N, 3)`, `finger_touch` `(T, N, 2, 2)`,
    `giver_open` and `other_touch` `(T, N)`), ever meets the handover's conditions `hold_steps` steps in a row."""
    streak = torch.zeros(pos.shape[1], dtype=torch.long, device=pos.device)
    success = torch.zeros(pos.shape[1], dtype=torch.bool, device=pos.device)
    for t in range(pos.shape[0]):
        ok = handover_conditions(pos[t], finger_touch[t], giver_open[t], other_touch[t], goal)
        streak = update_streak(streak, ok)
        success |= streak >= hold_steps
    return success


# ------------------------------------------------------------------------------------------------ reward terms
def progress(value: Tensor, start: float, target: float) -> Tensor:
    """`(N,)` in [0, 1]: how far `value` `(N,)` has come from `start` toward `target`."""
    return ((value - start) / (target - start)).clamp(0.0, 1.0)


def handover_terms(
    pos: Tensor, tcp_pos: Tensor, finger_touch: Tensor, giver_open: Tensor, goal: HandoverGoal, start_x: float,
    rest_height: float, reach_scale: float,
) -> dict[str, Tensor]:  # fmt: skip
    """The handover's shaping terms `(N,)` each, from the cube's centre `pos` `(N, 3)`, both TCPs `tcp_pos` `(N, 2, 3)`,
    the fingers' contacts `finger_touch` `(N, 2, 2)` bool and the giver's opening `giver_open` `(N,)` (m); `start_x`
    is where the cube's carry begins (the far edge of its start region), `rest_height` its centre's height on the table.

    - `reach`: the giver's TCP close to the cube, `exp(-d / reach_scale)`, until the receiver holds it;
    - `grasp`: the share of the giver's fingers on the cube, until the receiver holds it;
    - `carry`: the cube's progress along x from `start_x` to the goal's centre while either gripper holds it with both
      fingers;
    - `receiver_reach`: the receiver's TCP close to the cube, weighted by the carry's progress (the cube starts out of
      its reach);
    - `receiver_grasp`: the share of the receiver's fingers on the cube;
    - `release`: the receiver holds the cube with both fingers and the giver has let go;
    - `lift`: after that release, the cube raised from the table toward the goal's centre height.
    """
    giver_touch, receiver_touch = finger_touch[:, GIVER], finger_touch[:, RECEIVER]
    received = receiver_touch.all(-1)
    handed = received & giver_released(giver_touch, giver_open, goal.min_giver_open)
    near = torch.exp(-(pos[:, None] - tcp_pos).norm(dim=-1) / reach_scale)  # (N, 2)
    centre = goal.centre
    carried = progress(pos[:, 0], start_x, centre[0]) * (giver_touch.all(-1) | received).float()
    return {
        "reach": near[:, GIVER] * (~received).float(),
        "grasp": giver_touch.float().mean(-1) * (~received).float(),
        "carry": carried,
        "receiver_reach": near[:, RECEIVER] * progress(pos[:, 0], start_x, centre[0]),
        "receiver_grasp": receiver_touch.float().mean(-1),
        "release": handed.float(),
        "lift": handed.float() * progress(pos[:, 2], rest_height, centre[2]),
    }


def beyond_best(terms: Tensor, best: Tensor) -> tuple[Tensor, Tensor]:
    """Progress beyond the best so far: each term's rise above the highest value it has had since its env's reset.

    `terms` and `best` are `(N, K)` (K terms in [0, 1], `best` the running maxima). Returns the rise `(N, K)` (zero
    wherever a term is at or below its best) and the updated maxima. Summed over an episode a term pays its highest
    value once: falling back costs nothing and regaining what was lost pays nothing, so letting go of the cube at the
    handoff point (which the shaping terms above pay less for until the receiver has it) is never a loss, and no back
    and forth between two states is ever worth anything."""
    return (terms - best).clamp(min=0.0), torch.maximum(best, terms)
