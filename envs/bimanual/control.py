"""End-effector control of both arms: damped-least-squares IK on the hand Jacobian, finger force, action latency.

Per arm the command is a tool-centre-point (TCP) position change (clamped to `max_step` per control step), a yaw change
about the vertical (clamped to `max_yaw_step`) and a finger force; pitch and roll are held top-down. One IK step per
control step for both arms at once: `dq = Jᵀ (J Jᵀ + λ² I)⁻¹ e`, with `e` the 6-D pose error to the target and `J` the
TCP Jacobian, and the arm's position servos track `q + dq` over the physics steps of the control step. Fingers are
force-controlled: on panda.xml their tendon is approximated by a joint actuator, and a position target does not close
them on an object. Latency delays the joint targets and finger forces by a per-env number of physics steps (a ring
buffer written every physics step). Arm 0 stands at -x, arm 1 at +x; each arm's yaw is measured from its base's yaw.

The real cell's effects (`EffectsConfig`, all off in training; `envs/bimanual/actuation.py`): each command's latency
jitters and a command may be lost (the actuators then hold the previous one); the wrist joints' targets pass gear
backlash and a servo deadband; an uncompensated vertical force pulls on each hand every physics step; and arm 1's
base stands `base_shift` away from where its controller believes it is, so the TCP poses it reads (and the targets it
tracks) are the true ones less that shift.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from envs.bimanual.actuation import dropped, hold_dropped, jittered_delay, wrist_element
from envs.bimanual.config import EffectsConfig
from envs.bimanual.scene import TCP_OFFSET, WRIST_JOINTS, BimanualScene
from envs.errors import check_range

BASE_YAW = (0.0, math.pi)
"""each arm's base yaw in the world (rad)"""


# ------------------------------------------------------------------------------------------- quaternion algebra
def quat_mul(a: Tensor, b: Tensor) -> Tensor:
    """Hamilton product of wxyz quaternions `(..., 4)`."""
    aw, ax, ay, az = a.unbind(-1)
    bw, bx, by, bz = b.unbind(-1)
    return torch.stack(
        [
            aw * bw - ax * bx - ay * by - az * bz,
            aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx,
            aw * bz + ax * by - ay * bx + az * bw,
        ],
        -1,
    )


def quat_conj(q: Tensor) -> Tensor:
    """Conjugate (inverse of a unit quaternion) `(..., 4)`."""
    return q * torch.tensor([1.0, -1.0, -1.0, -1.0], dtype=q.dtype, device=q.device)


def quat_rotate(q: Tensor, v: Tensor) -> Tensor:
    """Rotate vectors `(..., 3)` by wxyz quaternions `(..., 4)`."""
    w, u = q[..., :1], q[..., 1:]
    t = 2.0 * torch.linalg.cross(u, v, dim=-1)
    return v + w * t + torch.linalg.cross(u, t, dim=-1)


def rotation_error(target: Tensor, current: Tensor) -> Tensor:
    """Rotation vector `(..., 3)` (world frame) that turns `current` into `target` (wxyz `(..., 4)`)."""
    d = quat_mul(target, quat_conj(current))
    d = torch.where(d[..., :1] < 0, -d, d)  # the short way round
    s = d[..., 1:].norm(dim=-1, keepdim=True)
    angle = 2.0 * torch.atan2(s, d[..., :1])
    return d[..., 1:] * angle / s.clamp_min(1e-9)


def top_down_quat(yaw: Tensor) -> Tensor:
    """wxyz quaternions `(..., 4)` of a hand pointing down, turned by `yaw` `(...,)` about the world z axis."""
    half = 0.5 * yaw
    zero = torch.zeros_like(half)
    # q_z(yaw) ⊗ (0, 1, 0, 0): a half turn about x, then the yaw
    return torch.stack([zero, torch.cos(half), torch.sin(half), zero], -1)


def top_down_yaw(q: Tensor) -> Tensor:
    """Yaw `(...,)` about the world z axis of hands pointing (about) down, wxyz `(..., 4)`: the heading of the hand's
    x axis."""
    w, x, y, z = q.unbind(-1)
    return torch.atan2(2 * (x * y + w * z), 1 - 2 * (y * y + z * z))


def wrap_angle(a: Tensor) -> Tensor:
    """Angles wrapped to [-π, π)."""
    return torch.remainder(a + math.pi, 2 * math.pi) - math.pi


