"""A second task registered through the task contract: a point mass pushed toward a goal.

It shares nothing with racing: a box action (2-D force), one randomized factor (the actuator gain), no latencies, a
privileged observation of position and velocity, and a small top-down camera showing where the mass is. The tests
train its teacher and distill its student through `teacher/` and `student/` unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from tensordict import TensorDict
from torch import Tensor

from envs.errors import check_range
from envs.task import BoxActionSpec, EstimateSpec, Task, register_task

GAIN_RANGE = (0.5, 1.5)
GOAL_RADIUS = 0.15


@dataclass(frozen=True)
class PointMassConfig:
    num_envs: int = 64
    seed: int = 0
    device: str = "cpu"
    compile: bool = False
    max_steps: int = 30
    camera: bool = True
    control_hz: float = 10.0

    def __post_init__(self) -> None:
        check_range("env.num_envs", self.num_envs, 1, 1_000_000)
        check_range("env.max_steps", self.max_steps, 2, 10_000)


@dataclass(frozen=True)
class PointMassEvalConfig:
    episodes: int = 32
    seed: int = 99


class PointMassEnv:
    """Batched point mass: `x' = x + v dt`, `v' = 0.8 v + gain * a dt`; reach within GOAL_RADIUS of the origin."""

    def __init__(self, cfg: PointMassConfig) -> None:
        self.cfg, self.device, self.num_envs = cfg, torch.device(cfg.device), cfg.num_envs
        self.action_space = BoxActionSpec(2)
        self.num_actions, self.max_episode_length = 2, cfg.max_steps
        self.generator = torch.Generator().manual_seed(cfg.seed)
        n = self.num_envs
        self.pos, self.vel = torch.zeros(n, 2), torch.zeros(n, 2)
        self.gain, self.prev_action = torch.ones(n), torch.zeros(n, 2)
        self.episode_length_buf = torch.zeros(n, dtype=torch.long)
        self.reset()

    def _reset_idx(self, ids: Tensor) -> None:
        m = len(ids)
        self.pos[ids] = torch.rand(m, 2, generator=self.generator) * 2.0 - 1.0
        self.vel[ids] = 0.0
        low, high = GAIN_RANGE
        self.gain[ids] = low + (high - low) * torch.rand(m, generator=self.generator)
        self.prev_action[ids] = 0.0
        self.episode_length_buf[ids] = 0

    def reset(self) -> tuple[TensorDict, dict]:
        self._reset_idx(torch.arange(self.num_envs))
        return self.get_observations(), {}

    def step(self, actions: Tensor) -> tuple[TensorDict, Tensor, Tensor, dict]:
        a = actions.reshape(self.num_envs, 2).clamp(-1.0, 1.0)
        dt = 1.0 / self.cfg.control_hz
        before = self.pos.norm(dim=-1)
        self.vel = 0.8 * self.vel + self.gain[:, None] * a * dt * 2.0
        self.pos = self.pos + self.vel * dt
        after = self.pos.norm(dim=-1)
        reached = after < GOAL_RADIUS
        self.episode_length_buf += 1
        timeout = self.episode_length_buf >= self.max_episode_length
        rewards = (before - after) * 10.0 + reached.float()
        dones = reached | timeout
        extras = {"time_outs": timeout & ~reached, "terminated": reached, "success": reached.clone(), "log": {}}
        self.prev_action = a.clone()
        done_ids = dones.nonzero(as_tuple=True)[0]
        if len(done_ids):
            self._reset_idx(done_ids)
        return self.get_observations(), rewards, dones, extras

    def get_observations(self) -> TensorDict:
        low, high = GAIN_RANGE
        groups = {
            "teacher": torch.cat([self.pos, self.vel], -1),
            "env_factors": (2.0 * (self.gain - low) / (high - low) - 1.0)[:, None],
            "proprio": self.prev_action.clone(),
        }
        if self.cfg.camera:
            rows = torch.arange(120).view(1, 120, 1)
            cols = torch.arange(160).view(1, 1, 160)
            py = (60 - self.pos[:, 1] * 50).view(-1, 1, 1)
            px = (80 + self.pos[:, 0] * 50).view(-1, 1, 1)
            blob = ((rows - py).abs() < 6) & ((cols - px).abs() < 6)
            groups["camera"] = (blob.to(torch.uint8) * 255).unsqueeze(1)
        return TensorDict(groups, batch_size=[self.num_envs])

    def state_dict(self) -> dict[str, Any]:
        return {
            "pos": self.pos.clone(), "vel": self.vel.clone(), "gain": self.gain.clone(),
            "prev_action": self.prev_action.clone(), "episode_length_buf": self.episode_length_buf.clone(),
            "generator": self.generator.get_state(),
        }  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in ("pos", "vel", "gain", "prev_action", "episode_length_buf"):
            setattr(self, name, state[name].clone())
        self.generator.set_state(state["generator"])


def run_episodes(act, env: PointMassEnv, cfg: PointMassEvalConfig, reset=None) -> list[bool]:
    """One episode per env from a fixed seed: whether it reached the goal before the time limit."""
    env.generator.manual_seed(cfg.seed)
    obs, _ = env.reset()
    if reset is not None:
        reset(torch.ones(env.num_envs, dtype=torch.bool))
    success = torch.zeros(env.num_envs, dtype=torch.bool)
    finished = torch.zeros(env.num_envs, dtype=torch.bool)
    for _ in range(env.max_episode_length):
        obs, _, dones, extras = env.step(act(obs))
        if reset is not None:
            reset(dones)
        success |= extras["success"] & ~finished
        finished |= dones
    return success.tolist()


TASK = register_task(
    Task(
        name="point-mass",
        config_cls=PointMassConfig,
        make_env=PointMassEnv,
        factor_names=("gain",),
        estimates=EstimateSpec(regressions=("gain",), scale={"gain": (1.0, 0.5)}, factors=("gain",)),
        estimate_targets=lambda env: env.gain[:, None].clone(),
        action_spec_from_dict=BoxActionSpec.from_dict,
        eval_config_cls=PointMassEvalConfig,
        make_eval_env=lambda cfg, ev: PointMassEnv(replace(cfg, num_envs=ev.episodes, seed=ev.seed)),
        run_episodes=run_episodes,
        summarize=lambda records, env: {"success": sum(records) / len(records), "episodes": float(len(records))},
        primary_metric="success",
        selection_metric="success",
        episode_score=float,
        previous_action_dim=2,
        student_env_config=lambda cfg, n, k: replace(cfg, num_envs=n, camera=True, max_steps=k or cfg.max_steps),
        observation_groups=lambda cfg: ("teacher", "env_factors", "proprio", *(("camera",) if cfg.camera else ())),
        factor_bounds={"gain": GAIN_RANGE},
        description="a point mass pushed to a goal (tests only)",
    )
)
