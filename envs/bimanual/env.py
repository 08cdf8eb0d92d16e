"""The batched two-arm bar-lift env: Genesis scene, end-effector control, randomized world, observation groups.

An rsl_rl-style VecEnv (`num_envs`, `num_actions`, `max_episode_length`, `episode_length_buf`, `device`, `cfg`,
`get_observations()`, `step()` with auto-reset inside). The action is `(N, 10)` in [-1, 1]: per arm (arm 0 first) a
TCP position change (x, y, z, scaled by the controller's per-step limit), a yaw change (scaled likewise) and a finger
force (mapped linearly onto the controller's force range, -1 closing hardest). Episodes end on success (the lift held
for the success window's `hold_steps`), at the time limit, or when the simulation of an env fails (Genesis flags it,
or its state is not finite or moves faster than `error_speed`): that env is reset, its step earns no reward, and it
is counted in `extras["log"]["error_resets"]` and `error_count`.

A task variant subclasses the env and overrides its hooks: the scene it builds (`_scene_config`), where the object
starts (`_start_poses`), what a step reads of the object (`_task_state`: its grasp points and whatever the success test
and reward need), the success conditions (`_conditions`, `hold_steps`) and the reward (`_reward`).

The config's `effects` and the observations' `look` are off in training; the held-out reality proxy
(`envs/bimanual/reality.py`) turns them on: the scene, the controller and the camera realize them.

`state_dict()` holds the bodies' joint positions and velocities, the controller's targets and latency buffer, the
drawn world, the episode counters and the generator; `load_state_dict` writes them back through the setters.
Genesis keeps contact and solver state that is not saved, so a resumed run continues from the same bodies and world
but not bit-exactly.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from einops import rearrange
from tensordict import TensorDict
from torch import Tensor

from envs.bimanual.config import BAR_LENGTHS, BimanualConfig
from envs.bimanual.control import BimanualController, ControlConfig, quat_rotate
from envs.bimanual.observations import read_state
from envs.bimanual.scene import ARM_KP, ARM_KV, SceneConfig, build_scene
from envs.bimanual.success import (
    LiftWindow,
    bar_tilt,
    grip_reward,
    level_penalty,
    lift_conditions,
    lift_reward,
    reach_reward,
    streak_success,
    update_streak,
    window_overshoot,
)
from envs.task import BoxActionSpec

ACTIONS_PER_ARM = 5
"""dx, dy, dz, dyaw, finger force"""
GRASP_MARGIN = 0.06
"""grasp points this far in from each end of the bar (m)"""
FACTOR_NAMES = (
    "object_mass", "com_shift", "friction", "gain_arm0", "gain_arm1", "action_latency", "camera_latency",
    "base_offset_x", "base_offset_y", "object_size",
)  # fmt: skip
"""the randomized world, in the order of the `env_factors` group"""
FACTOR_BOUNDS = {
    "object_mass": (0.0, 1.0), "com_shift": (-0.05, 0.05), "friction": (0.2, 1.6), "gain_arm0": (0.5, 1.5),
    "gain_arm1": (0.5, 1.5), "action_latency": (0.0, 10.0), "camera_latency": (0.0, 4.0),
    "base_offset_x": (-0.02, 0.02), "base_offset_y": (-0.02, 0.02), "object_size": BAR_LENGTHS,
}  # fmt: skip
"""physical range of each factor mapped onto [-1, 1] (the action latency in `LATENCY_UNIT`s, the camera's in control
steps)"""
LATENCY_UNIT = 0.01
"""seconds per unit of the `action_latency` factor: the training sim's physics step, so that a finer step (the reality
proxy's) reports the same latency in the same units"""
REWARD = {"reach": 0.5, "grip": 1.0, "lift": 2.0, "hold": 2.0, "success": 20.0, "tilt": 0.5, "overshoot": 5.0,
          "action": 0.01}  # fmt: skip
"""weights of the per-step reward terms"""
REACH_SCALE = 0.05
"""distance scale of the reach term (m)"""


def uniform(interval: tuple[float, float], shape: tuple[int, ...], generator: torch.Generator) -> Tensor:
    low, high = interval
    return low + (high - low) * torch.rand(shape, generator=generator)


