"""The scripted privileged expert of the cube handover: IK waypoints and force-closed fingers, as a policy of the env.

With both hands held pointing down, two grippers cannot hold one small cube at once (each hand sits above its own
fingers), so the script hands the cube over through the table at a handoff point in the middle. Each env goes through
the stages on its own: the giver (arm 0) comes down over the cube, its hand turned to the cube's faces, braking as it
nears its grasp point, and closes its fingers with a set force; it carries the cube, lifted a few centimetres, to the
handoff point while turning it square to the table's axes, sets it down, opens and backs away along -x (its open
fingers pass either side of the cube). The receiver (arm 1) waits beside the handoff point at the cube's height, its
hand turned to the cube's faces; once the giver has opened it slides in from +x, closes its fingers, and raises the
cube to the goal region's centre, where it holds it. The expert reads the env's true state (the cube's pose, the
TCPs, the controller's targets), not the observations, and returns the env's normalized `(N, 10)` action.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from einops import rearrange
from torch import Tensor

from envs.bimanual.control import BASE_YAW, clamp_norm, quat_rotate, wrap_angle
from envs.bimanual.handover import HandoverEnv
from envs.bimanual.handover_success import GIVER, RECEIVER
from envs.errors import check_range

STAGES = ("approach", "descend", "close", "carry", "lower", "release", "swap", "receive", "deliver")
"""the script's stages in order: the giver's pick and carry, the set-down, the swap (the giver backs away while the
receiver slides in), the receiver's grip and its carry to the goal"""


@dataclass(frozen=True)
class HandoverExpertConfig:
    """Waypoints, tolerances and stage lengths of the scripted handover (control steps, m, N)."""

    handoff: tuple[float, float] = (0.03, 0.0)
    """the handoff point on the table (x, y; m)"""
    approach_height: float = 0.06
    """the giver's TCP height above the cube's centre while approaching (m)"""
    grasp_height: float = 0.004
    """the TCP's waypoint above the cube's centre where a gripper closes, and where the cube is set down (m): the TCP
    still sinks a little past a waypoint it brakes for, and pads that press below the cube's middle lift a light cube
    or squeeze it out"""
    min_grasp_height: float = 0.024
    """the lowest TCP waypoint at a grasp or set-down (m): the fingertips reach below the TCP, and on a small cube they
    would dig into the table as the TCP runs past its waypoint"""
    carry_height: float = 0.04
    """how high the cube is carried above its resting height (m)"""
    standoff: float = 0.10
    """how far along +x from the handoff point the receiver waits (m)"""
    retreat: tuple[float, float] = (0.20, 0.03)
    """how far the giver backs away along -x and up after letting go (m)"""
    brake_distance: float = 0.04
    """within this distance of a grasp or set-down waypoint the moving TCP slows down in proportion (m): arriving at
    full speed it runs past the waypoint (the controller's integral term leads it), and a gripper then closes off
    the cube's centre"""
    min_speed: float = 0.3
    """the slowest a braking TCP moves, as a fraction of the controller's step limit"""
    arrive_tol: float = 0.006
    """a waypoint counts as reached when the moving TCP is this close to it (m)"""
    close_steps: int = 5
    """steps a gripper closes in place before it moves"""
    squeeze_steps: int = 3
    """steps over which a closing gripper's force ramps up to `finger_force`: at full force from the start the light
    fingers slam into the cube and can knock it spinning"""
    release_steps: int = 2
    """steps the giver opens in place before the swap"""
    max_steps: int = 50
    """the longest a stage that waits for its waypoint lasts"""
    finger_force: float = -5.0
    """finger force once closed (N; negative closes)"""
    open_force: float = 2.0
    """finger force while open (N)"""

    def __post_init__(self) -> None:
        check_range("expert.approach_height", self.approach_height, 0.0, 0.3)
        check_range("expert.min_grasp_height", self.min_grasp_height, 0.0, 0.1)
        check_range("expert.carry_height", self.carry_height, 0.0, 0.3)
        check_range("expert.standoff", self.standoff, 0.05, 0.4)
        check_range("expert.brake_distance", self.brake_distance, 0.0, 0.3)
        check_range("expert.min_speed", self.min_speed, 0.05, 1.0)
        check_range("expert.arrive_tol", self.arrive_tol, 1e-3, 0.05)
        check_range("expert.close_steps", self.close_steps, 1, 100)
        check_range("expert.squeeze_steps", self.squeeze_steps, 1, 100)
        check_range("expert.release_steps", self.release_steps, 1, 100)
        check_range("expert.max_steps", self.max_steps, 1, 1000)
        check_range("expert.finger_force", self.finger_force, -20.0, 0.0)
        check_range("expert.open_force", self.open_force, 0.0, 20.0)


def face_yaw(quat: Tensor) -> Tensor:
    """`(N, 2)` arm-relative hand yaws that put each hand's fingers on two opposite faces of cubes with wxyz
    orientations `(N, 4)`: of the four square choices, the one nearest the arm's home yaw."""
    axis = quat_rotate(quat, torch.tensor([1.0, 0.0, 0.0]).expand(len(quat), 3))
    rel = wrap_angle(torch.atan2(axis[:, 1], axis[:, 0])[:, None] - torch.tensor(BASE_YAW))
    return torch.remainder(rel + math.pi / 4, math.pi / 2) - math.pi / 4


