"""Subprocess smoke tests of every experiments/ script (smoke presets) and of their bad-input handling."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, timeout: float = 240, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**(os.environ if env is None else env), "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}
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


def test_a_foreign_checkpoint_exits_2_with_one_line(tmp_path):
    """A student where a teacher is expected, and a file that is no checkpoint: one line naming the file, exit 2."""
    student = ROOT / "tests" / "data" / "format1" / "student_v1.pt"
    proc = run("experiments.distill_student", "smoke", "--teacher", str(student), "--run-dir", str(tmp_path / "s"))
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = proc.stderr.strip().splitlines()
    assert f"{student}: is a 'gapbridge.student' checkpoint, expected 'gapbridge.teacher'" in line
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint")
    proc = run("experiments.evaluate", "default", "--checkpoint", str(garbage))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert str(garbage) in line and "not a readable checkpoint" in line


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


def test_demo_smoke_runs_every_stage(demo_smoke):
    proc, tmp_path = demo_smoke
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert {"teacher", "student", "export", "deployment_loop", "transfer"} <= set(summary)
    assert (tmp_path / "export" / "student.onnx").is_file() and "student.onnx" in summary["export"]["files"]
    assert summary["deployment_loop"]["steps"] == 10 and summary["student"]["rounds"] == 2
    assert summary["teacher"]["checkpoint"].endswith("teacher.pt")
    assert "consecutive-good" in (tmp_path / "transfer" / "transfer.md").read_text()


def test_every_ablation_variant_changes_its_stage_config():
    """Each variant's flags parse as the stage script's own command line and change its base run (`base` alone
    changes nothing)."""
    from experiments import distill_student, train_teacher
    from experiments.ablate import VARIANTS, AblateConfig
    from experiments.cli import parse, stage_args

    base = AblateConfig()
    for stage, variants in VARIANTS.items():
        presets = train_teacher.PRESETS if stage == "teacher" else distill_student.PRESETS
        args = stage_args(stage, base.teacher_args if stage == "teacher" else base.student_args)
        cfg = parse(presets, "", args)
        for name, flags in variants.items():
            changed = parse(presets, "", [*args, *flags])
            assert (changed == cfg) == (name == "base"), f"{stage} variant {name!r} changes nothing"
    student = distill_student.PRESETS
    args = stage_args("student", base.student_args)
    assert parse(student, "", [*args, *VARIANTS["student"]["motion-encoder"]]).student.encoder.motion
    assert not parse(student, "", [*args, *VARIANTS["student"]["no-augment"]]).augment.enabled
    color = parse(student, "", [*args, *VARIANTS["student"]["color-only"]]).augment
    assert (color.color_p, color.translate_p, color.shadow_p, color.sharpen_p, color.noise_p) == (1, 0, 0, 0, 0)
    assert parse(student, "", args).dagger.rounds == 6, "every variant gets the same budget"


def test_no_script_imports_another():
    """experiments/ holds entry points only: a script imports the library and `experiments.cli`, never another
    script (a stage that needs another runs it as a subprocess)."""
    import ast

    offenders = []
    for path in sorted((ROOT / "experiments").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module] if node.module != "experiments" else [f"experiments.{a.name}" for a in node.names]
            elif isinstance(node, ast.ImportFrom):  # relative: from . import x / from .x import y
                names = [f"experiments.<relative>.{node.module or ''}"]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                if name.split(".")[0] == "experiments" and name != "experiments.cli":
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {name}")
    assert not offenders, "scripts importing other experiments modules:\n" + "\n".join(offenders)


def test_demo_stops_at_a_failing_stage_with_its_exit_code_and_says_where_results_went(tmp_path):
    bad = tmp_path / "broken_track.npy"
    np.save(bad, np.zeros((5, 3)))
    out = tmp_path / "demo"
    proc = run("experiments.demo", "smoke", "--out-dir", str(out), "--genesis-drive", f"smoke --tracks {bad}")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "demo stage" in line]
    assert lines == ["error: demo stage 1/6 (python -m experiments.drive_scripted) failed with exit code 2"]
    assert "results so far" in proc.stdout and str(out.resolve()) in proc.stdout
    assert not (out / "teacher").exists(), "the stages after the failing one did not run"
    proc = run("experiments.demo", "smoke", "--out-dir", str(out), "--teacher=--trainer.iterations 2")
    assert proc.returncode == 2 and "preset first" in proc.stderr and "Traceback" not in proc.stderr


def test_a_stage_passes_on_its_exit_code(tmp_path, monkeypatch):
    """A stage's own exit code is what its caller exits with; a stage killed by a signal ends its caller with 1."""
    import pytest

    from experiments.cli import StageFailed, run_stage

    (tmp_path / "exits_3.py").write_text("raise SystemExit(3)\n")
    (tmp_path / "killed.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{ROOT}")
    run_stage("a stage", "json.tool", ["--help"])  # exit 0: nothing raised
    with pytest.raises(StageFailed, match=r"^a stage \(python -m exits_3\) failed with exit code 3$") as failed:
        run_stage("a stage", "exits_3", [])
    assert failed.value.exit_code == 3
    with pytest.raises(StageFailed) as failed:
        run_stage("a stage", "killed", [])
    assert failed.value.returncode < 0 and failed.value.exit_code == 1


