"""Write the format-1 fixture: a small racing teacher and student and what they score and output.

Run from a checkout of the last version before tasks (format-1 checkpoints), with this project's environment:

    cd <old checkout> && python <this file> OUT_DIR

then copy `teacher_v1.pt`, `student_v1.pt` and `expected.json` from OUT_DIR here. Not collected by pytest.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch

from envs.augment import AugmentConfig
from envs.racing.config import EnvConfig
from envs.racing.evaluation import EvalConfig, evaluate
from student.dagger import DaggerConfig
from student.distiller import Distiller
from student.loaded import load_student
from student.model import StudentConfig
from student.networks import EncoderConfig
from teacher.config import PPOConfig, TeacherPolicyConfig
from teacher.policy import load_teacher
from teacher.trainer import TeacherTrainer, TrainerConfig


def main(out: Path) -> None:
    env = EnvConfig(num_envs=8, compile=False)
    ev = EvalConfig(start_points=2, laps=1, max_seconds=3.0)
    torch.manual_seed(0)
    policy = TeacherPolicyConfig(hidden_dims=(32, 32), critic_hidden_dims=(16,))
    trainer = TrainerConfig(iterations=3, eval_every=3, save_every=3)
    TeacherTrainer(env, policy, PPOConfig(num_steps_per_env=8), trainer, ev, out / "t").train(show_progress=False)
    teacher_path = out / "t" / "checkpoints" / "iter_000003.pt"
    dagger = DaggerConfig(
        rounds=1, envs=3, steps_per_round=12, train_steps=2, batch_windows=2, labels_per_window=3, bf16="off",
        estimator_fit_steps=5,
    )  # fmt: skip
    student_cfg = StudentConfig(encoder=EncoderConfig(channels=(8, 8, 8), embed_dim=16))
    Distiller(
        load_teacher(teacher_path), env, student_cfg, dagger, AugmentConfig(), ev, out / "s", str(teacher_path)
    ).run(show_progress=False)
    student_path = out / "s" / "checkpoints" / "round_001.pt"
    teacher_eval, _, _ = evaluate(load_teacher(teacher_path).act, env, ev)
    student = load_student(student_path)
    camera_env = EnvConfig(num_envs=8, compile=False, camera="projective")
    student_eval, _, _ = evaluate(student.act, camera_env, ev, reset=student.reset)
    g = torch.Generator().manual_seed(5)
    cam = torch.randint(0, 255, (2, 1, 120, 160), generator=g, dtype=torch.uint8)
    prev = torch.rand(2, 2, generator=g)
    outputs, heads, _ = student.model.step(cam, prev, student.model.init_state(2))
    expected = {
        "teacher_eval": teacher_eval,
        "student_eval": student_eval,
        "student_outputs": outputs.tolist(),
        "student_estimates": heads["estimates"].tolist(),
        "student_action_latency_logits": heads["action_latency_logits"].tolist(),
    }
    shutil.copy(teacher_path, out / "teacher_v1.pt")
    shutil.copy(student_path, out / "student_v1.pt")
    (out / "expected.json").write_text(json.dumps(expected, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
