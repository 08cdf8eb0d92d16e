"""The teacher's own policy trunk inside a student (RMA's second phase, `--student.head frozen-teacher`).

The student estimates the teacher's inputs from the camera history — the `teacher` group normalized as the teacher's
network reads it (the privileged head's output) and z (the history encoder's z-hat) — and acts through the teacher's
trunk, copied from the teacher when the student is built and frozen: no gradient reaches its weights, the optimizer
never sees them (`StudentModel.trainable_parameters`) and it stays in eval mode (its dropout off) while the rest of
the student trains. The trunk's input is composed by the teacher's own `policy_input`; where the task's `teacher`
group holds the previous action (`Task.teacher_previous_action`), those columns are the previous action the student
knows, normalized alike, not an estimate.

`TeacherHeadSpec` records what such a student expects of its teacher (the observation layout the teacher's checkpoint
records and z's width) and the trunk's architecture; it is saved in the student's output spec, with the trunk's weights
in the student's own, so that evaluation and export need no teacher. A teacher of another layout is refused, naming
both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from envs.errors import ConfigError
from envs.task import Task, TaskMismatchError
from student.networks import PrivilegedHead
from teacher.networks import mlp, policy_input
from teacher.policy import ObsLayout, TeacherPolicy


@dataclass(frozen=True)
class TeacherHeadSpec:
    """The teacher a frozen-head student expects and the architecture of the trunk it holds."""

    layout: ObsLayout
    """the teacher's observation layout: `teacher` group width, `env_factors` width and factor names"""
    latent_dim: int
    """z's width"""
    hidden_dims: tuple[int, ...]
    activation: str
    dropout: float
    dropout_layers: int
    previous_action: int | None
    """first column of the previous action in the `teacher` group (None: the group does not hold it)"""

    def describe(self) -> str:
        """The expected layout in words (what a refusal names)."""
        return describe_layout(self.layout, self.latent_dim)

    def to_dict(self) -> dict[str, Any]:
        return {
            "layout": self.layout.to_dict(), "latent_dim": self.latent_dim, "hidden_dims": list(self.hidden_dims),
            "activation": self.activation, "dropout": self.dropout, "dropout_layers": self.dropout_layers,
            "previous_action": self.previous_action,
        }  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TeacherHeadSpec:
        prev = data["previous_action"]
        return cls(
            ObsLayout.from_dict(data["layout"]), int(data["latent_dim"]), tuple(int(w) for w in data["hidden_dims"]),
            str(data["activation"]), float(data["dropout"]), int(data["dropout_layers"]),
            None if prev is None else int(prev),
        )  # fmt: skip


def describe_layout(layout: ObsLayout, latent_dim: int) -> str:
    return (
        f"teacher observation {layout.teacher} columns, env factors {layout.env_factors} "
        f"{list(layout.factor_names)}, z {latent_dim}"
    )


def teacher_head_spec(teacher: TeacherPolicy, task: Task, layout: ObsLayout) -> TeacherHeadSpec:
    """What a frozen-head student distilled from `teacher` expects: the observation `layout` of the env it is distilled
    in, the teacher's z width and trunk, and where the task's `teacher` group holds the previous action."""
    if teacher.policy_cfg is None:
        raise ConfigError(f"{teacher.source}: this teacher does not say its policy architecture (load it from a file)")
    cfg, prev = teacher.policy_cfg, task.teacher_previous_action
    start = None if prev is None else layout.teacher + prev
    if start is not None and not 0 <= start <= layout.teacher - task.previous_action_dim:
        raise ConfigError(
            f"task {task.name!r}: teacher_previous_action {prev} puts its {task.previous_action_dim} columns outside "
            f"the {layout.teacher}-column teacher group"
        )
    return TeacherHeadSpec(
        layout, teacher.actor.factor_encoder.latent_dim, tuple(cfg.hidden_dims), cfg.activation, cfg.dropout,
        cfg.dropout_layers, start,
    )  # fmt: skip


def check_head(head: str, history_kind: str, spec) -> bool:
    """Whether a student of `--student.head head` and `--student.history.kind history_kind` acts through a frozen
    teacher trunk; refuses an output spec `spec` that does not fit that head."""
    if head == "free":
        if spec.teacher_head is not None:
            raise ConfigError("student.head free: the output spec holds a frozen teacher head (use frozen-teacher)")
        return False
    th = spec.teacher_head
    if th is None:
        raise ConfigError(
            "student.head frozen-teacher: the output spec holds no teacher head (build it from a teacher)"
        )
    if history_kind == "none":
        raise ConfigError(
            "student.head frozen-teacher reads z-hat from the history encoder: use --student.history.kind tcn or gru"
        )
    if spec.privileged_dim != th.layout.teacher or spec.latent_dim != th.latent_dim:
        raise ConfigError(
            f"student.head frozen-teacher: the spec estimates {spec.privileged_dim} observation columns and a "
            f"{spec.latent_dim}-wide z; the teacher head reads {th.layout.teacher} and {th.latent_dim}"
        )
    return True


class FrozenTeacherHead(nn.Module):
    """The teacher's trunk, frozen: [estimated normalized observation `(..., D)`, z-hat `(..., latent_dim)`] ->
    action logits (or means) `(..., num_outputs)`, exactly as the teacher's actor maps its own inputs."""

    def __init__(self, spec: TeacherHeadSpec, num_outputs: int, previous_action_dim: int) -> None:
        super().__init__()
        self.spec = spec
        width = spec.layout.teacher + spec.latent_dim
        self.trunk = mlp(width, num_outputs, spec.hidden_dims, spec.activation, spec.dropout, spec.dropout_layers)
        self.trunk.requires_grad_(False)
        self.trunk.eval()
        start = spec.previous_action
        self.known = None if start is None else (start, start + previous_action_dim)

    def train(self, mode: bool = True) -> FrozenTeacherHead:
        super().train(mode)
        self.trunk.eval()  # the teacher acts with its dropout off; so does its frozen copy
        return self

    def observation(self, estimate: Tensor, prev_action: Tensor, privileged: PrivilegedHead) -> Tensor:
        """The normalized observation the trunk reads `(..., D)`: the estimate, with the previous-action columns (if the
        group holds them) replaced by the known previous action (the leading columns of `prev_action` `(..., P)`),
        normalized by `privileged`'s centre and scale as the teacher normalizes its own."""
        if self.known is None:
            return estimate
        a, b = self.known
        known = (prev_action[..., : b - a] - privileged.centre[a:b]) / privileged.scale[a:b]
        return torch.cat([estimate[..., :a], known.to(estimate.dtype), estimate[..., b:]], dim=-1)

    def forward(self, observation: Tensor, z: Tensor) -> Tensor:
        return self.trunk(policy_input(observation, z.to(observation.dtype)))

    def copy_teacher(self, teacher: TeacherPolicy) -> None:
        """Take the teacher's trunk weights; a teacher of another observation layout or z width is refused, naming
        both."""
        latent = teacher.actor.factor_encoder.latent_dim
        if teacher.layout != self.spec.layout or latent != self.spec.latent_dim:
            raise TaskMismatchError(
                f"{teacher.source}: a teacher with {describe_layout(teacher.layout, latent)}; this frozen-head student "
                f"expects {self.spec.describe()}"
            )
        try:
            self.trunk.load_state_dict(teacher.actor.mlp.state_dict())
        except RuntimeError as err:
            raise ConfigError(
                f"{teacher.source}: its trunk does not fit the frozen head's architecture ({str(err)[:300]})"
            ) from None
