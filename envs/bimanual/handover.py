"""The batched two-arm cube handover env: the bar-lift env's scene, control, randomized world and observation groups,
with a cube that starts on the giver's side and the handover's success test and reward.

Arm 0 (at -x) is the giver, arm 1 (at +x) the receiver. The cube starts at `(start_x, start_y)` on the giver's side,
offset per env by up to `randomization.object_xy` in x and y and turned by up to `randomization.object_yaw`; there it
is out of the receiver's reach, so the giver must bring it over. The episode succeeds when the receiver has held the
cube inside the goal region (`HandoverGoal`: a box on the receiver's side, at least 0.10 m above the table) for the
hold time with both fingers, while the giver has let go (`envs/bimanual/handover_success.py`). Both arms' grasp points
in the teacher's observation are the cube's centre. The cube's side is one per scene (Genesis cannot resize a
geometry per env) and is reported in the `env_factors` group like the bar's length.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import torch
from torch import Tensor

from envs.bimanual.config import (
    EffectsConfig,
    ObservationConfig,
    RandomizationConfig,
    check_latency_buffer,
    nominal,
)
from envs.bimanual.env import FACTOR_BOUNDS, REACH_SCALE, BimanualEnv, scene_config, uniform
from envs.bimanual.handover_success import (
    GIVER,
    RECEIVER,
    HandoverGoal,
    beyond_best,
    handover_conditions,
    handover_terms,
)
from envs.bimanual.scene import SceneConfig
from envs.errors import ConfigError, check_range
from envs.genesis_import import GenesisConfig

CUBE_SIZES = (0.035, 0.05)
"""cube sides the handover allows (m)"""
HANDOVER_FACTOR_BOUNDS = {**FACTOR_BOUNDS, "com_shift": (-0.01, 0.01), "object_size": CUBE_SIZES}
"""physical range of each factor mapped onto [-1, 1] (the bar lift's, with the cube's centre-of-mass shift and side)"""
HANDOVER_REWARD = {
    "reach": 0.5, "grasp": 1.0, "carry": 2.0, "receiver_reach": 0.5, "receiver_grasp": 1.0, "release": 1.0,
    "lift": 2.0, "hold": 2.0, "success": 20.0, "action": 0.01,
}  # fmt: skip
"""weights of the per-step reward terms (`reward="shaped"`), per second"""
HANDOVER_PROGRESS = {
    "reach": 1.0, "grasp": 2.0, "carry": 4.0, "receiver_reach": 1.0, "receiver_grasp": 2.0, "release": 4.0,
    "lift": 4.0,
}  # fmt: skip
"""what `reward="progress"` pays for each shaping term's rise beyond its best so far: a term's whole range once per
episode"""
PROGRESS_STEP_REWARD = {"hold": 2.0, "success": 20.0, "action": 0.01}
"""the per-step terms `reward="progress"` keeps (per second, as `HANDOVER_REWARD`'s)"""
Reward = Literal["progress", "shaped"]


def progress_pay(terms: dict[str, Tensor], best: Tensor) -> tuple[Tensor, Tensor]:
    """`reward="progress"`'s shaping: `(N,)` what the terms `handover_terms` returned pay this step beyond their best
    so far `best` `(N, len(HANDOVER_PROGRESS))`, weighted by `HANDOVER_PROGRESS`, and the updated bests."""
    rise, best = beyond_best(torch.stack([terms[k] for k in HANDOVER_PROGRESS], -1), best)
    return rise @ torch.tensor(list(HANDOVER_PROGRESS.values())), best


def handover_randomization() -> RandomizationConfig:
    """The handover's default ranges: a lighter object than the bar, the cube's centre of mass within 6 mm of its
    middle (allowed for every cube size), its start within 5 cm of the start point, at any yaw (a cube repeats every
    quarter turn)."""
    return RandomizationConfig(object_mass=(0.05, 0.25), com_shift=(-0.006, 0.006), object_xy=0.05, object_yaw=0.785)


@dataclass(frozen=True)
class HandoverConfig:
    """A batched two-arm cube handover env."""

    num_envs: int = 64
    """the number of parallel environments"""
    seed: int = 0
    """seed of the env's generator (start poses, randomization, sensor noise)"""
    device: str = "cpu"
    """torch device of the simulation and the observations"""
    episode_seconds: float = 8.0
    """episode length (s)"""
    dt: float = 0.01
    """physics step (s)"""
    decimation: int = 5
    """physics steps per control step (20 Hz control at the defaults)"""
    cube_size: float = 0.04
    """the cube's side (m): one per scene, Genesis cannot resize a geometry per env"""
    start_x: float = -0.28
    """x of the middle of the cube's start region (m): on the giver's side, out of the receiver's reach"""
    start_y: float = 0.0
    """y of the middle of the cube's start region (m)"""
    reward: Reward = "progress"
    """`progress`: each shaping term (`handover_terms`) pays only its rise beyond its best so far in the episode
    (`HANDOVER_PROGRESS`), plus the hold, success and action terms per step; `shaped`: every term per step
    (`HANDOVER_REWARD`), which pays less while the receiver grips and the giver has not yet let go"""
    max_latency: int = 4
    """capacity of the action latency buffer (physics steps): the most `randomization.action_latency` may draw"""
    randomization: RandomizationConfig = field(default_factory=handover_randomization)
    """per-env ranges; `object_xy` and `object_yaw` are the cube's start offsets from (`start_x`, `start_y`) and its
    yaw, `com_shift` moves its centre of mass along its x axis"""
    observations: ObservationConfig = field(default_factory=ObservationConfig)
    """observation groups"""
    goal: HandoverGoal = field(default_factory=HandoverGoal)
    """the goal region, the giver's release and the hold time"""
    effects: EffectsConfig = field(default_factory=EffectsConfig)
    """the real cell's physics and actuation effects (all off in training)"""
    error_speed: float = 50.0
    """a body speed above this (m/s, rad/s) counts as an exploded simulation and resets the env (a small cube that is
    knocked spins at tens of rad/s)"""
    genesis: GenesisConfig = field(default_factory=GenesisConfig)
    """engine settings, fixed by the first Genesis scene of a process"""

    def __post_init__(self) -> None:
        check_range("env.num_envs", self.num_envs, 1, 65536)
        check_range("env.episode_seconds", self.episode_seconds, 0.5, 120.0)
        check_range("env.dt", self.dt, 1e-4, 0.02)
        check_range("env.decimation", self.decimation, 1, 50)
        check_range("env.cube_size", self.cube_size, *CUBE_SIZES)
        check_range("env.start_x", self.start_x, -0.40, -0.15)
        check_range("env.start_y", self.start_y, -0.15, 0.15)
        check_range("env.max_latency", self.max_latency, 0, 100)
        check_range("env.error_speed", self.error_speed, 1.0, 1000.0)
        if self.reward not in get_args(Reward):
            raise ConfigError(f"env.reward={self.reward!r} is not one of {get_args(Reward)}")
        rnd = self.randomization
        check_latency_buffer(self)
        if rnd.camera_latency[1] > 0 and not self.observations.camera:
            raise ConfigError("randomization.camera_latency needs observations.camera=True")
        shift = self.cube_size / 4
        if not -shift <= rnd.com_shift[0] <= rnd.com_shift[1] <= shift:
            raise ConfigError(
                f"randomization.com_shift={rnd.com_shift!r} moves the cube's centre of mass too far; need "
                f"-{shift} <= low <= high <= {shift} (a quarter of env.cube_size)"
            )
        if self.goal.hold_seconds >= self.episode_seconds:
            raise ConfigError(
                f"goal.hold_seconds={self.goal.hold_seconds} must be shorter than env.episode_seconds="
                f"{self.episode_seconds}"
            )

    @property
    def control_dt(self) -> float:
        """seconds per control step"""
        return self.dt * self.decimation

    @property
    def max_episode_length(self) -> int:
        """control steps per episode"""
        return round(self.episode_seconds / self.control_dt)


class HandoverEnv(BimanualEnv):
    """Two Franka arms handing a cube over from arm 0 to arm 1, batched over `cfg.num_envs` envs."""

    factor_bounds = HANDOVER_FACTOR_BOUNDS
    cfg: HandoverConfig

    def __init__(self, cfg: HandoverConfig) -> None:
        self.best = torch.zeros(cfg.num_envs, len(HANDOVER_PROGRESS))  # each term's best since reset (`progress`)
        super().__init__(cfg)  # which resets every env

    def _reset_idx(self, ids: Tensor) -> None:
        super()._reset_idx(ids)
        self.best[ids] = 0.0

    @property
    def hold_steps(self) -> int:
        return max(1, round(self.cfg.goal.hold_seconds / self.cfg.control_dt))

    @property
    def object_size(self) -> float:
        return self.cfg.cube_size

    @property
    def carry_start_x(self) -> float:
        """where the carry's progress starts: the far edge of the cube's start region (m)"""
        return self.cfg.start_x - self.cfg.randomization.object_xy

    def _scene_config(self) -> SceneConfig:
        side = self.cfg.cube_size
        return scene_config(self.cfg, "cube", (side, side, side))

    def _start_poses(self, m: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
        cfg, rnd = self.cfg, self.cfg.randomization
        xy = uniform((-rnd.object_xy, rnd.object_xy), (m, 2), g) + torch.tensor([cfg.start_x, cfg.start_y])
        yaw = uniform((-rnd.object_yaw, rnd.object_yaw), (m,), g)
        return torch.cat([xy, torch.full((m, 1), self.rest_height)], -1), yaw

    def _task_state(self, s: dict[str, Tensor]) -> None:
        s["grasp"] = s["object_pose"][:, None, :3].expand(-1, 2, -1)
        s["giver_open"] = s["qpos"][:, GIVER, -2:].sum(-1)
        # A cube pressed into the receiver's palm is still the receiver's hold; anything else it touches (the table,
        # the giver's hand or links, the receiver's arm) is not.
        holding = torch.cat([self.finger_links, torch.tensor([self.bs.hands[RECEIVER].idx])])
        link = s["contact_link"]
        s["other_touch"] = ((link >= 0) & ~torch.isin(link, holding)).any(1)

    def _holding(self, s: dict[str, Tensor]) -> Tensor:
        """`(N,)` bool: a gripper (the giver's or the receiver's) holds the cube with both fingers."""
        return s["finger_touch"].all(-1).any(-1)

    def _conditions(self, s: dict[str, Tensor]) -> Tensor:
        return handover_conditions(
            s["object_pose"][:, :3], s["finger_touch"], s["giver_open"], s["other_touch"], self.cfg.goal
        )

    def _reward(self, s: dict[str, Tensor], a: Tensor, ok: Tensor, success: Tensor) -> Tensor:
        terms = handover_terms(
            s["object_pose"][:, :3], s["tcp_pos"], s["finger_touch"], s["giver_open"], self.cfg.goal,
            self.carry_start_x, self.rest_height, REACH_SCALE,
        )  # fmt: skip
        steps = {"hold": ok.float(), "success": success.float(), "action": -a.square().mean(-1)}
        if self.cfg.reward == "shaped":
            terms.update(steps)
            return sum(HANDOVER_REWARD[k] * v for k, v in terms.items()) * self.cfg.control_dt
        pay, self.best = progress_pay(terms, self.best)
        return pay + sum(PROGRESS_STEP_REWARD[k] * v for k, v in steps.items()) * self.cfg.control_dt

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "best": self.best.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.best = state["best"].clone() if "best" in state else torch.zeros_like(self.best)


def nominal_handover(cfg: HandoverConfig) -> HandoverConfig:
    """`cfg` with every randomized factor at its nominal value (the cube's start pose still drawn)."""
    return nominal(cfg, object_mass=0.15)