def scene_config(cfg, object_kind: str, object_size: tuple[float, float, float]) -> SceneConfig:
    """The scene of a two-arm env config `cfg` (the lift's or a variant's: the same timing, randomization and
    observation fields) holding an `object_kind` of `object_size`, its per-env physics at the middle of the randomized
    ranges."""
    rnd, obs = cfg.randomization, cfg.observations
    return SceneConfig(
        num_envs=cfg.num_envs, object_kind=object_kind, object_size=object_size,
        object_mass=sum(rnd.object_mass) / 2, friction=sum(rnd.friction) / 2, dt=cfg.dt, decimation=cfg.decimation,
        batch_dofs_info=True, camera=obs.camera, camera_res=obs.camera_res, camera_renderer=obs.camera_renderer,
        look=obs.look, look_jitter=obs.look_jitter, contact_timeconst=cfg.effects.contact_timeconst,
        arm_base_shift=cfg.effects.base_shift,
        wrist_torque_scale=cfg.effects.wrist_torque_scale, genesis=cfg.genesis,
    )  # fmt: skip


def bar_ends(pos: Tensor, quat: Tensor, half: float) -> Tensor:
    """`(N, 2, 3)` points `half` along a bar's axis each way from its centre `(N, 3)`, arm 0's (the -x one) first."""
    axis = quat_rotate(quat, torch.tensor([1.0, 0.0, 0.0]).expand_as(pos))
    axis = torch.where(axis[:, :1] >= 0, axis, -axis)  # pointing toward arm 1
    return torch.stack([pos - half * axis, pos + half * axis], 1)