def clamp_norm(v: Tensor, max_norm: float) -> Tensor:
    """Vectors `(..., k)` scaled down to at most `max_norm` long."""
    n = v.norm(dim=-1, keepdim=True)
    return v * (max_norm / n.clamp_min(max_norm))


def dls_step(jacobian: Tensor, error: Tensor, damping: float) -> Tensor:
    """Damped-least-squares joint step `(..., J)` from Jacobians `(..., 6, J)` and pose errors `(..., 6)`."""
    eye = torch.eye(jacobian.shape[-2], dtype=jacobian.dtype, device=jacobian.device)
    a = jacobian @ jacobian.mT + (damping**2) * eye
    y = torch.linalg.solve(a, error.unsqueeze(-1))
    return (jacobian.mT @ y).squeeze(-1)


# ---------------------------------------------------------------------------------------------------- latency
class ActionDelay:
    """Ring buffer of commands `(N, D)`, one slot per physics step; each env reads the command `delay[i]` physics steps
    old (0 = the current one). With a per-command extra delay (jitter) a command arrives `delay + extra` steps after it
    was written, and the actuators keep the newest command that has arrived: a command that arrives later than the
    one after it is never applied."""

    def __init__(self, num_envs: int, width: int, max_delay: int) -> None:
        self.max_delay = max_delay
        self.buf = torch.zeros(max_delay + 1, num_envs, width)
        self.delay = torch.zeros(num_envs, dtype=torch.long)
        self.head = 0
        self._envs = torch.arange(num_envs)
        # with jitter: when each slot was written and when its command arrives (physics steps since construction)
        self.time = 0
        self.written = torch.arange(-max_delay, 1).roll(1)  # slot 0 holds the newest write, as `head` says
        self.arrive = torch.full((max_delay + 1, num_envs), -1 << 40, dtype=torch.long)

    def set_delay(self, delay: Tensor, envs_idx: Tensor) -> None:
        """Per-env delays `(n,)` in physics steps, each in [0, max_delay]."""
        self.delay[envs_idx] = delay.long().clamp(0, self.max_delay)

    def fill(self, command: Tensor, envs_idx: Tensor) -> None:
        """Every slot of the envs `envs_idx` set to `command` `(n, D)` (a reset: no stale commands)."""
        self.buf[:, envs_idx] = command[None]
        self.arrive[:, envs_idx] = -1 << 40  # arrived long ago

    def push(self, command: Tensor, extra: Tensor | None = None) -> Tensor:
        """Write this physics step's command `(N, D)`; returns the delayed one each env acts on `(N, D)`. `extra`
        `(N,)`: the physics steps by which this step's command is late beyond each env's delay (None: no jitter)."""
        self.head = (self.head + 1) % (self.max_delay + 1)
        self.buf[self.head] = command
        self.time += 1
        self.written[self.head] = self.time
        if extra is None:
            slot = (self.head - self.delay) % (self.max_delay + 1)
            self.arrive[self.head] = self.time + self.delay
        else:
            self.arrive[self.head] = self.time + (self.delay + extra).clamp(max=self.max_delay)
            arrived = self.arrive <= self.time  # (S, N): the oldest slot always has
            slot = torch.where(arrived, self.written[:, None], -1 << 40).argmax(0)  # the newest arrival
        return self.buf[slot, self._envs]


# ---------------------------------------------------------------------------------------------------- control
@dataclass(frozen=True)
class ControlConfig:
    """Limits and gains of the end-effector controller."""

    max_step: float = 0.01
    """largest TCP position change per control step (m)"""
    max_yaw_step: float = 0.1
    """largest yaw change per control step (rad)"""
    damping: float = 0.05
    """λ of the damped least squares (m): small steps near singular poses"""
    max_lead: float = 0.03
    """farthest the TCP target may lead the TCP (m)"""
    max_yaw_lead: float = 0.1
    """farthest the yaw target may lead the hand's yaw (rad); the wrist servos saturate (12 N·m) and a larger lead
    makes the yaw swing"""
    max_joint_step: float = 0.3
    """largest joint change per IK step (rad)"""
    finger_force_range: tuple[float, float] = (-6.0, 2.0)
    """finger force limits (N; negative closes, positive opens)"""
    integral_gain: float = 0.2
    """fraction of each IK step added to a per-joint offset of the servo targets (0: none; a load then leaves a
    steady pose error)"""
    max_joint_lead: float = 0.2
    """largest integral offset of a servo target (rad)"""
    max_delay: int = 0
    """capacity of the latency buffer in physics steps (0: no latency)"""

    def __post_init__(self) -> None:
        check_range("control.max_step", self.max_step, 1e-4, 0.05)
        check_range("control.max_yaw_step", self.max_yaw_step, 0.0, 0.5)
        check_range("control.damping", self.damping, 1e-4, 1.0)
        check_range("control.max_lead", self.max_lead, self.max_step, 0.2)
        check_range("control.max_delay", self.max_delay, 0, 100)


