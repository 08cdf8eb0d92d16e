"""A distilled student loaded from its checkpoint for evaluation and export: `load_student(path)`."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from adaptation.factor_estimator import INPUT_DIM
from adaptation.history_encoder import ESTIMATES
from datasets.checkpoints import CheckpointError, load_checkpoint
from envs.config_io import from_yaml
from envs.racing.car import ActionSpace
from envs.racing.config import EnvConfig
from student.model import OutputSpec, StudentConfig, StudentModel, StudentPolicy

STUDENT_KIND = "gapbridge.student"


class LoadedStudent:
    """Batched stateful driver (`act`, `reset`) plus what it was trained with."""

    def __init__(self, model: StudentModel, action_space: ActionSpace, env_cfg: EnvConfig, source: str) -> None:
        self.model, self.action_space, self.env_cfg, self.source = model.eval(), action_space, env_cfg, source
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
        obs = env.get_observations()
        if "camera" not in obs.keys():
            raise CheckpointError(f"{self.source}: the student needs a camera env (env.camera projective or genesis)")
        if tuple(obs["camera"].shape[1:]) != (1, 120, 160):
            raise CheckpointError(
                f"{self.source}: camera frames {tuple(obs['camera'].shape[1:])}, expected (1, 120, 160)"
            )
        if env.action_space != self.action_space:
            raise CheckpointError(
                f"{self.source}: action space mismatch (student {self.action_space.kind} "
                f"{list(self.action_space.choices)[:3]}..., env {env.action_space.kind})"
            )


def load_student(path: str | Path) -> LoadedStudent:
    data = load_checkpoint(path, kind=STUDENT_KIND, required=("model", "student_yaml", "env_yaml", "output_spec"))
    cfg = from_yaml(StudentConfig, data["student_yaml"], "student")
    if cfg.has_estimator and not any(k.startswith("estimator.") for k in data["model"]):
        # distilled before the factor estimator existed: its history encoder's own heads estimate the factors
        cfg = replace(cfg, estimator=replace(cfg.estimator, kind="none"))
    inp = data["model"].get("estimator.inp.weight")
    if inp is not None and inp.shape[1] == INPUT_DIM and cfg.estimator.features != "raw":
        # distilled before the estimator read the physics features: it reads its five raw inputs
        cfg = replace(cfg, estimator=replace(cfg.estimator, features="raw"))
    spec = OutputSpec(**data["output_spec"])
    model = StudentModel(cfg, spec)
    head = data["model"].get("history.estimate_head.weight")
    if head is not None and head.shape[0] != len(ESTIMATES):
        raise CheckpointError(
            f"{path}: the student estimates {head.shape[0]} quantities, this version {len(ESTIMATES)} "
            f"({', '.join(ESTIMATES)}); it was distilled by an older version: distill it again"
        )
    try:
        model.load_state_dict(data["model"])
    except RuntimeError as err:
        raise CheckpointError(f"{path}: weights do not match the saved student config ({str(err)[:300]})") from None
    env_cfg = from_yaml(EnvConfig, data["env_yaml"], "env")
    space = ActionSpace.from_metadata(json.loads(data["action_space"]), source=f"{path} (action space)")
    return LoadedStudent(model, space, env_cfg, str(path))