def test_wandb_online_without_a_login_is_refused_before_anything_runs(tmp_path):
    """No WANDB_API_KEY and an empty netrc: `--wandb.mode online` ends in one line that says how to log in, exit 2,
    before the run directory (or any env) exists."""
    empty = tmp_path / "netrc"
    empty.write_text("")
    env = {k: v for k, v in os.environ.items() if k not in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE")}
    env.update(NETRC=str(empty), HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path / "xdg"))
    for script, extra in (("experiments.train_teacher", ["--run-dir", str(tmp_path / "run")]),
                          ("experiments.demo", ["--out-dir", str(tmp_path / "demo")])):  # fmt: skip
        proc = run(script, "smoke", "--wandb.mode", "online", *extra, env=env)
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "wandb login" in proc.stderr and "WANDB_API_KEY" in proc.stderr and "--wandb.mode offline" in proc.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "demo").exists()


def test_tables_in_a_log_keep_a_track_file_named_by_its_stem_in_full(tmp_path):
    """Piped output (not a terminal) keeps every table cell whole, and a track given as a file is named by its stem in
    the table and the plot's file name, not by its path."""
    from envs.racing.builtin_tracks import builtin_track

    stem = "a_track_with_a_name_far_longer_than_an_eighty_column_table_has_room_for"
    track = tmp_path / "tracks" / f"{stem}.npy"
    track.parent.mkdir()
    builtin_track("oval").save_deepracer_npy(track)
    out = tmp_path / "out"
    proc = run("experiments.drive_scripted", "smoke", "--tracks", str(track), "--out-dir", str(out),
               "--eval.start-points", "1", "--eval.max-seconds", "3", "--camera-frames", "0")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if stem in line]
    assert len(rows) == 2 and all("forward" in r or "reverse" in r for r in rows), proc.stdout
    assert "…" not in proc.stdout and str(track.parent) not in proc.stdout
    assert (out / f"{stem}_trajectories.png").is_file()


def test_a_resumed_student_run_continues_in_its_own_folder(demo_smoke, tmp_path):
    # `--resume DIR` alone: the run continues in DIR (its shards and manifest), not in the default runs/student.
    proc, out = demo_smoke
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "elsewhere" / "student"
    shutil.copytree(out / "student", run_dir)
    (run_dir / "checkpoints" / "round_002.pt").unlink()
    teacher = str(out / "teacher" / "teacher.pt")
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-m", "experiments.distill_student", "smoke", "--teacher", teacher, "--resume"]
    done = subprocess.run([*args, str(run_dir)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (run_dir / "checkpoints" / "round_002.pt").is_file()
    assert not (tmp_path / "runs").exists()
    other = subprocess.run([*args, str(run_dir), "--run-dir", str(tmp_path / "other")], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=600)  # fmt: skip
    assert other.returncode == 2
    (line,) = other.stderr.strip().splitlines()
    assert f"belongs to the run {run_dir}, but --run-dir is {tmp_path / 'other'}" in line
    assert not (tmp_path / "other").exists()
