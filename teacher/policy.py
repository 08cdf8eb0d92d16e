"""A trained teacher loaded for inference: `load_teacher(path)` -> `TeacherPolicy` with `act`, `logits` and `z`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict
from torch import Tensor

from datasets.checkpoints import CheckpointError, load_checkpoint
from envs.config_io import from_yaml
from envs.racing.car import ActionSpace
from envs.racing.config import EnvConfig
from teacher.config import TeacherPolicyConfig

TEACHER_KIND = "gapbridge.teacher"


@dataclass(frozen=True)
class ObsLayout:
    """What the policy was trained on: observation group widths and the env-factor order."""

    teacher: int
    env_factors: int
    factor_names: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"teacher": self.teacher, "env_factors": self.env_factors, "factor_names": list(self.factor_names)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ObsLayout:
        return cls(int(data["teacher"]), int(data["env_factors"]), tuple(data["factor_names"]))

    @classmethod
    def of_env(cls, env) -> ObsLayout:
        from envs.racing.randomization import FACTOR_NAMES

        obs = env.get_observations()
        return cls(int(obs["teacher"].shape[-1]), int(obs["env_factors"].shape[-1]), tuple(FACTOR_NAMES))


def check_compatible(source: str, layout: ObsLayout, space: ActionSpace, env) -> None:
    """Refuse a policy whose observation layout or action space differs from the env's, naming the mismatch."""
    env_layout = ObsLayout.of_env(env)
    if layout != env_layout:
        diffs = [
            f"{k}: policy {getattr(layout, k)} vs env {getattr(env_layout, k)}"
            for k in ("teacher", "env_factors", "factor_names")
            if getattr(layout, k) != getattr(env_layout, k)
        ]
        raise CheckpointError(f"{source}: observation layout mismatch ({'; '.join(diffs)})")
    if space != env.action_space:
        raise CheckpointError(
            f"{source}: action space mismatch (policy {space.kind} with {space.num_choices or 2} outputs "
            f"{list(space.choices)[:3]}..., env {env.action_space.kind} {list(env.action_space.choices)[:3]}...)"
        )


class TeacherPolicy:
    """Deterministic teacher for inference and distillation (eval mode: dropout off)."""

    def __init__(self, actor, action_space: ActionSpace, layout: ObsLayout, env_cfg: EnvConfig, source: str) -> None:
        self.actor = actor.eval()
        self.action_space, self.layout, self.env_cfg, self.source = action_space, layout, env_cfg, source

    @torch.no_grad()
    def act(self, obs: TensorDict) -> Tensor:
        """Actions `(N, num_actions)`: the most likely index (discrete) or the mean (continuous)."""
        return self.actor(obs)

    @torch.no_grad()
    def logits(self, obs: TensorDict) -> Tensor:
        """Raw policy outputs `(N, A)`: action logits (discrete) or the action mean (continuous)."""
        return self.actor.mlp(self.actor.get_latent(obs))

    @torch.no_grad()
    def z(self, obs: TensorDict) -> Tensor:
        """The environment latent z = mu(e) `(N, latent_dim)` that the student's history encoder regresses."""
        return self.actor.encode(obs)

    def to(self, device: str | torch.device) -> TeacherPolicy:
        self.actor.to(device)
        return self

    def check_env(self, env) -> None:
        check_compatible(self.source, self.layout, self.action_space, env)


def load_teacher(path: str | Path, device: str = "cpu") -> TeacherPolicy:
    """Load a teacher checkpoint (any saved iteration) with one call."""
    from teacher.rsl_adapter import build_actor

    data = load_checkpoint(
        path, kind=TEACHER_KIND, required=("actor", "policy_yaml", "env_yaml", "action_space", "obs_layout")
    )
    policy_cfg = from_yaml(TeacherPolicyConfig, data["policy_yaml"], "policy")
    env_cfg = from_yaml(EnvConfig, data["env_yaml"], "env")
    space = ActionSpace.from_metadata(json.loads(data["action_space"]), source=f"{path} (action space)")
    layout = ObsLayout.from_dict(data["obs_layout"])
    obs = TensorDict(
        {"teacher": torch.zeros(1, layout.teacher), "env_factors": torch.zeros(1, layout.env_factors)}, batch_size=[1]
    )
    actor = build_actor(obs, space.num_actions, policy_cfg, space.kind, space.num_choices)
    try:
        actor.load_state_dict(data["actor"])
    except RuntimeError as err:
        raise CheckpointError(
            f"{path}: actor weights do not match the saved policy config ({str(err)[:300]})"
        ) from None
    return TeacherPolicy(actor.to(device), space, layout, env_cfg, str(path))
