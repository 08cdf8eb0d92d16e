"""A distilled student loaded from its checkpoint for evaluation and export: `load_student(path)`."""

from __future__ import annotations

import json
from pathlib import Path

from datasets.checkpoints import CheckpointError, load_checkpoint
from envs.config_io import from_yaml
from envs.task import ActionSpec, Task, TaskMismatchError, get_task, task_of_config
from student.model import OutputSpec, StudentConfig, StudentModel, StudentPolicy

STUDENT_KIND = "gapbridge.student"
FORMAT_VERSION = 2
"""2: the checkpoint names its task and its output spec holds the estimate spec; version 1: racing, before tasks"""


class LoadedStudent:
    """Batched stateful driver (`act`, `reset`) plus what it was trained with."""

    def __init__(self, model: StudentModel, task: Task, action_space: ActionSpec, env_cfg, source: str) -> None:
        self.model, self.task, self.action_space, self.env_cfg = model.eval(), task, action_space, env_cfg
        self.source = source
        self._policy: StudentPolicy | None = None

    def _batch(self, n: int) -> StudentPolicy:
        """The recurrent state for `n` envs (a fresh one when the batch size changes)."""
        if self._policy is None or self._policy.state.shape[0] != n:
            self._policy = StudentPolicy(self.model, n)
        return self._policy

    def act(self, obs):
        return self._batch(obs["camera"].shape[0]).act(obs)

    def reset(self, dones) -> None:
        self._batch(dones.shape[0]).reset(dones)

    @property
    def last_heads(self):
        return self._policy.last_heads if self._policy else {}

    def check_env(self, env) -> None:
        env_task = task_of_config(env.cfg)
        if env_task.name != self.task.name:
            raise TaskMismatchError(
                f"{self.source}: a student of task {self.task.name!r}, the env is of task {env_task.name!r}"
            )
        obs = env.get_observations()
        if "camera" not in obs.keys():
            raise CheckpointError(
                f"{self.source}: the student reads the observation group 'camera', which this env does not offer"
            )
        expected = (1, *self.model.spec.image_hw)
        if tuple(obs["camera"].shape[1:]) != expected:
            raise CheckpointError(f"{self.source}: camera frames {tuple(obs['camera'].shape[1:])}, expected {expected}")
        width = obs["proprio"].shape[-1] if "proprio" in obs.keys() else 0
        if width < self.model.spec.proprio_dim:
            raise CheckpointError(
                f"{self.source}: the student reads {self.model.spec.proprio_dim} proprio columns, the env has {width}"
            )
        if env.action_space != self.action_space:
            raise CheckpointError(
                f"{self.source}: action space mismatch (student {self.action_space.kind} "
                f"{str(self.action_space.to_dict())[:80]}..., env {env.action_space.kind} "
                f"{str(env.action_space.to_dict())[:80]}...)"
            )


def checkpoint_spec(data: dict, source: str) -> OutputSpec:
    """A student checkpoint's output spec. Version-1 files predate tasks: they are racing students whose spec held the
    two latency class counts alone, and whose history encoders named their latency heads after them."""
    version = int(data.get("format_version", 1))
    if version > FORMAT_VERSION:
        raise CheckpointError(f"{source}: format version {version} is newer than this version reads ({FORMAT_VERSION})")
    spec = data["output_spec"]
    if version == 1:
        task = get_task("racing")
        classes = {"action_latency": spec["action_latency_classes"], "camera_latency": spec["camera_latency_classes"]}
        old = {"history.act_latency_head.": "history.latency_heads.action_latency.",
               "history.cam_latency_head.": "history.latency_heads.camera_latency."}  # fmt: skip
        for key in list(data["model"]):
            for before, after in old.items():
                if key.startswith(before):
                    data["model"][after + key[len(before) :]] = data["model"].pop(key)
        return OutputSpec(spec["kind"], spec["num_outputs"], spec["latent_dim"], task.estimates, classes, 2, "racing")
    return OutputSpec.from_dict(spec)


def load_student(path: str | Path) -> LoadedStudent:
    data = load_checkpoint(path, kind=STUDENT_KIND, required=("model", "student_yaml", "env_yaml", "output_spec"))
    cfg = from_yaml(StudentConfig, data["student_yaml"], "student")
    spec = checkpoint_spec(data, str(path))
    task = get_task(spec.task)
    model = StudentModel(cfg, spec)
    try:
        model.load_state_dict(data["model"])
    except RuntimeError as err:
        raise CheckpointError(f"{path}: weights do not match the saved student config ({str(err)[:300]})") from None
    env_cfg = from_yaml(task.config_cls, data["env_yaml"], "env")
    space = task.action_spec_from_dict(json.loads(data["action_space"]))
    return LoadedStudent(model, task, space, env_cfg, str(path))
