"""`experiments.benchmark_gpu`: the cpu-smoke preset writes every section; `--device cuda` without CUDA is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "experiments.benchmark_gpu", *args], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip


def test_cpu_smoke_writes_every_section(tmp_path):
    out = tmp_path / "b.json"
    proc = run("cpu-smoke", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["device"]["type"] == "cpu" and report["machine"]["cpu_count"] >= 1
    assert report["versions"]["torch"] == torch.__version__
    assert report["peer"]["state_env_steps_per_s"]["value"] == 690_000 and report["goals"]["camera_frames_per_s"]
    assert [r["num_envs"] for r in report["state"]] == [64, 128]
    assert all(r["status"] == "ok" and r["env_steps_per_s"] > 0 for r in report["state"]), report["state"]
    (camera,) = report["camera"]
    assert camera["status"] == "ok" and camera["frames_per_s"] > 0 and camera["render_only_frames_per_s"] > 0
    assert camera["image"] == [1, 120, 160]
    assert [r["status"] for r in report["genesis"]] == ["skipped"]
    (teacher,) = report["teacher"]
    assert teacher["status"] == "ok", teacher
    assert teacher["iterations"] == 3 and teacher["env_steps"] > 0 and teacher["env_steps_per_s"] > 0
    assert all(0.0 <= teacher["final_eval"][d] <= 1.0 for d in ("forward", "reverse"))
    # One periodic evaluation every 2 iterations and at the last one, each timed by its checkpoint's write.
    assert [h["iteration"] for h in teacher["history"]] == [2, 3]
    assert all(0 < h["seconds_from_run_start"] < h["seconds_from_launch"] for h in teacher["history"])
    assert teacher["reached_target"] == (teacher["first_at_target"] is not None)
    (student,) = report["student"]
    assert student["status"] == "ok" and student["variant"] == "default"
    assert student["train_frames_per_s"] == pytest.approx(student["train_windows_per_s"] * student["window_frames"])
    assert student["deploy_frames_per_s"] > 0
    (dagger,) = report["dagger"]  # DAgger end to end from the benchmark's teacher
    assert dagger["status"] == "ok" and dagger["rounds"] == 1 and dagger["samples"] > 0 and dagger["samples_per_s"] > 0
    figures = {row["figure"] for row in report["comparison"]}
    assert {"state env-steps/s", "camera frames/s (160x120)", "teacher s to target laps"} <= figures
    assert "deepracer-genesis" in proc.stdout, "the table names the peer"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_cuda_without_cuda_is_refused_in_one_line(tmp_path):
    proc = run("default", "--out", str(tmp_path / "b.json"), timeout=60)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == [
        "error: --device cuda: torch sees no CUDA device on this machine; use --device cpu"
    ]
    assert not (tmp_path / "b.json").exists()
