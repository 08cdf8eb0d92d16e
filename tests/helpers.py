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
