"""One policy interface for teachers and students, and one way to load either: `load_policy(path)`.

Every policy, whatever made it, drives a batched env of its task the same way (LeRobot's `select_action` / `reset`):
`act(obs)` returns the deterministic actions for the current observations and advances any recurrent state, and
`reset(dones)` clears that state where an episode ended (a memoryless teacher ignores it). Each also knows its `task`,
the env config it was trained in (`env_cfg`), its `action_space`, where it came from (`source`), and refuses an env
of another task, observation layout or action spec (`check_env`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from tensordict import TensorDict
from torch import Tensor

from datasets.checkpoints import CheckpointError, load_checkpoint
from envs.task import ActionSpec, Task
from student.loaded import STUDENT_KIND, load_student
from teacher.policy import TEACHER_KIND, load_teacher


@runtime_checkable
class Policy(Protocol):
    task: Task
    env_cfg: Any
    action_space: ActionSpec
    source: str

    def act(self, obs: TensorDict) -> Tensor: ...

    def reset(self, dones: Tensor) -> None: ...

    def check_env(self, env: Any) -> None: ...


def load_policy(path: str | Path, **env_overrides: Any) -> Policy:
    """Any saved teacher or student -> its `Policy`. `env_overrides` replace fields of its env config, so that every
    evaluation env built from it has them (racing: `max_speed_percent=75.0`, the car's speed setting)."""
    data = load_checkpoint(path)
    kind = data.get("kind")
    if kind == TEACHER_KIND:
        policy = load_teacher(path)
    elif kind == STUDENT_KIND:
        policy = load_student(path)
    else:
        raise CheckpointError(f"{path}: not a policy checkpoint (kind {kind!r}; a teacher's or a student's expected)")
    if env_overrides:
        policy.env_cfg = replace(policy.env_cfg, **env_overrides)
    return policy
