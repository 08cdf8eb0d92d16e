"""Any saved policy, teacher or student, loaded by one call: `load_policy(path)`."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from datasets.checkpoints import CheckpointError, load_checkpoint
from student.loaded import STUDENT_KIND, load_student
from teacher.policy import TEACHER_KIND, load_teacher


def load_policy(path: str | Path, max_speed_percent: float | None = None):
    """Any saved policy -> an object with `.act(obs)`, `.env_cfg`, `.check_env(env)` (and `.reset(dones)` if it has
    recurrent state). `max_speed_percent` puts the car's maximum-speed setting into its env config, so every
    evaluation env built from it drives the car at that setting."""
    data = load_checkpoint(path)
    kind = data.get("kind")
    if kind == TEACHER_KIND:
        policy = load_teacher(path)
    elif kind == STUDENT_KIND:
        policy = load_student(path)
    else:
        raise CheckpointError(f"{path}: unknown policy kind {kind!r}")
    if max_speed_percent is not None:
        policy.env_cfg = replace(policy.env_cfg, max_speed_percent=max_speed_percent)
    return policy