@dataclass
class ArmPoses:
    """TCP poses of both arms: `pos` `(N, 2, 3)` world, `quat` `(N, 2, 4)` wxyz, `yaw` `(N, 2)` from each base."""

    pos: Tensor
    quat: Tensor
    yaw: Tensor


class BimanualController:
    """Keeps a TCP target pose per arm (position, yaw), moves it by the commands, and steps physics: one IK step for
    both arms per control step toward the targets, finger forces held over the physics steps.

    The target leads the measured TCP (the position servos need a few control steps to follow a joint target), so a
    1 cm command per step moves the hand 1 cm per step; it is kept within `max_lead` of the TCP, so that an arm held
    back by contact does not wind up."""

    def __init__(
        self, scene: BimanualScene, cfg: ControlConfig | None = None, effects: EffectsConfig | None = None,
        generator: torch.Generator | None = None,
    ) -> None:  # fmt: skip
        """`effects`: the real cell's actuation effects (none by default); `generator`: what their jitter and dropped
        commands are drawn from."""
        self.bs, self.cfg = scene, cfg or ControlConfig()
        self.fx, self.generator = effects or EffectsConfig(), generator
        self.tcp_offset = torch.tensor(TCP_OFFSET)
        self.base_yaw = torch.tensor(BASE_YAW)
        self.base_shift = torch.zeros(2, 3)  # the true base less the believed one, per arm
        self.base_shift[1] = torch.tensor(self.fx.base_shift)
        n = scene.num_envs
        self.target_pos = torch.zeros(n, 2, 3)
        self.target_yaw = torch.zeros(n, 2)
        self.q_offset = torch.zeros(n, 2, len(scene.arm_dofs))  # integral of the IK steps
        width = 2 * len(scene.arm_dofs) + 4
        self.delay = ActionDelay(n, width, self.cfg.max_delay) if self.cfg.max_delay else None
        self.last_command = torch.zeros(n, width)  # what a dropped command leaves in place
        self.wrist = torch.zeros(n, 2, len(WRIST_JOINTS))  # the wrist joints' targets after backlash and deadband
        self.reset(torch.arange(n))

    @property
    def wrist_effects(self) -> bool:
        return self.fx.wrist_backlash > 0.0 or self.fx.wrist_deadband > 0.0

    def reset(self, envs_idx: Tensor) -> None:
        """Targets of the envs `envs_idx` to their TCPs' current poses (after a scene reset)."""
        poses = self.poses()
        self.target_pos[envs_idx] = poses.pos[envs_idx]
        self.target_yaw[envs_idx] = poses.yaw[envs_idx]
        self.q_offset[envs_idx] = 0.0
        q = torch.stack([a.get_dofs_position(self.bs.arm_dofs) for a in self.bs.arms], 1)[envs_idx]
        command = torch.cat([q.flatten(1), torch.zeros(len(envs_idx), 4)], -1)
        if self.delay is not None:
            self.delay.fill(command, envs_idx)
        self.last_command[envs_idx] = command
        self.wrist[envs_idx] = q[..., list(WRIST_JOINTS)]

    def poses(self) -> ArmPoses:
        """The TCP poses now, as each arm's controller reads them (from where it believes its base stands)."""
        hand_pos = torch.stack([h.get_pos() for h in self.bs.hands], 1)  # (N, 2, 3)
        quat = torch.stack([h.get_quat() for h in self.bs.hands], 1)  # (N, 2, 4)
        pos = hand_pos + quat_rotate(quat, self.tcp_offset.expand_as(hand_pos))
        if self.fx.base_shift != (0.0, 0.0, 0.0):
            pos = pos - self.base_shift
        return ArmPoses(pos, quat, wrap_angle(top_down_yaw(quat) - self.base_yaw))

    def move_targets(self, pos_delta: Tensor, yaw_delta: Tensor, poses: ArmPoses) -> None:
        """Move the TCP targets by `(N, 2, 3)` and `(N, 2)`, each change clamped to its per-step limit."""
        pos = self.target_pos + clamp_norm(pos_delta, self.cfg.max_step)
        self.target_pos = poses.pos + clamp_norm(pos - poses.pos, self.cfg.max_lead)
        yaw = self.target_yaw + yaw_delta.clamp(-self.cfg.max_yaw_step, self.cfg.max_yaw_step)
        lead = wrap_angle(yaw - poses.yaw).clamp(-self.cfg.max_yaw_lead, self.cfg.max_yaw_lead)
        self.target_yaw = wrap_angle(poses.yaw + lead)

    def joint_targets(self, poses: ArmPoses) -> Tensor:
        """Arm joint targets `(N, 2, 7)`: one damped-least-squares step from the TCP poses to the targets, pitch and
        roll top-down."""
        dofs = self.bs.arm_dofs
        jac = torch.stack(
            [a.get_jacobian(h, local_point=self.tcp_offset)[..., dofs] for a, h in zip(self.bs.arms, self.bs.hands)], 1
        )  # (N, 2, 6, 7)
        q = torch.stack([a.get_dofs_position(dofs) for a in self.bs.arms], 1)  # (N, 2, 7)
        target_quat = top_down_quat(self.target_yaw + self.base_yaw)
        error = torch.cat([self.target_pos - poses.pos, rotation_error(target_quat, poses.quat)], -1)  # (N, 2, 6)
        dq = dls_step(jac, error, self.cfg.damping).clamp(-self.cfg.max_joint_step, self.cfg.max_joint_step)
        # An integral term on top of the step from the measured joints: a pose error that a load holds against the
        # servos (gravity, the object) adds up until it is gone; a full integrator oscillates with the servos' lag.
        lead = self.cfg.max_joint_lead
        self.q_offset = (self.q_offset + self.cfg.integral_gain * dq).clamp(-lead, lead)
        return q + dq + self.q_offset

    def step(self, pos_delta: Tensor, yaw_delta: Tensor, finger_force: Tensor, poses: ArmPoses | None = None) -> None:
        """One control step: move the targets, IK, then `decimation` physics steps with the (delayed) joint targets and
        finger forces `(N, 2)` (N, the same on both fingers of an arm)."""
        poses = poses or self.poses()
        self.move_targets(pos_delta, yaw_delta, poses)
        q = self.joint_targets(poses)
        lo, hi = self.cfg.finger_force_range
        force = finger_force.clamp(lo, hi)[..., None].expand(-1, -1, 2)  # (N, 2, 2)
        command = torch.cat([q.flatten(1), force.flatten(1)], -1)
        fx, n = self.fx, self.bs.num_envs
        if fx.drop_prob > 0.0:
            command = hold_dropped(command, self.last_command, dropped(n, fx.drop_prob, self.generator))
            self.last_command = command
        extra = None
        if fx.latency_jitter > 0 and self.delay is not None:
            extra = jittered_delay(torch.zeros(n, dtype=torch.long), fx.latency_jitter, self.generator)
        for i in range(self.bs.cfg.decimation):
            if self.delay is not None:
                self._apply(self.delay.push(command, extra))
            elif i == 0:
                self._apply(command)
            if fx.payload_force != (0.0, 0.0):
                self._push_hands()
            self.bs.scene.step(update_visualizer=False)

    def _apply(self, command: Tensor) -> None:
        n_arm = len(self.bs.arm_dofs)
        q = command[:, : 2 * n_arm].unflatten(1, (2, n_arm))
        force = command[:, 2 * n_arm :].unflatten(1, (2, 2))
        if self.wrist_effects:
            wrist = list(WRIST_JOINTS)
            self.wrist = wrist_element(q[..., wrist], self.wrist, self.fx.wrist_backlash, self.fx.wrist_deadband)
            q = q.clone()
            q[..., wrist] = self.wrist
        for k, arm in enumerate(self.bs.arms):
            arm.control_dofs_position(q[:, k], self.bs.arm_dofs)
            arm.control_dofs_force(force[:, k], self.bs.finger_dofs)

    def _push_hands(self) -> None:
        """The uncompensated vertical force on each hand, for the next physics step (Genesis clears it after each)."""
        force = torch.zeros(self.bs.num_envs, 2, 3)
        force[..., 2] = torch.tensor(self.fx.payload_force)
        self.bs.solver.apply_links_external_wrench(force=force, links_idx=[h.idx for h in self.bs.hands])


