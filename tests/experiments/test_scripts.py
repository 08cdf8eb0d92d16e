"""Subprocess smoke tests of every experiments/ script (smoke presets) and of their bad-input handling."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def test_drive_scripted_smoke(tmp_path):
    proc = run("experiments.drive_scripted", "smoke", "--out-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["oval"]["metrics"]["lap_completion"] == 1.0
    assert (tmp_path / "oval_trajectories.png").stat().st_size > 10_000
    assert (tmp_path / "oval_projective_camera.png").stat().st_size > 5_000


def test_benchmark_smoke(tmp_path):
    out = tmp_path / "bench.json"
    proc = run("experiments.benchmark", "smoke", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    kinds = {(r["kind"], r["driver"]) for r in report["results"]}
    assert kinds == {("state", "random"), ("state", "pure-pursuit"), ("camera", "random")}
    # The scripted driver keeps every car on the track over the few timed steps: no resets in its workload.
    assert next(r for r in report["results"] if r["driver"] == "pure-pursuit")["resets_per_step"] == 0
    assert all(r["env_steps_per_s"] > 0 and r["peak_rss_mib"] > 0 for r in report["results"])
    assert report["machine"]["cpu_count"] >= 1


def test_student_benchmark_smoke(tmp_path):
    out = tmp_path / "student.json"
    proc = run("experiments.benchmark_student", "smoke", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["variant"]: r for r in json.loads(out.read_text())["results"]}
    assert set(rows) == {"default", "motion-encoder"}
    # DAgger windows hold the context before the labels; the motion encoder reads one frame further back and keeps
    # the previous frame (and a reset flag) in its deployment state.
    assert rows["motion-encoder"]["window_frames"] == rows["default"]["window_frames"] + 1
    assert rows["motion-encoder"]["state_floats_per_car"] == rows["default"]["state_floats_per_car"] + 120 * 160 + 1
    assert all(r["train_windows_per_s"] > 0 and r["deploy_frames_per_s"] > 0 for r in rows.values())
    proc = run("experiments.benchmark_student", "smoke", "--variants", "default", "no-such-variant")
    assert proc.returncode == 2 and "no-such-variant" in proc.stderr and "Traceback" not in proc.stderr


def test_bad_input_exits_nonzero_with_one_line(tmp_path):
    bad = tmp_path / "broken_track.npy"
    np.save(bad, np.zeros((5, 3)))
    proc = run("experiments.drive_scripted", "smoke", "--tracks", str(bad), "--out-dir", str(tmp_path))
    assert proc.returncode == 2
    assert "broken_track.npy" in proc.stderr and "Traceback" not in proc.stderr
    proc = run("experiments.drive_scripted", "smoke", "--env.randomization.friction-range", "1.5", "0.5")
    assert proc.returncode == 2 and "randomization.friction_range" in proc.stderr and "Traceback" not in proc.stderr
    proc = run("experiments.drive_scripted", "smoke", "--no-such-flag", "1")
    assert proc.returncode != 0
    meta = tmp_path / "model_metadata.json"
    meta.write_text(json.dumps({"action_space": [{"steering_angle": 50, "speed": 1.0}]}))
    proc = run("experiments.drive_scripted", "smoke", "--env.action-space", str(meta), "--out-dir", str(tmp_path))
    assert proc.returncode == 2 and "outside ±30" in proc.stderr


def test_a_raising_deepracer_reward_function_exits_2_with_one_line(tmp_path):
    reward = tmp_path / "typo_reward.py"
    reward.write_text("def reward_function(params):\n    return params['nonexistent_key']\n")
    proc = run(
        "experiments.train_teacher", "smoke", "--run-dir", str(tmp_path / "run"),
        "--env.reward.deepracer-function", str(reward),
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert f"{reward}:2: reward_function raised KeyError: 'nonexistent_key' at step 1 of env 0" in line
    assert "params keys: all_wheels_on_track," in line


def test_demo_smoke_runs_every_stage(tmp_path):
    proc = run("experiments.demo", "smoke", "--out-dir", str(tmp_path), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert {"teacher", "student", "export", "deployment_loop", "transfer"} <= set(summary)
    assert (tmp_path / "export" / "student.onnx").is_file()
    assert "consecutive-good" in (tmp_path / "transfer" / "transfer.md").read_text()


def test_every_ablation_variant_applies_to_its_stage_config():
    from experiments.ablate import VARIANTS, AblateConfig, apply_overrides

    base = AblateConfig()
    for stage, variants in VARIANTS.items():
        cfg = base.teacher_cfg if stage == "teacher" else base.student_cfg
        for name, overrides in variants.items():
            changed = apply_overrides(cfg, overrides)
            assert (changed == cfg) == (name == "base"), f"{stage} variant {name!r} changes nothing"
    assert apply_overrides(base.student_cfg, VARIANTS["student"]["motion-encoder"]).student.encoder.motion