class HandoverExpert:
    """`act(obs) -> (N, 10)` actions of the scripted handover for every env of `env`. Each env runs through `STAGES`
    on its own: a stage that moves a TCP ends when it reaches its waypoint (or after `max_steps`), a gripper's stage
    after a set number of steps; an env whose episode has just begun starts over."""

    def __init__(self, env: HandoverEnv, cfg: HandoverExpertConfig | None = None) -> None:
        self.env, self.cfg = env, cfg or HandoverExpertConfig()
        self.stage = torch.zeros(env.num_envs, dtype=torch.long)
        self.elapsed = torch.zeros(env.num_envs, dtype=torch.long)

    def __call__(self, obs=None) -> Tensor:
        return self.act(obs)

    def _waypoints(self, s: dict[str, Tensor], stage: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Each arm's TCP waypoint `(N, 2, 3)`, hand yaw `(N, 2)` and finger force `(N, 2)` in stage `stage` `(N,)`."""
        env, cfg, ctrl = self.env, self.cfg, self.env.ctrl
        cube = s["object_pose"][:, :3]
        n, rest = len(cube), env.rest_height
        at = {name: (stage == k)[:, None] for k, name in enumerate(STAGES)}
        after = {name: (stage >= k)[:, None] for k, name in enumerate(STAGES)}
        handoff = torch.tensor([*cfg.handoff, rest]).expand(n, 3)
        lifted = torch.tensor([0.0, 0.0, cfg.carry_height])

        grasp_z = max(rest + cfg.grasp_height, cfg.min_grasp_height)
        grasp = torch.cat([cube[:, :2], torch.full((n, 1), grasp_z)], -1)  # where a gripper closes on the cube
        giver = torch.where(at["approach"], cube + torch.tensor([0.0, 0.0, cfg.approach_height]), grasp)
        giver = torch.where(at["carry"], handoff + lifted, giver)
        set_down = torch.tensor([*cfg.handoff, grasp_z]).expand(n, 3)
        giver = torch.where(at["lower"] | at["release"], set_down, giver)
        back = handoff + torch.tensor([-cfg.retreat[0], 0.0, cfg.retreat[1]])
        giver = torch.where(after["swap"], back, giver)

        wait = set_down + torch.tensor([cfg.standoff, 0.0, 0.0])
        receiver = torch.where(at["swap"] | at["receive"], grasp, wait)
        receiver = torch.where(at["deliver"], torch.tensor(env.cfg.goal.centre).expand(n, 3), receiver)

        square = face_yaw(s["object_pose"][:, 3:])  # (N, 2)
        holding = after["close"] & ~after["carry"]
        giver_yaw = torch.where(holding, ctrl.target_yaw[:, GIVER:RECEIVER], square[:, GIVER:RECEIVER])
        giver_yaw = torch.where(after["carry"], 0.0, giver_yaw)  # square to the table's axes for the receiver
        receiver_yaw = torch.where(after["receive"], ctrl.target_yaw[:, RECEIVER:], square[:, RECEIVER:])
        giver_closed = after["close"] & ~after["release"]
        squeeze = cfg.finger_force * ((self.elapsed[:, None] + 1) / cfg.squeeze_steps).clamp(max=1.0)
        closing = torch.cat([torch.where(at["close"], squeeze, cfg.finger_force),
                             torch.where(at["receive"], squeeze, cfg.finger_force)], -1)  # fmt: skip
        force = torch.where(torch.cat([giver_closed, after["receive"]], -1), closing, cfg.open_force)
        return torch.stack([giver, receiver], 1), torch.cat([giver_yaw, receiver_yaw], -1), force

    def _advance(self, s: dict[str, Tensor]) -> None:
        """Move each env on to its next stage when its current one is done; a fresh episode starts over."""
        cfg, stage = self.cfg, self.stage
        fresh = self.env.episode_length_buf == 0
        stage[fresh], self.elapsed[fresh] = 0, 0
        goal, _, _ = self._waypoints(s, stage)
        rows = torch.arange(len(stage))
        mover = torch.where(stage >= STAGES.index("swap"), RECEIVER, GIVER)
        tcp = s["tcp_pos"][rows, mover]
        arrived = (tcp - goal[rows, mover]).norm(dim=-1) <= cfg.arrive_tol
        length = torch.full_like(stage, cfg.max_steps)
        timed = torch.zeros_like(arrived)
        for name, steps in (("close", cfg.close_steps), ("receive", cfg.close_steps), ("release", cfg.release_steps)):
            length = torch.where(stage == STAGES.index(name), steps, length)
            timed |= stage == STAGES.index(name)
        done = ((self.elapsed + 1 >= length) | (arrived & ~timed)) & (stage < len(STAGES) - 1)
        self.stage = torch.where(done, stage + 1, stage)
        self.elapsed = torch.where(done, 0, self.elapsed + 1)

    def act(self, obs=None) -> Tensor:
        env, ctrl = self.env, self.env.ctrl
        if not env._state:
            env.get_observations()
        s = env._state
        self._advance(s)
        goal, yaw, force = self._waypoints(s, self.stage)
        c, cfg = ctrl.cfg, self.cfg
        lo, hi = c.finger_force_range
        braking = torch.isin(self.stage, torch.tensor([STAGES.index(k) for k in ("descend", "lower", "swap")]))
        away = (goal - s["tcp_pos"]).norm(dim=-1) / max(cfg.brake_distance, 1e-6)  # (N, 2)
        speed = torch.where(braking[:, None], away.clamp(cfg.min_speed, 1.0), 1.0)[..., None]
        per_arm = torch.cat(
            [
                clamp_norm(goal - ctrl.target_pos, c.max_step) / c.max_step * speed,
                (wrap_angle(yaw - ctrl.target_yaw) / c.max_yaw_step).clamp(-1.0, 1.0)[..., None],
                (2.0 * (force - lo) / (hi - lo) - 1.0)[..., None],
            ],
            -1,
        )  # (N, 2, 5)
        return rearrange(per_arm, "n arm k -> n (arm k)").to(env.device)