class BimanualEnv:
    """Two Franka arms lifting a bar level, batched over `cfg.num_envs` envs."""

    factor_bounds: dict[str, tuple[float, float]] = FACTOR_BOUNDS
    """physical range of each factor mapped onto [-1, 1] by `env_factors`"""
    window: LiftWindow = LiftWindow()
    """the lift's success window"""

    def __init__(self, cfg: BimanualConfig) -> None:
        self.cfg, self.device, self.num_envs = cfg, torch.device(cfg.device), cfg.num_envs
        self.action_space = BoxActionSpec(2 * ACTIONS_PER_ARM)
        self.num_actions = self.action_space.dim
        self.max_episode_length = cfg.max_episode_length
        self.generator = torch.Generator().manual_seed(cfg.seed)
        scene_cfg = self._scene_config()
        self.bs = build_scene(scene_cfg, self.device)
        self.ctrl = BimanualController(self.bs, ControlConfig(max_delay=cfg.max_latency), cfg.effects, self.generator)
        arms = self.bs.arms
        self.finger_links = torch.tensor([arm.get_link(n).idx for arm in arms for n in ("left_finger", "right_finger")])
        self.rest_height = scene_cfg.object_extent[2] / 2
        n = self.num_envs
        self.mass, self.com_shift, self.friction = torch.zeros(n), torch.zeros(n), torch.zeros(n)
        self.gain = torch.ones(n, 2)
        self.action_latency = torch.zeros(n, dtype=torch.long)
        self.camera_latency = torch.zeros(n, dtype=torch.long)
        self.base_offset = torch.zeros(n, 2)
        self.prev_action = torch.zeros(n, self.num_actions)
        self.streak = torch.zeros(n, dtype=torch.long)
        self.episode_length_buf = torch.zeros(n, dtype=torch.long)
        self.episode_reward = torch.zeros(n)
        self.wrench_bias = torch.zeros(n, 2, 6)
        self.wrench_gain = torch.ones(n, 2, 6)
        self.held_steps = torch.zeros(n, dtype=torch.long)  # consecutive control steps the object has been held
        self.error_count = 0
        self.images: Tensor | None = None  # (camera latency + 1, N, 1, H, W) ring, newest last
        self._state: dict[str, Tensor] = {}
        self.reset()

    # ------------------------------------------------------------------------------------ task variant hooks
    # A task variant (the cube handover) overrides these: what the scene holds, where the object starts, what a step
    # reads of it, the success conditions and the reward.
    @property
    def hold_steps(self) -> int:
        """control steps the success conditions must hold without a break"""
        return self.window.hold_steps

    @property
    def object_size(self) -> float:
        """the object's size the `env_factors` group reports (m)"""
        return self.cfg.bar_length

    def _scene_config(self) -> SceneConfig:
        """The scene this task builds."""
        section = self.cfg.bar_section
        return scene_config(self.cfg, "bar", (self.cfg.bar_length, section, section))

    def _start_poses(self, m: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
        """Start positions `(m, 3)` and yaws `(m,)` of the object in `m` envs being reset, drawn from `g`."""
        rnd = self.cfg.randomization
        xy = uniform((-rnd.object_xy, rnd.object_xy), (m, 2), g)
        yaw = uniform((-rnd.object_yaw, rnd.object_yaw), (m,), g)
        return torch.cat([xy, torch.full((m, 1), self.rest_height)], -1), yaw

    def _task_state(self, s: dict[str, Tensor]) -> None:
        """Add what the success test, the reward and the teacher read of the object to the step's state `s` (which holds
        `read_state`'s entries, the object's `height` `(N,)` and the contacts): at least `grasp` `(N, 2, 3)`, each
        arm's grasp point."""
        pos, quat = s["object_pose"][:, :3], s["object_pose"][:, 3:]
        s["tilt"] = bar_tilt(quat)
        half = self.cfg.bar_length / 2
        s["end_height"] = bar_ends(pos, quat, half)[..., 2]
        s["grasp"] = bar_ends(pos, quat, half - GRASP_MARGIN)

    def _holding(self, s: dict[str, Tensor]) -> Tensor:
        """`(N,)` bool: the object is held (here: both fingers of each gripper on the bar), for `held_steps`."""
        return s["finger_touch"].all(-1).all(-1)

    def _conditions(self, s: dict[str, Tensor]) -> Tensor:
        """`(N,)` bool: this step meets the success conditions."""
        return lift_conditions(s["height"], s["tilt"], s["finger_touch"], s["other_touch"], self.window)

    # ------------------------------------------------------------------------------------------------ reset
    def reset(self) -> tuple[TensorDict, dict]:
        self._reset_idx(torch.arange(self.num_envs))
        self.bs.redraw_looks(self.generator)  # a camera student's looks, drawn anew at every full reset
        self._state = {}  # read afresh, camera ring refilled
        return self.get_observations(), {}

    def _reset_idx(self, ids: Tensor) -> None:
        """Redraw the world and the start pose of the envs `ids` `(n,)`; every other env keeps its state."""
        cfg, rnd, g, m = self.cfg, self.cfg.randomization, self.generator, len(ids)
        self.mass[ids] = uniform(rnd.object_mass, (m,), g)
        self.com_shift[ids] = uniform(rnd.com_shift, (m,), g)
        self.friction[ids] = uniform(rnd.friction, (m,), g)
        self.gain[ids] = uniform(rnd.gain_scale, (m, 2), g) * torch.tensor(cfg.effects.arm_gain)
        lat = rnd.action_latency
        self.action_latency[ids] = torch.randint(lat[0], lat[1] + 1, (m,), generator=g)
        cam = rnd.camera_latency
        self.camera_latency[ids] = torch.randint(cam[0], cam[1] + 1, (m,), generator=g)
        self.base_offset[ids] = uniform((-rnd.base_offset, rnd.base_offset), (m, 2), g)
        self.base_offset[ids] += torch.tensor(cfg.effects.base_shift[:2])  # the reality proxy's misregistration
        pos, yaw = self._start_poses(m, g)
        obs = cfg.observations
        self.wrench_bias[ids] = torch.randn(m, 2, 6, generator=g) * obs.wrench_bias
        self.wrench_gain[ids] = uniform(obs.wrench_gain, (m, 2, 6), g)
        bs = self.bs
        bs.reset(ids, pos, yaw)
        self._apply_world(ids)
        self.ctrl.reset(ids)
        if self.ctrl.delay is not None:
            self.ctrl.delay.set_delay(self.action_latency[ids], ids)
        self.prev_action[ids] = 0.0
        self.streak[ids] = 0
        self.held_steps[ids] = 0
        self.episode_length_buf[ids] = 0
        self.episode_reward[ids] = 0.0

    def _apply_world(self, ids: Tensor) -> None:
        """Write the drawn physics of the envs `ids` into the solver."""
        bs = self.bs
        bs.set_friction(self.friction[ids], ids)
        bs.set_object_mass(self.mass[ids], ids)
        shift = torch.zeros(len(ids), 3)
        shift[:, 0] = self.com_shift[ids]
        bs.set_object_com_shift(shift, ids)
        kp, kv = torch.tensor(ARM_KP), torch.tensor(ARM_KV)
        for k, arm in enumerate(bs.arms):
            scale = self.gain[ids, k : k + 1]
            arm.set_dofs_kp(kp[None] * scale, bs.arm_dofs, envs_idx=ids)
            arm.set_dofs_kv(kv[None] * scale, bs.arm_dofs, envs_idx=ids)

    # ------------------------------------------------------------------------------------------------- step
    def step(self, actions: Tensor) -> tuple[TensorDict, Tensor, Tensor, dict]:
        a = torch.nan_to_num(actions.detach().to(torch.float32).cpu()).clamp(-1.0, 1.0)
        per_arm = rearrange(a, "n (arm k) -> n arm k", arm=2)
        c = self.ctrl.cfg
        lo, hi = c.finger_force_range
        force = lo + (per_arm[..., 4] + 1.0) * 0.5 * (hi - lo)
        self.ctrl.step(per_arm[..., :3] * c.max_step, per_arm[..., 3] * c.max_yaw_step, force)
        self.episode_length_buf += 1
        state = self._read()
        error = self._error_envs(state)
        ok = self._conditions(state)
        self.streak = update_streak(self.streak, ok & ~error)
        self.held_steps = torch.where(self._holding(state) & ~error, self.held_steps + 1, 0)
        success = streak_success(self.streak, self.hold_steps) & ~error
        rewards = torch.where(error, torch.zeros(()), self._reward(state, a, ok, success))
        self.episode_reward += rewards
        timeout = self.episode_length_buf >= self.max_episode_length
        terminated = success | error
        dones = terminated | timeout
        log: dict[str, Tensor] = {"error_resets": error.float().sum().reshape(1)}
        if bool(dones.any()):
            finished = dones & ~error
            log["episode/success"] = success[finished].float()
            log["episode/reward"] = self.episode_reward[finished].clone()
            log["episode/length"] = self.episode_length_buf[finished].float()
        extras = {
            # A success ends the episode but is bootstrapped like a time-out: ending on success never forfeits
            # the value of holding on (without it PPO learns to break the streak just short of success).
            "time_outs": (timeout | success) & ~error, "terminated": terminated, "success": success.clone(),
            "error_envs": error.clone(), "height": state["height"].clone(), "log": log,
        }  # fmt: skip
        self.error_count += int(error.sum())
        self.prev_action = a
        walk = self.cfg.observations.wrench_bias_walk
        self.wrench_bias += torch.randn(self.wrench_bias.shape, generator=self.generator) * walk
        done_ids = dones.nonzero(as_tuple=True)[0]
        if len(done_ids):
            self._reset_idx(done_ids)
            state = self._read()
        self._state = state
        self._update_camera(done_ids)
        return self.get_observations(), rewards.to(self.device), dones.to(self.device), extras

    def _read(self) -> dict[str, Tensor]:
        """The state one step's success test, reward and observations read."""
        s = read_state(self.bs, self.ctrl)
        s["height"] = s["object_pose"][:, 2]
        contacts = self.bs.object.get_contacts(is_padded=True)
        valid, la, lb = contacts["valid_mask"], contacts["link_a"], contacts["link_b"]
        other = torch.where(la == self.bs.object_link, lb, la)  # (N, C)
        s["contact_link"] = torch.where(valid, other, -1)  # the solver link the object touches, -1 for no contact
        on_finger = (other[..., None] == self.finger_links) & valid[..., None]  # (N, C, 4)
        s["finger_touch"] = rearrange(on_finger.any(1), "n (arm f) -> n arm f", arm=2)
        s["other_touch"] = (valid & ~on_finger.any(-1)).any(1)
        self._task_state(s)
        return s

    def _error_envs(self, s: dict[str, Tensor]) -> Tensor:
        """`(N,)` envs whose simulation failed: flagged by Genesis, not finite, or moving implausibly fast."""
        error = self.bs.solver.get_error_envs_mask().cpu().reshape(-1)
        for key in ("qpos", "qvel", "object_pose", "object_vel"):
            error |= ~torch.isfinite(s[key]).flatten(1).all(-1)
        speed = torch.nan_to_num(s["object_vel"].abs(), nan=0.0).amax(-1)
        return error | (speed > self.cfg.error_speed)

    def _reward(self, s: dict[str, Tensor], a: Tensor, ok: Tensor, success: Tensor) -> Tensor:
        """`(N,)` this step's reward from the state `s`, the action `a` `(N, 10)`, the success conditions `ok` `(N,)`
        and the success `(N,)`."""
        target = 0.5 * (self.window.min_height + self.window.max_height)
        terms = {
            "reach": reach_reward(s["grasp"] - s["tcp_pos"], REACH_SCALE),
            "grip": grip_reward(s["finger_touch"]),
            "lift": lift_reward(s["end_height"], s["finger_touch"], self.rest_height, target),
            "hold": ok.float(),
            "success": success.float(),
            "tilt": -level_penalty(s["tilt"], math.radians(self.window.max_tilt_deg)),
            "overshoot": -window_overshoot(s["height"], self.window.max_height),
            "action": -a.square().mean(-1),
        }
        return sum(REWARD[k] * v for k, v in terms.items()) * self.cfg.control_dt

    # ------------------------------------------------------------------------------------------ observations
    def _update_camera(self, reset_ids: Tensor) -> None:
        if not self.cfg.observations.camera:
            return
        image = self.bs.render_gray(self.generator)
        depth = self.cfg.randomization.camera_latency[1] + 1
        if self.images is None:
            self.images = image[None].repeat(depth, 1, 1, 1, 1)
            return
        self.images = torch.cat([self.images[1:], image[None]], 0)
        if len(reset_ids):
            self.images[:, reset_ids] = image[None, reset_ids]

    def get_observations(self) -> TensorDict:
        if not self._state:
            self._state = self._read()
            self._update_camera(torch.arange(self.num_envs))
        s, cfg = self._state, self.cfg.observations
        groups: dict[str, Tensor] = {}
        if cfg.teacher:
            groups["teacher"] = self._teacher_obs(s)
        if cfg.env_factors:
            groups["env_factors"] = self.env_factors()
        if cfg.proprio:
            groups["proprio"] = self._proprio_obs(s)
        if cfg.camera:
            depth = self.images.shape[0]
            slot = depth - 1 - self.camera_latency
            groups["camera"] = self.images[slot, torch.arange(self.num_envs)]
        return TensorDict({k: v.to(self.device) for k, v in groups.items()}, batch_size=[self.num_envs])

    def _teacher_obs(self, s: dict[str, Tensor]) -> Tensor:
        quat = s["object_pose"][:, 3:]
        axes = quat_rotate(quat[:, None], torch.eye(3)[[0, 2]].expand(self.num_envs, 2, 3))  # body x and z
        finger_width = s["qpos"][..., -2:]  # (N, 2, 2)
        parts = [
            s["object_pose"][:, :3], axes.flatten(1), s["object_vel"],
            s["tcp_pos"].flatten(1), torch.sin(s["tcp_yaw"]), torch.cos(s["tcp_yaw"]),
            finger_width.flatten(1) * 10.0, (s["grasp"] - s["tcp_pos"]).flatten(1) * 5.0,
            s["finger_contact"].flatten(1) * 0.1, self.prev_action,
            (self.episode_length_buf.float() / self.max_episode_length)[:, None],
        ]  # fmt: skip
        return torch.cat(parts, -1)

    def _proprio_obs(self, s: dict[str, Tensor]) -> Tensor:
        cfg, g = self.cfg.observations, self.generator
        qpos = s["qpos"] + torch.randn(s["qpos"].shape, generator=g) * cfg.joint_noise  # (N, 2, 9)
        noise = torch.randn(self.wrench_bias.shape, generator=g) * cfg.wrench_noise
        wrench = self.tcp_wrench() * self.wrench_gain + self.wrench_bias + noise
        width = s["qpos"][..., -2:].sum(-1)  # (N, 2)
        return torch.cat([self.prev_action, qpos.flatten(1), width * 10.0, wrench.flatten(1) * 0.1], -1)

    def tcp_wrench(self) -> Tensor:
        """`(N, 2, 6)` the TCP wrench that the arm joints' actuator torques balance, `(J Jᵀ + λ² I)⁻¹ J τ` (no gravity
        model: it includes the arm's own weight, as an uncompensated estimate from joint torques would)."""
        bs, dofs = self.bs, self.bs.arm_dofs
        jac = torch.stack(
            [a.get_jacobian(h, local_point=self.ctrl.tcp_offset)[..., dofs] for a, h in zip(bs.arms, bs.hands)], 1
        )  # (N, 2, 6, 7)
        tau = torch.stack([a.get_dofs_control_force(dofs) for a in bs.arms], 1)  # (N, 2, 7)
        eye = torch.eye(6)
        a = jac @ jac.mT + 1e-4 * eye
        return torch.linalg.solve(a, (jac @ tau.unsqueeze(-1))).squeeze(-1)

    def factor_values(self) -> dict[str, Tensor]:
        """Each factor's per-env physical value `(N,)`."""
        return {
            "object_mass": self.mass, "com_shift": self.com_shift, "friction": self.friction,
            "gain_arm0": self.gain[:, 0], "gain_arm1": self.gain[:, 1],
            "action_latency": self.action_latency.float() * (self.cfg.dt / LATENCY_UNIT),
            "camera_latency": self.camera_latency.float(),
            "base_offset_x": self.base_offset[:, 0], "base_offset_y": self.base_offset[:, 1],
            "object_size": torch.full((self.num_envs,), self.object_size),
        }  # fmt: skip

    def env_factors(self) -> Tensor:
        """`(N, len(FACTOR_NAMES))` the randomized world, each factor mapped from `factor_bounds` onto [-1, 1]."""
        values, bounds = self.factor_values(), self.factor_bounds
        cols = [2.0 * (values[k] - bounds[k][0]) / (bounds[k][1] - bounds[k][0]) - 1.0 for k in FACTOR_NAMES]
        return torch.stack(cols, -1)

    # ------------------------------------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        bs, ctrl = self.bs, self.ctrl
        out: dict[str, Any] = {
            "arm_qpos": torch.stack([a.get_qpos() for a in bs.arms], 1),
            "arm_qvel": torch.stack([a.get_dofs_velocity() for a in bs.arms], 1),
            "object_qpos": bs.object.get_qpos(), "object_qvel": bs.object.get_dofs_velocity(),
            "target_pos": ctrl.target_pos.clone(), "target_yaw": ctrl.target_yaw.clone(),
            "q_offset": ctrl.q_offset.clone(), "generator": self.generator.get_state(), "error_count": self.error_count,
        }  # fmt: skip
        for name in (*_PER_ENV, *_ADDED):
            out[name] = getattr(self, name).clone()
        if ctrl.delay is not None:
            out["delay_buf"], out["delay_head"] = ctrl.delay.buf.clone(), ctrl.delay.head
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in _PER_ENV:
            setattr(self, name, state[name].clone())
        for name, default in _ADDED.items():  # a state saved before the field existed: its neutral value
            setattr(self, name, state[name].clone() if name in state else default(self))
        self.generator.set_state(state["generator"])
        self.error_count = int(state["error_count"])
        bs, ctrl, everyone = self.bs, self.ctrl, torch.arange(self.num_envs)
        for k, arm in enumerate(bs.arms):
            arm.set_qpos(state["arm_qpos"][:, k], envs_idx=everyone, zero_velocity=False)
            arm.set_dofs_velocity(state["arm_qvel"][:, k], envs_idx=everyone)
        bs.object.set_qpos(state["object_qpos"], envs_idx=everyone, zero_velocity=False)
        bs.object.set_dofs_velocity(state["object_qvel"], envs_idx=everyone)
        self._apply_world(everyone)
        ctrl.target_pos, ctrl.target_yaw = state["target_pos"].clone(), state["target_yaw"].clone()
        ctrl.q_offset = state["q_offset"].clone()
        if ctrl.delay is not None:
            ctrl.delay.set_delay(self.action_latency, everyone)
            ctrl.delay.buf, ctrl.delay.head = state["delay_buf"].clone(), int(state["delay_head"])
        self._state = self._read()

    def close(self) -> None:
        self.bs.close()


_PER_ENV = ("mass", "com_shift", "friction", "gain", "action_latency", "camera_latency", "base_offset",
            "prev_action", "streak", "episode_length_buf", "episode_reward", "wrench_bias")  # fmt: skip
"""the per-env tensors an env state saves and loads"""
_ADDED = {
    "wrench_gain": lambda env: torch.ones_like(env.wrench_bias),
    "held_steps": lambda env: torch.zeros_like(env.streak),
}
"""per-env tensors added since the first saved states, each with the value an older state loads with"""
