"""A task with a scripted expert for the warm-start tests: the toy point mass (tests/toy_task.py) under its own name
and config class, whose expert pushes the mass to the goal through its true actuator gain."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

import tests.toy_task as toy
from envs.task import register_task


@dataclass(frozen=True)
class ExpertPointMassConfig(toy.PointMassConfig):
    """The point mass of the task that has a scripted expert."""


class PointMassExpert:
    """A clamped PD push toward the origin, divided by the env's true actuator gain (so imitating it needs the
    factor)."""

    def __init__(self, env: toy.PointMassEnv) -> None:
        self.env = env

    def act(self, obs=None) -> torch.Tensor:
        env = self.env
        return ((-4.0 * env.pos - 2.0 * env.vel) / env.gain[:, None]).clamp(-1.0, 1.0)


TASK = register_task(
    replace(toy.TASK, name="point-mass-expert", config_cls=ExpertPointMassConfig, expert=PointMassExpert)
)
