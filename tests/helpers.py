"""Small env configs for tests."""

from __future__ import annotations

from dataclasses import replace

from envs.racing.config import EnvConfig
from envs.racing.randomization import RandomizationConfig

NO_RANDOMIZATION = RandomizationConfig(
    friction=False,
    mass=False,
    motor_gain=False,
    steering_gain=False,
    steering_offset=False,
    action_latency=False,
    camera_latency=False,
    action_noise=False,
    random_start=False,
    visual=False,
    direction="forward",
)


def small_env_config(**changes) -> EnvConfig:
    """A few envs, nominal world, eager kernels."""
    base = EnvConfig(num_envs=4, randomization=NO_RANDOMIZATION, compile=False)
    return replace(base, **changes)


def racing_spec(kind: str, num_outputs: int, latent_dim: int, action_classes: int, camera_classes: int):
    """A racing student's output spec with the given latency class counts."""
    from envs.task import get_task
    from student.model import OutputSpec

    classes = {"action_latency": action_classes, "camera_latency": camera_classes}
    return OutputSpec(kind, num_outputs, latent_dim, get_task("racing").estimates, classes, 2, "racing")


def in_process_teacher(policy_cfg, teacher_width: int | None = None, factor_names=None, seed: int = 0):
    """An untrained racing teacher built in the process (no env, no PPO): its actor's weights and observation
    normalizer drawn from `seed` (a mean and a spread away from 0 and 1; an output layer of logits of order 1, not
    PPO's near-uniform start), its layout the default env's unless a `teacher_width` or `factor_names` is given."""
    import torch
    from tensordict import TensorDict

    from envs.racing.car import ACTION_SPACES
    from envs.racing.observations import teacher_dim
    from envs.task import get_task
    from teacher.policy import ObsLayout, TeacherPolicy
    from teacher.rsl_adapter import build_actor

    task, cfg = get_task("racing"), EnvConfig()
    names = tuple(task.factor_names if factor_names is None else factor_names)
    width = teacher_dim(cfg.obs.lookahead_points) if teacher_width is None else teacher_width
    space = ACTION_SPACES[cfg.action_space]
    obs = TensorDict({"teacher": torch.zeros(1, width), "env_factors": torch.zeros(1, len(names))}, batch_size=[1])
    torch.manual_seed(seed)
    actor = build_actor(obs, 1, policy_cfg, space.kind, space.num_outputs, names)
    norm = actor.obs_normalizer
    with torch.no_grad():
        norm._mean.copy_(torch.randn_like(norm._mean))
        norm._std.copy_(torch.rand_like(norm._std) * 2.0 + 0.5)
        actor.mlp[-1].weight.normal_(0.0, 0.5)
    return TeacherPolicy(actor, task, space, ObsLayout(width, len(names), names), cfg, f"teacher-{seed}", policy_cfg)
