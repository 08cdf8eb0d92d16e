"""The scripted privileged expert of the cube handover: IK waypoints and force-closed fingers, as a policy of the env.

With both hands held pointing down, two grippers cannot hold one small cube at once (each hand sits above its own
fingers), so the script hands the cube over through the table at a handoff point in the middle. Each env goes through
the stages on its own: the giver (arm 0) comes down over the cube, its hand turned to the cube's faces, braking as it
nears its grasp point, and closes its fingers with a set force; it carries the cube, lifted a few centimetres, to the
handoff point while turning it square to the table's axes, sets it down, opens and backs away along -x (its open
fingers pass either side of the cube). The receiver (arm 1) waits beside the handoff point at the cube's height, its
hand turned to the cube's faces; once the giver has opened it slides in from +x, closes its fingers, and raises the
cube to the goal region's centre, where it holds it. The expert reads the env's true state (the cube's pose, the
TCPs, finger contacts and widths, the controller's targets, the last action sent), not the observations, and returns
the env's normalized `(N, 10)` action.

The stage of each env is read off that state at every step (`infer_stage`), not remembered: who holds the cube, where
it is, where the moving hand is and what the fingers were last told. So the expert labels any state the same way
whoever drove there, as DAgger needs of the expert that labels a clone's states, and it starts over from wherever a
slip or a drop leaves the cube.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from einops import rearrange
from torch import Tensor

from envs.bimanual.control import BASE_YAW, clamp_norm, quat_rotate, wrap_angle
from envs.bimanual.handover import HandoverEnv
from envs.bimanual.handover_success import GIVER, RECEIVER, giver_released
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
    """within this distance of a grasp, carry or set-down waypoint the moving TCP slows down in proportion (m):
    arriving at full speed it runs past the waypoint (the controller's integral term leads it), and a gripper then
    closes off the cube's centre"""
    min_speed: float = 0.3
    """the slowest a braking TCP moves, as a fraction of the controller's step limit"""
    arrive_tol: float = 0.006
    """a waypoint counts as reached when the moving TCP is this close to it (m)"""
    squeeze_steps: int = 3
    """steps over which a closing gripper's force ramps up to `finger_force`: at full force from the start the light
    fingers slam into the cube and can knock it spinning"""
    handoff_tol: float = 0.015
    """a cube whose centre is this close to the handoff point (in the table's plane) is there (m)"""
    rest_tol: float = 0.008
    """a cube whose centre is at most this far above its resting height rests on the table (m)"""
    align_tol: float = 0.012
    """the giver descends once its TCP is this close to the cube's centre in the table's plane (m)"""
    yaw_tol: float = 0.15
    """... and its hand's yaw target this close to the cube's faces (rad)"""
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
        check_range("expert.squeeze_steps", self.squeeze_steps, 1, 100)
        check_range("expert.handoff_tol", self.handoff_tol, 1e-3, 0.1)
        check_range("expert.rest_tol", self.rest_tol, 1e-3, 0.05)
        check_range("expert.align_tol", self.align_tol, 1e-3, 0.05)
        check_range("expert.yaw_tol", self.yaw_tol, 0.01, 0.8)
        check_range("expert.finger_force", self.finger_force, -20.0, 0.0)
        check_range("expert.open_force", self.open_force, 0.0, 20.0)


def face_yaw(quat: Tensor) -> Tensor:
    """`(N, 2)` arm-relative hand yaws that put each hand's fingers on two opposite faces of cubes with wxyz
    orientations `(N, 4)`: of the four square choices, the one nearest the arm's home yaw."""
    axis = quat_rotate(quat, torch.tensor([1.0, 0.0, 0.0]).expand(len(quat), 3))
    rel = wrap_angle(torch.atan2(axis[:, 1], axis[:, 0])[:, None] - torch.tensor(BASE_YAW))
    return torch.remainder(rel + math.pi / 4, math.pi / 2) - math.pi / 4


def close_height(rest: float, cfg: HandoverExpertConfig) -> float:
    """The TCP's height where a gripper closes on the cube or sets it down (m), for a cube resting at `rest`."""
    return max(rest + cfg.grasp_height, cfg.min_grasp_height)


def finger_forces(env: HandoverEnv) -> Tensor:
    """`(N, 2)` the finger force each arm was last told (N), from the env's last action."""
    lo, hi = env.ctrl.cfg.finger_force_range
    norm = env.prev_action.view(env.num_envs, 2, -1)[..., -1].clamp(-1.0, 1.0)
    return lo + 0.5 * (norm + 1.0) * (hi - lo)


def infer_stage(env: HandoverEnv, s: dict[str, Tensor], cfg: HandoverExpertConfig) -> Tensor:
    """`(N,)` the index in `STAGES` of the stage each env is in, from its state alone (the later stage wins):

    - approach: the giver's hand is not yet over the cube (or not turned to its faces), or its fingers shut on
      nothing; descend: it is over the cube;
    - close: the giver's TCP is at its grasp point, or its fingers close without a firm hold yet;
    - carry: the giver holds the cube (both fingers on it, told most of the closing force) away from the handoff point;
    - lower: it holds it over the handoff point; release: its TCP is down at the handoff point and it has not yet
      let go;
    - swap: the giver has let go of the cube resting at the handoff point, the receiver is not at its grasp point;
    - receive: the receiver's TCP is at its grasp point, or it closes without a firm hold yet (and has not shut
      on nothing);
    - deliver: the receiver holds the cube and the giver has let go.
    """
    cube, tcp, touch = s["object_pose"][:, :3], s["tcp_pos"], s["finger_touch"]
    force = finger_forces(env)
    rest = env.rest_height
    grasp_z = close_height(rest, cfg)
    grasp = torch.cat([cube[:, :2], torch.full((len(cube), 1), grasp_z)], -1)
    full = force <= 0.6 * cfg.finger_force  # (N, 2) told most of the closing force (a clone's is never exact)
    holds = touch.all(-1) & full  # (N, 2)
    closing = force < 0.0
    at_grasp = (tcp - grasp[:, None]).norm(dim=-1) <= cfg.arrive_tol  # (N, 2)
    at_handoff = (cube[:, :2] - torch.tensor(cfg.handoff)).norm(dim=-1) <= cfg.handoff_tol
    resting = cube[:, 2] <= rest + cfg.rest_tol
    let_go = giver_released(touch[:, GIVER], s["giver_open"], env.cfg.goal.min_giver_open)
    over = (tcp[:, GIVER, :2] - cube[:, :2]).norm(dim=-1) <= cfg.align_tol
    square = face_yaw(s["object_pose"][:, 3:])[:, GIVER]
    turned = wrap_angle(env.ctrl.target_yaw[:, GIVER] - square).abs() <= cfg.yaw_tol
    # fingers shut past the cube's width without touching it: the grasp missed, start over with the hand open
    width = s["qpos"][..., -2:].sum(-1)  # (N, 2)
    missed = closing & ~touch.any(-1) & (width < 0.8 * env.object_size)
    stage = torch.zeros(len(cube), dtype=torch.long)

    def later(name: str, when: Tensor) -> None:
        stage[when] = STAGES.index(name)

    later("descend", over & turned)
    later("close", (at_grasp[:, GIVER] | (closing[:, GIVER] & ~holds[:, GIVER] & over)) & ~missed[:, GIVER])
    later("carry", holds[:, GIVER])
    later("lower", holds[:, GIVER] & at_handoff)
    # set down: the giver's TCP at its lowest waypoint over the handoff point (a cube held high in the fingers drops
    # the last centimetre or two); the giver opens there until it has let go
    set_down = at_handoff & (tcp[:, GIVER, 2] <= grasp_z + cfg.arrive_tol)
    later("release", set_down & ~let_go)
    handed = let_go & at_handoff & resting
    later("swap", handed)
    receiving = at_grasp[:, RECEIVER] | (closing[:, RECEIVER] & ~holds[:, RECEIVER] & ~missed[:, RECEIVER])
    later("receive", handed & receiving)
    later("deliver", let_go & holds[:, RECEIVER])
    return stage


class HandoverExpert:
    """`act(obs) -> (N, 10)` actions of the scripted handover for every env of `env`: each env's stage in `STAGES`
    read off its state (`infer_stage`), then the stage's waypoints; a closing gripper's force ramps up over
    `squeeze_steps` from what it was last told."""

    def __init__(self, env: HandoverEnv, cfg: HandoverExpertConfig | None = None) -> None:
        self.env, self.cfg = env, cfg or HandoverExpertConfig()
        self.stage = torch.zeros(env.num_envs, dtype=torch.long)

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

        grasp_z = close_height(rest, cfg)
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
        holding = at["close"]
        giver_yaw = torch.where(holding, ctrl.target_yaw[:, GIVER:RECEIVER], square[:, GIVER:RECEIVER])
        giver_yaw = torch.where(after["carry"], 0.0, giver_yaw)  # square to the table's axes for the receiver
        receiver_yaw = torch.where(after["receive"], ctrl.target_yaw[:, RECEIVER:], square[:, RECEIVER:])
        told = finger_forces(env).clamp(max=0.0)
        squeeze = (told + cfg.finger_force / cfg.squeeze_steps).clamp(min=cfg.finger_force)  # (N, 2)
        giver_force = torch.where(at["close"] | at["carry"] | at["lower"], squeeze[:, :1], cfg.open_force)
        receiver_force = torch.where(at["receive"] | at["deliver"], squeeze[:, 1:], cfg.open_force)
        return (
            torch.stack([giver, receiver], 1),
            torch.cat([giver_yaw, receiver_yaw], -1),
            torch.cat([giver_force, receiver_force], -1),
        )

    def act(self, obs=None) -> Tensor:
        env, ctrl = self.env, self.env.ctrl
        if not env._state:
            env.get_observations()
        s = env._state
        self.stage = infer_stage(env, s, self.cfg)
        goal, yaw, force = self._waypoints(s, self.stage)
        c, cfg = ctrl.cfg, self.cfg
        lo, hi = c.finger_force_range
        braking = torch.isin(self.stage, torch.tensor([STAGES.index(k) for k in ("descend", "carry", "lower", "swap")]))
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
