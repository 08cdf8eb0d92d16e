"""The task contract is real: a second task (a point mass, tests/toy_task.py) trains a teacher with PPO and distills
a camera student with DAgger through the unchanged `teacher/` and `student/` code; the registry refuses unknown
tasks, and checkpoints of one task are refused by another, naming both."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import tests.toy_task as toy
from envs import task as task_module
from envs.augment import AugmentConfig
from envs.errors import GapbridgeError
from envs.task import UnknownTaskError, get_task, task_names, task_of_config
from student.dagger import DaggerConfig
from student.distiller import Distiller
from student.loaded import load_student
from student.model import StudentConfig
from student.networks import EncoderConfig
from student.policies import Policy, load_policy
from teacher.config import PPOConfig, TeacherPolicyConfig
from teacher.policy import load_teacher
from teacher.trainer import TeacherTrainer, TrainerConfig

ENV = toy.PointMassConfig(num_envs=64)
EVAL = toy.PointMassEvalConfig(episodes=64)


@pytest.fixture(scope="module")
def teacher_run(tmp_path_factory):
    """A point-mass teacher trained by PPO for 40 iterations (a few seconds)."""
    run_dir = tmp_path_factory.mktemp("toy_teacher")
    torch.manual_seed(0)
    trainer = TeacherTrainer(
        ENV, TeacherPolicyConfig(hidden_dims=(64, 64), critic_hidden_dims=(64, 64), latent_dim=2),
        PPOConfig(num_steps_per_env=16, learning_rate=3e-3), TrainerConfig(iterations=40, eval_every=40, save_every=40),
        EVAL, run_dir,
    )  # fmt: skip
    before = trainer.evaluate()["success"]
    after = trainer.train(show_progress=False)["success"]
    return run_dir / "checkpoints" / "iter_000040.pt", before, after


def test_registry_knows_both_tasks_and_refuses_an_unknown_one():
    assert {"racing", "point-mass"} <= set(task_names())
    assert task_of_config(ENV) is toy.TASK and get_task("point-mass") is toy.TASK
    with pytest.raises(UnknownTaskError, match=r"unknown task 'nonsense'; known tasks: .*point-mass.*racing"):
        get_task("nonsense")


def test_the_teacher_learns_the_toy_task_through_the_unchanged_trainer(teacher_run):
    path, before, after = teacher_run
    assert after >= 0.9 and after > before + 0.3, (before, after)
    teacher = load_teacher(path)
    assert teacher.task is toy.TASK and teacher.action_space == toy.BoxActionSpec(2)
    env = toy.PointMassEnv(ENV)
    assert teacher.act(env.get_observations()).shape == (64, 2)
    teacher.check_env(env)


def test_the_student_distills_the_toy_task_through_the_unchanged_dagger(teacher_run, tmp_path):
    path, _, teacher_success = teacher_run
    teacher = load_teacher(path)
    dagger = DaggerConfig(
        rounds=4, envs=32, steps_per_round=30, train_steps=60, batch_windows=8, labels_per_window=8,
        learning_rate=2e-3, estimator_fit_steps=0,
    )  # fmt: skip
    student = StudentConfig(encoder=EncoderConfig(channels=(8, 8, 8), embed_dim=16))
    student = replace(student, estimator=replace(student.estimator, kind="none"))
    distiller = Distiller(teacher, ENV, student, dagger, AugmentConfig(enabled=False), EVAL, tmp_path, str(path))
    assert distiller.spec.kind == "continuous" and distiller.spec.estimates is toy.TASK.estimates
    final = distiller.run(show_progress=False)
    assert final["success"] >= 0.8 * teacher_success, (final, teacher_success)
    loaded = load_student(tmp_path / "checkpoints" / "round_004.pt")
    assert loaded.task is toy.TASK
    # one policy interface: teacher and student load through the same call and drive through the same methods
    for policy_path in (path, tmp_path / "checkpoints" / "round_004.pt"):
        policy = load_policy(policy_path, max_steps=12)
        assert isinstance(policy, Policy) and policy.task is toy.TASK and policy.env_cfg.max_steps == 12
        env = toy.PointMassEnv(toy.TASK.student_env_config(policy.env_cfg, 3, None))
        policy.check_env(env)
        policy.reset(torch.ones(3, dtype=torch.bool))
        assert policy.act(env.get_observations()).shape == (3, 2)
    loaded.check_env(toy.PointMassEnv(toy.TASK.student_env_config(ENV, 4, None)))
    # the history encoder regresses the task's own estimate (the gain), nothing of racing's
    assert loaded.model.history.estimate_head.out_features == 1 and len(loaded.model.history.latency_heads) == 0


def test_a_checkpoint_that_is_no_policy_is_refused_by_kind(tmp_path):
    from datasets.checkpoints import save_atomic

    save_atomic({"kind": "gapbridge.something", "format_version": 2}, tmp_path / "x.pt")
    with pytest.raises(GapbridgeError, match=r"not a policy checkpoint \(kind 'gapbridge.something'"):
        load_policy(tmp_path / "x.pt")


def test_a_checkpoint_of_one_task_is_refused_by_another_naming_both(teacher_run):
    from envs.racing.config import EnvConfig
    from envs.racing.env import RacingEnv

    teacher = load_teacher(teacher_run[0])
    with pytest.raises(GapbridgeError, match=r"task 'point-mass'.*task 'racing'"):
        teacher.check_env(RacingEnv(EnvConfig(num_envs=2, compile=False)))


def test_a_task_whose_env_lacks_a_group_the_student_reads_is_refused_by_name(teacher_run, tmp_path, monkeypatch):
    """The toy env without its camera: refused from the config before any env is built when the task declares its
    groups, and on the built env when it does not; either way naming the group."""
    teacher = load_teacher(teacher_run[0])

    def no_env(cfg):
        raise AssertionError("an env was built")

    no_camera = lambda cfg, n, steps: replace(cfg, num_envs=n, camera=False)  # noqa: E731
    blind = replace(toy.TASK, student_env_config=no_camera, make_env=no_env)
    monkeypatch.setitem(task_module._REGISTRY, "point-mass", blind)
    with pytest.raises(GapbridgeError, match=r"task 'point-mass': the student reads .*\['camera'\]"):
        Distiller(teacher, ENV, StudentConfig(), DaggerConfig(rounds=1, envs=2), AugmentConfig(), EVAL, tmp_path)
    undeclared = replace(toy.TASK, student_env_config=no_camera, observation_groups=None)
    monkeypatch.setitem(task_module._REGISTRY, "point-mass", undeclared)
    with pytest.raises(GapbridgeError, match=r"task 'point-mass': the student reads .*\['camera'\].*it has"):
        Distiller(teacher, ENV, StudentConfig(), DaggerConfig(rounds=1, envs=2), AugmentConfig(), EVAL, tmp_path)
