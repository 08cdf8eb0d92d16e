"""Checkpoints written before tasks existed (format 1, racing only) load and evaluate to the numbers they scored
then. `tests/data/format1/` holds a small teacher and student written by that version (`make_fixture.py` there, run
from a checkout of it) and `expected.json`, what they scored and output there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from envs.racing.config import EnvConfig
from envs.racing.evaluation import EvalConfig, evaluate
from student.loaded import load_student
from teacher.policy import load_teacher

DATA = Path(__file__).parents[1] / "data" / "format1"
EXPECTED = json.loads((DATA / "expected.json").read_text())
EVAL = EvalConfig(start_points=2, laps=1, max_seconds=3.0)


def same(ours: dict, theirs: dict) -> None:
    assert set(ours) == set(theirs)
    for key, value in theirs.items():
        assert ours[key] == pytest.approx(value, rel=1e-5, abs=1e-6, nan_ok=True), key


def test_a_format_1_teacher_loads_as_racing_and_evaluates_to_the_same_numbers():
    teacher = load_teacher(DATA / "teacher_v1.pt")
    assert teacher.task.name == "racing"
    metrics, _, _ = evaluate(teacher.act, EnvConfig(num_envs=8, compile=False), EVAL)
    same(metrics, EXPECTED["teacher_eval"])


def test_a_format_1_student_loads_as_racing_and_evaluates_to_the_same_numbers():
    student = load_student(DATA / "student_v1.pt")
    assert student.task.name == "racing" and student.model.spec.estimates.latencies == (
        "action_latency",
        "camera_latency",
    )
    g = torch.Generator().manual_seed(5)
    cam = torch.randint(0, 255, (2, 1, 120, 160), generator=g, dtype=torch.uint8)
    prev = torch.rand(2, 2, generator=g)
    outs, heads, _ = student.model.step(cam, prev, student.model.init_state(2))
    for ours, key in ((outs, "student_outputs"), (heads["estimates"], "student_estimates"),
                      (heads["action_latency_logits"], "student_action_latency_logits")):  # fmt: skip
        torch.testing.assert_close(ours, torch.tensor(EXPECTED[key]), rtol=1e-5, atol=1e-6)
    env = EnvConfig(num_envs=8, compile=False, camera="projective")
    metrics, _, _ = evaluate(student.act, env, EVAL, reset=student.reset)
    same(metrics, EXPECTED["student_eval"])


def test_a_checkpoint_of_a_newer_format_is_refused_by_version(tmp_path):
    data = torch.load(DATA / "teacher_v1.pt", weights_only=True)
    data["format_version"] = 99
    torch.save(data, tmp_path / "future.pt")
    with pytest.raises(Exception, match=r"format version 99 is newer than this version reads \(2\)"):
        load_teacher(tmp_path / "future.pt")
