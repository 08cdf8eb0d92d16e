"""The tiny racing teacher, DAgger and student settings the student tests share (seconds, not minutes)."""

from __future__ import annotations

from envs.augment import AugmentConfig
from envs.racing.config import EnvConfig
from envs.racing.evaluation import EvalConfig
from student.dagger import DaggerConfig
from student.distiller import Distiller
from student.model import StudentConfig
from student.networks import EncoderConfig
from teacher.config import PPOConfig, TeacherPolicyConfig
from teacher.policy import load_teacher
from teacher.trainer import TeacherTrainer, TrainerConfig

ENV = EnvConfig(num_envs=8, compile=False)
DAGGER = DaggerConfig(
    rounds=2,
    envs=3,
    steps_per_round=12,
    train_steps=2,
    batch_windows=2,
    labels_per_window=3,
    bf16="off",
    estimator_fit_steps=5,
)
STUDENT = StudentConfig(encoder=EncoderConfig(channels=(8, 8, 8), embed_dim=16))
EVAL = EvalConfig(start_points=1, laps=1, max_seconds=2.0)


def make_teacher(tmp_path_factory):
    """One PPO iteration of a 16-unit teacher: a checkpoint to distill from."""
    tmp = tmp_path_factory.mktemp("teacher")
    t = TeacherTrainer(ENV, TeacherPolicyConfig(hidden_dims=(16,), critic_hidden_dims=(16,)),
                       PPOConfig(num_steps_per_env=4), TrainerConfig(iterations=1), EVAL, tmp)  # fmt: skip
    return t.save(tmp / "teacher.pt")


def distiller(teacher_path, run_dir, **kw):
    return Distiller(load_teacher(teacher_path), ENV, STUDENT, kw.get("dagger", DAGGER), AugmentConfig(), EVAL, run_dir)