# ---------------------------------------------------------------------------------------------- scripted grasp
@dataclass(frozen=True)
class GraspScript:
    """A scripted two-arm grasp and lift of a bar: approach above the bar's ends, descend, close, lift, hold."""

    approach_steps: int = 50
    """control steps to move above the grasp points, fingers open"""
    descend_steps: int = 20
    """control steps to lower the TCPs to the bar's mid-height"""
    close_steps: int = 10
    """control steps closing the fingers in place"""
    lift_steps: int = 25
    """control steps raising the TCPs by `lift_height`"""
    hold_steps: int = 40
    """control steps holding the lifted bar"""
    approach_height: float = 0.10
    """TCP height above the grasp point while approaching (m)"""
    end_margin: float = 0.06
    """grasp this far in from each end of the bar (m)"""
    lift_height: float = 0.15
    """how far the TCPs rise (m)"""
    open_force: float = 1.0
    """finger force while open (N, positive opens)"""

    def phases(self) -> dict[str, tuple[int, int]]:
        """Phase name -> `[start, end)` control steps."""
        out, t = {}, 0
        for name, n in (("approach", self.approach_steps), ("descend", self.descend_steps),
                        ("close", self.close_steps), ("lift", self.lift_steps), ("hold", self.hold_steps)):  # fmt: skip
            out[name] = (t, t + n)
            t += n
        return out

    @property
    def total_steps(self) -> int:
        return self.approach_steps + self.descend_steps + self.close_steps + self.lift_steps + self.hold_steps


