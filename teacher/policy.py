"""A trained teacher loaded for inference: `load_teacher(path)` -> `TeacherPolicy` with `act`, `logits` and `z`.

A checkpoint records its task; the task's registry entry rebuilds its env config and action spec, and a teacher is
refused, naming both sides, by an env of another task, observation layout or action spec."""

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
from envs.task import ActionSpec, Task, TaskMismatchError, get_task
from teacher.config import TeacherPolicyConfig

TEACHER_KIND = "gapbridge.teacher"
FORMAT_VERSION = 2
"""2: the checkpoint names its task (`task`); version 1 files predate tasks and are racing teachers"""


def checkpoint_task(data: dict[str, Any], source: str) -> Task:
    """The task a checkpoint was written for (its `task` entry; version-1 files were all written by racing)."""
    version = int(data.get("format_version", 1))
    if version > FORMAT_VERSION:
        raise CheckpointError(f"{source}: format version {version} is newer than this version reads ({FORMAT_VERSION})")
    return get_task(str(data.get("task", "racing")))


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
    def of_env(cls, env, factor_names: tuple[str, ...]) -> ObsLayout:
        obs = env.get_observations()
        return cls(int(obs["teacher"].shape[-1]), int(obs["env_factors"].shape[-1]), tuple(factor_names))


def check_compatible(source: str, task: Task, layout: ObsLayout, space: ActionSpec, env) -> None:
    """Refuse a policy whose task, observation layout or action space differs from the env's, naming both sides."""
    from envs.task import task_of_config

    env_task = task_of_config(env.cfg)
    if env_task.name != task.name:
        raise TaskMismatchError(f"{source}: a teacher of task {task.name!r}, the env is of task {env_task.name!r}")
    task.check_groups(env, ("teacher", "env_factors"), "the teacher")
    env_layout = ObsLayout.of_env(env, task.factor_names)
    if layout != env_layout:
        diffs = [
            f"{k}: policy {getattr(layout, k)} vs env {getattr(env_layout, k)}"
            for k in ("teacher", "env_factors", "factor_names")
            if getattr(layout, k) != getattr(env_layout, k)
        ]
        raise CheckpointError(f"{source}: observation layout mismatch ({'; '.join(diffs)})")
    if space != env.action_space:
        raise CheckpointError(
            f"{source}: action space mismatch (policy {space.kind} with {space.num_outputs} outputs "
            f"{str(space.to_dict())[:80]}..., env {env.action_space.kind} with {env.action_space.num_outputs} "
            f"{str(env.action_space.to_dict())[:80]}...)"
        )


class TeacherPolicy:
    """Deterministic teacher for inference and distillation (eval mode: dropout off)."""

    def __init__(
        self,
        actor,
        task: Task,
        action_space: ActionSpec,
        layout: ObsLayout,
        env_cfg,
        source: str,
        policy_cfg: TeacherPolicyConfig | None = None,
    ) -> None:
        self.actor = actor.eval()
        self.task, self.action_space, self.layout, self.env_cfg = task, action_space, layout, env_cfg
        self.source = source
        self.policy_cfg = policy_cfg  # the actor's architecture: what a student reusing its trunk rebuilds it from

    def reset(self, dones: Tensor) -> None:
        """The teacher is memoryless: nothing to clear (the policy interface's `reset`)."""

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

    def observation_scale(self) -> tuple[Tensor, Tensor]:
        """Centre and scale `(teacher,)` of the `teacher` group as the actor reads it: `(obs - centre) / scale` is its
        input (its running normalizer's mean and std + eps; 0 and 1 for an actor without a normalizer)."""
        norm, width = self.actor.obs_normalizer, self.layout.teacher
        if not hasattr(norm, "mean"):  # torch.nn.Identity: the actor reads the raw group
            return torch.zeros(width), torch.ones(width)
        return norm.mean[:width].float().cpu(), (norm.std[:width] + norm.eps).float().cpu()

    def to(self, device: str | torch.device) -> TeacherPolicy:
        self.actor.to(device)
        return self

    def check_env(self, env) -> None:
        check_compatible(self.source, self.task, self.layout, self.action_space, env)


def load_teacher(path: str | Path, device: str = "cpu") -> TeacherPolicy:
    """Load a teacher checkpoint (any saved iteration) with one call."""
    from teacher.rsl_adapter import build_actor

    data = load_checkpoint(
        path, kind=TEACHER_KIND, required=("actor", "policy_yaml", "env_yaml", "action_space", "obs_layout")
    )
    task = checkpoint_task(data, str(path))
    policy_cfg = from_yaml(TeacherPolicyConfig, data["policy_yaml"], "policy")
    env_cfg = from_yaml(task.config_cls, data["env_yaml"], "env")
    space = task.action_spec_from_dict(json.loads(data["action_space"]))
    layout = ObsLayout.from_dict(data["obs_layout"])
    obs = TensorDict(
        {"teacher": torch.zeros(1, layout.teacher), "env_factors": torch.zeros(1, layout.env_factors)}, batch_size=[1]
    )
    num_choices = space.num_outputs if space.kind == "discrete" else 0
    actor = build_actor(obs, space.num_actions, policy_cfg, space.kind, num_choices, layout.factor_names)
    try:
        actor.load_state_dict(data["actor"])
    except RuntimeError as err:
        raise CheckpointError(
            f"{path}: actor weights do not match the saved policy config ({str(err)[:300]})"
        ) from None
    return TeacherPolicy(actor.to(device), task, space, layout, env_cfg, str(path), policy_cfg)