def grasp_points(center: Tensor, yaw: Tensor, length: Tensor | float, margin: float) -> Tensor:
    """`(N, 2, 3)` grasp points of bars `(N, 3)` centres, `(N,)` yaws: `margin` in from each end, arm 0's the end
    nearer -x."""
    toward_x = torch.where(torch.cos(yaw) >= 0, 1.0, -1.0)
    half = (torch.as_tensor(length) / 2 - margin) * toward_x
    axis = torch.stack([torch.cos(yaw), torch.sin(yaw), torch.zeros_like(yaw)], -1) * half[..., None]
    return torch.stack([center - axis, center + axis], 1)


def grasp_yaw(object_yaw: Tensor) -> Tensor:
    """`(N, 2)` arm-relative yaws that put each hand's fingers across bars of world yaw `(N,)` (the hand's x axis along
    the bar), the one of the two symmetric choices nearest the arm's home yaw."""
    rel = wrap_angle(object_yaw[:, None] - torch.tensor(BASE_YAW))
    return torch.remainder(rel + math.pi / 2, math.pi) - math.pi / 2


class ScriptedGrasp:
    """Commands of the grasp script, step by step, for all envs at once (they move in lockstep)."""

    def __init__(self, script: GraspScript, grasp: Tensor, yaw: Tensor, finger_force: Tensor) -> None:
        """`grasp` `(N, 2, 3)` grasp points, `yaw` `(N, 2)` arm-relative hand yaws, `finger_force` `(N,)` N."""
        self.script, self.grasp, self.yaw, self.finger_force = script, grasp, yaw, finger_force
        self.spans = script.phases()

    def phase(self, step: int) -> str:
        return next((name for name, (a, b) in self.spans.items() if a <= step < b), "hold")

    def command(self, step: int, target_pos: Tensor, target_yaw: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """`(pos_delta (N, 2, 3), yaw_delta (N, 2), finger_force (N, 2))` at control step `step`, from the controller's
        TCP targets `(N, 2, 3)` and `(N, 2)`."""
        s, phase = self.script, self.phase(step)
        goal = self.grasp.clone()
        if phase == "approach":
            goal[..., 2] += s.approach_height
        elif phase in ("lift", "hold"):
            goal[..., 2] += s.lift_height  # the controller's step limit sets the lift speed
        force = torch.full_like(self.yaw, s.open_force)
        if phase in ("close", "lift", "hold"):
            force = self.finger_force[:, None].expand_as(self.yaw)
        return goal - target_pos, wrap_angle(self.yaw - target_yaw), force
