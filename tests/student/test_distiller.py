"""DAgger run: exact resume after an interrupted round, manifest bookkeeping, refusal of a mismatched teacher."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from adaptation.estimator_fit import episode_inputs
from adaptation.factor_estimator import MOTION, FactorEstimator
from adaptation.probe import collect_features
from datasets.checkpoints import CheckpointError, save_atomic
from datasets.rollouts import read_manifest
from envs.augment import AugmentConfig
from envs.errors import ConfigError
from envs.vehicle import VEHICLE_ESTIMATES
from experiments.research.probe_student import ProbeConfig
from experiments.research.probe_student import main as probe_main
from student.distiller import Distiller
from student.loaded import load_student
from student.transfer import ROBUST_SUMMARIES
from teacher.policy import load_teacher
from tests.student.tiny import DAGGER, ENV, EVAL, STUDENT, distiller


def test_resume_after_a_killed_round_matches_the_uninterrupted_run(teacher_path, tmp_path):
    # with the privileged head (its weights and targets resume too) and the weights' moving average (it too)
    aux = replace(DAGGER, privileged_weight=0.5, ema_decay=0.9)
    full = distiller(teacher_path, tmp_path / "full", dagger=aux)
    logged = []
    full.log = lambda metrics, step: logged.append(metrics)
    full.run(show_progress=False)
    assert all(m["loss/privileged"] > 0 and np.isfinite(m["train/privileged_r2"]) for m in logged)

    first = distiller(teacher_path, tmp_path / "part", dagger=aux)

    def crash(metrics, step):  # dies in round 2, after collecting and training, before its checkpoint
        if metrics["dagger/round"] == 1.0:
            raise KeyboardInterrupt

    first.log = crash
    with pytest.raises(KeyboardInterrupt):
        first.run(show_progress=False)
    assert [s["file"] for s in read_manifest(tmp_path / "part" / "data")["shards"]] == ["round_000.h5", "round_001.h5"]
    (tmp_path / "part" / "data" / "round_001.h5").write_bytes(b"half a shard")  # and its shard is damaged
    resumed = distiller(teacher_path, tmp_path / "part", dagger=aux)
    resumed.resume(tmp_path / "part" / "checkpoints" / "round_001.pt")
    assert resumed.round == 1
    resumed.run(show_progress=False)
    a, b = full.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a), "bit-exact continuation"
    a, b = full.student.state_dict(), resumed.student.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a), "the average too"
    trained = full.model.state_dict()
    assert any(not torch.equal(a[k], trained[k]) for k in a), "the student is the average, not the last step"
    saved = load_student(tmp_path / "full" / "checkpoints" / f"round_{full.round:03d}.pt").model.state_dict()
    assert all(torch.equal(a[k], saved[k]) for k in a), "the checkpoint's student (what is exported) is the average"
    assert json.dumps(full.history) == json.dumps(resumed.history)
    shards = [s["file"] for s in read_manifest(tmp_path / "part" / "data")["shards"]]
    assert shards == ["round_000.h5", "round_001.h5"]

    # The shards hold the teacher's raw observation of each row (racing's ends with the previous action).
    with h5py.File(tmp_path / "full" / "data" / "round_001.h5", "r") as f:
        n = int(f.attrs["n_valid"])
        privileged, prev_action = f["privileged"][:n], f["prev_action"][:n]
    assert privileged.shape == (n, load_teacher(teacher_path).layout.teacher) and privileged[:, :-2].std(0).max() > 0
    np.testing.assert_array_equal(privileged[:, -2:], prev_action)

    # Weights that do not fit the saved config (here fewer explicit estimates) are refused, not half-loaded.
    ckpt = sorted((tmp_path / "full" / "checkpoints").glob("round_*.pt"))[-1]
    student = load_student(ckpt).model
    assert student.history is not None
    centre, scale = load_teacher(teacher_path).observation_scale()
    assert torch.equal(student.privileged_head.centre, centre) and torch.equal(student.privileged_head.scale, scale)
    # A student saved before the privileged head existed (no head weights, no privileged_dim) loads and drives alike.
    data = torch.load(ckpt, weights_only=True)
    data["model"] = {k: v for k, v in data["model"].items() if not k.startswith("privileged_head.")}
    data["output_spec"].pop("privileged_dim")
    torch.save(data, tmp_path / "headless.pt")
    headless = load_student(tmp_path / "headless.pt").model
    assert headless.privileged_head is None
    cam, prev = torch.randint(0, 256, (2, 1, 120, 160), dtype=torch.uint8), torch.rand(2, 2)
    with torch.no_grad():
        drives = [m.step(cam, prev, m.init_state(2))[0] for m in (headless, student)]
    assert torch.equal(*drives)
    data = torch.load(ckpt, weights_only=True)
    for k in ("history.estimate_head.weight", "history.estimate_head.bias"):
        data["model"][k] = data["model"][k][:3]
    torch.save(data, tmp_path / "old.pt")
    with pytest.raises(CheckpointError, match="weights do not match the saved student config"):
        load_student(tmp_path / "old.pt")


def test_a_fresh_run_does_not_read_an_earlier_runs_data(teacher_path, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "manifest.json").write_text(json.dumps({"schema_version": 1, "shards": [{"file": "round_007.h5"}]}))
    (data / "round_007.h5").write_bytes(b"a shard of an older run")
    distiller(teacher_path, tmp_path).run(show_progress=False)
    assert [s["file"] for s in read_manifest(data)["shards"]] == ["round_000.h5", "round_001.h5"]


def test_teacher_with_another_action_space_is_refused(teacher_path, tmp_path):
    with pytest.raises(CheckpointError, match="action space mismatch"):
        Distiller(load_teacher(teacher_path), replace(ENV, action_space="fast-throttle"), STUDENT, DAGGER,
                  AugmentConfig(), EVAL, tmp_path)  # fmt: skip


def test_distill_smoke_subprocess(demo_smoke, tmp_path):
    """`distill_student smoke` and its transfer report (`select_checkpoint smoke`), as the demo's stages 3 and 6 ran
    them in their own processes; then the report's reruns."""
    import os
    import shutil
    import subprocess
    import sys

    demo, out = demo_smoke
    assert demo.returncode == 0, demo.stderr[-3000:]
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(root)}
    summary = json.loads((out / "student" / "eval.json").read_text())
    assert summary["rounds"] == 2 and (out / "student" / "student_camera.png").is_file()
    assert "heldout/loop_latency_r2" in summary["estimator_fit"] and "factor estimator on held-out" in demo.stdout
    # The run's transfer report (tiny: bicycle/projective proxy with every unmodeled effect).
    report = json.loads((out / "transfer" / "transfer.json").read_text())
    assert len(report["checkpoints"]) == 2 and set(report["picks"]) == {"consecutive-good", "last", "best-single"}
    assert set(report["gap"]) >= {"none", "dynamics", "perception", "all", "gap"}
    assert len(report["spearman_robust_vs_proxy_ci"]) == 2 and len(report["checkpoints"][0]["proxy_episodes"]) == 2
    assert set(report["spearman_by_robust_summary"]) == set(ROBUST_SUMMARIES)
    md = (out / "transfer" / "transfer.md").read_text()
    assert "worst direction's progress" in md and "reproducibility of the ranking" not in md  # 2 checkpoints: nan
    # The reruns below write their report here, from the demo's scores (kept by checkpoint path) and student.
    (tmp_path / "s" / "transfer").mkdir(parents=True)
    shutil.copy(out / "transfer" / "scores.json", tmp_path / "s" / "transfer" / "scores.json")
    rerun = ["--run-dir", str(out / "student"), "--out-dir", str(tmp_path / "s" / "transfer")]
    # The same report with the sim-to-sim score (as `--sim2sim --select-by both` writes it) names it and its column.
    from student.transfer_report import write_report

    s2s = {**report, "select_by": "both", "spearman_sim2sim_vs_proxy": 1.0, "spearman_sim2sim_vs_proxy_ci": (0.5, 1.0),
           "checkpoints": [{**r, "sim2sim": {"score": 0.25}} for r in report["checkpoints"]],
           "reliability": {"robust": {"full_length": 0.81}, "proxy": {"full_length": 0.64}}}  # fmt: skip
    write_report(s2s, tmp_path / "s2s")
    md = (tmp_path / "s2s" / "transfer.md").read_text()
    assert "second physics engine (sim2sim) vs proxy score: **1.000**" in md and "| sim2sim |" in md
    assert "the rules below pick by the `both` score" in md and "can reach about 0.720" in md
    # Run again: every checkpoint's scores come back from scores.json, and the report is the same.
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.select_checkpoint", "smoke", *rerun],
        cwd=root, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.count("scored before") == 2, proc.stdout[-2000:]
    again = json.loads((tmp_path / "s" / "transfer" / "transfer.json").read_text())
    assert [r["proxy"]["score"] for r in again["checkpoints"]] == [r["proxy"]["score"] for r in report["checkpoints"]]
    # More robust episodes: only the robust evaluation is scored again; the fixed lap and the proxy laps are kept.
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.select_checkpoint", "smoke", *rerun, "--robust.repeats", "2",
         "--no-decompose"],
        cwd=root, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.count("(kept 2 scores)") == 2, proc.stdout[-2000:]
    more = json.loads((tmp_path / "s" / "transfer" / "transfer.json").read_text())
    assert [len(r["robust_episodes"]) for r in more["checkpoints"]] == [4, 4]
    assert [r["proxy_episodes"] for r in more["checkpoints"]] == [r["proxy_episodes"] for r in report["checkpoints"]]
    assert 0.0 <= report["agreement"]["agreement"] <= 1.0 and report["agreement"]["steps"] > 0
    assert (tmp_path / "s" / "transfer" / "transfer_scatter.png").stat().st_size > 5_000
    # A tiny robust evaluation in the sim and the proxy.
    student = sorted((out / "student" / "checkpoints").glob("*.pt"))[-1]
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.evaluate", "smoke", "--checkpoint", str(student), "--world", "both",
         "--action-noise", "0.1", "--reality.physics", "bicycle", "--reality.camera", "projective",
         "--reality.substeps", "4", "--no-estimation", "--out-dir", str(tmp_path / "e")],
        cwd=root, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "e" / "eval.json").read_text())
    assert set(result["worlds"]) == {"sim", "proxy", "gap"}
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.evaluate", "smoke", "--checkpoint", str(student), "--world", "proxy",
         "--reality.friction", "9"],
        cwd=root, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 2 and "reality.friction" in proc.stderr and "Traceback" not in proc.stderr
    # The factor estimator refitted on the run's episodes; the student's weights otherwise unchanged.
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.fit_estimator", "default", "--checkpoint", str(student), "--steps", "10",
         "--sim-envs", "4", "--sim-seconds", "2", "--out", str(tmp_path / "fitted.pt")],
        cwd=root, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0 and "heldout:" in proc.stdout and "simulated" in proc.stdout, proc.stderr[-3000:]
    assert "motion estimates (R² after 2 s) from commands" in proc.stdout
    before, after = load_student(student).model.state_dict(), load_student(tmp_path / "fitted.pt").model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before if not k.startswith("estimator."))
    assert any(not torch.equal(before[k], after[k]) for k in before if k.startswith("estimator."))

    # A new estimator that reads odometry, fitted on simulated worlds given the odometry's errors on a tiny drive.
    def fit_odometry(out: str, *extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "experiments.fit_estimator", "odometry", "--checkpoint", str(student), "--steps",
             "10", "--batch", "8", "--sim-seconds", "3", "--estimator.dilations", "1", "2", "--error-drive-envs", "2",
             "--error-drive-steps", "6", "--sim-driver", "both", "--inputs", str(tmp_path / "worlds.pt"), "--out",
             str(tmp_path / out), *extra],
            cwd=root, env=env, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip

    proc = fit_odometry("odometry.pt", "--sim-envs", "6")
    assert proc.returncode == 0 and "odometry errors on 2 drive episodes (12 frames" in proc.stdout, proc.stderr[-3000:]
    assert "driven by the teacher and the student" in proc.stdout and "read from" not in proc.stdout
    fitted = load_student(tmp_path / "odometry.pt").model
    assert fitted.estimator.reads_odometry and fitted.cfg.estimator.dilations == (1, 2)
    after = fitted.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before if not k.startswith("estimator."))
    # the same worlds again: read back from --inputs, and the same fit comes out
    proc = fit_odometry("again.pt", "--sim-envs", "6")
    said = proc.stdout.replace("\n", "")  # the console wraps long paths
    assert proc.returncode == 0 and f"inputs read from {tmp_path / 'worlds.pt'}" in said, proc.stderr[-3000:]
    assert "odometry errors on 2 drive episodes (12 frames" in proc.stdout
    again = load_student(tmp_path / "again.pt").model.state_dict()
    assert all(torch.equal(after[k], again[k]) for k in after)
    # other worlds are refused by name, the file kept
    proc = fit_odometry("other.pt", "--sim-envs", "4")
    flat = " ".join(proc.stderr.replace("│", " ").split())  # the error box wraps at the console's width
    assert proc.returncode == 2 and "sim_envs 6 (now 4)" in flat and "Traceback" not in proc.stderr, proc.stderr
    assert (tmp_path / "worlds.pt").is_file() and not (tmp_path / "other.pt").exists()
    refusals = [  # bad flags: exit 2, the flag named, no traceback
        (["odometry", "--sim-envs", "0"], "--sim-envs N"),
        (["default", "--sim-driver", "student"], "--sim-driver student"),
        (["default", "--data-dir", str(tmp_path / "nowhere")], "manifest.json (the run"),
        (["default", "--inputs", str(tmp_path / "worlds.pt")], "--inputs: only an estimator that reads"),
    ]
    for args, message in refusals:
        proc = subprocess.run(
            [sys.executable, "-m", "experiments.fit_estimator", *args, "--checkpoint", str(student)],
            cwd=root, env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, (args, proc.stderr)


def test_estimator_inputs_replay_each_recorded_episode_as_the_car_runs_it(teacher_path, tmp_path, monkeypatch):
    d = distiller(teacher_path, tmp_path)
    d.run(show_progress=False)
    model = d.model.eval()
    data = episode_inputs(model, tmp_path / "data", batch_frames=40)  # several padded batches per shard
    with h5py.File(tmp_path / "data" / "round_001.h5", "r") as f:
        rows = {k: f[k][:] for k in ("camera", "prev_action", "episode")}
    for e in np.unique(rows["episode"])[:2]:
        sel = np.flatnonzero(rows["episode"] == e)
        state, expected = model.init_state(1), []
        with torch.no_grad():
            for i in sel:
                prev = torch.from_numpy(rows["prev_action"][i : i + 1])
                _, heads, state = model.step(torch.from_numpy(rows["camera"][i : i + 1]), prev, state)
                expected.append(FactorEstimator.inputs(prev, heads["estimates"])[0])
        got = data.inputs[data.episode == int(e)]
        assert torch.allclose(got, torch.stack(expected), atol=1e-4)
        assert data.step[data.episode == int(e)].tolist() == list(range(len(sel)))
    # The probes' replay keeps the same steps (from `min_step` on) with the student's own estimates.
    feats = collect_features(model, tmp_path / "data", min_step=2, batch_frames=40)
    late = data.step >= 2
    assert torch.equal(feats["episode"], data.episode[late]) and torch.equal(feats["targets"], data.targets[late])
    assert feats["image"].shape == feats["image_prev"].shape == (int(late.sum()), STUDENT.encoder.embed_dim)
    follows = torch.nonzero(feats["episode"][1:] == feats["episode"][:-1])[:, 0] + 1  # rows after one of their own
    assert torch.equal(feats["image_prev"][follows], feats["image"][follows - 1])
    first = collect_features(model, tmp_path / "data", min_step=0, batch_frames=40)
    starts = torch.nonzero(torch.cat([torch.tensor([True]), first["episode"][1:] != first["episode"][:-1]]))[:, 0]
    assert not first["image_prev"][starts].any(), "nothing before an episode's first frame"
    assert feats["history"].shape[0] == int(late.sum())
    centre, scale = VEHICLE_ESTIMATES.scale["speed"]  # the estimator's inputs hold the normalized speed estimate
    speed = feats["estimates"][:, VEHICLE_ESTIMATES.regressions.index("speed")]
    assert torch.allclose(speed, data.inputs[late, 2 + MOTION.index("speed")] * scale + centre, atol=1e-4)
    student = d.save(tmp_path / "student.pt")
    result = probe_main(ProbeConfig(checkpoint=str(student), data_dir=str(tmp_path / "data"), min_seconds=0.0,
                                    holdout_every=2, bf16="off", out_dir=str(tmp_path / "probe")))  # fmt: skip
    saved = json.loads((tmp_path / "probe" / "probe.json").read_text())
    assert saved["r2"]["speed"].keys() >= {"head", "image", "image pair", "history", "image+history"}
    assert saved["steps"] == result["steps"] == len(data.episode)
    with pytest.raises(ConfigError, match="no manifest.json"):
        probe_main(ProbeConfig(checkpoint=str(student), data_dir=str(tmp_path / "nowhere")))
    with pytest.raises(ConfigError, match="--checkpoint is required"):
        probe_main(ProbeConfig())
    # The two-frame motion CNN and the estimator fits on its estimates and on the student's.
    from experiments.research.probe_motion import ProbeMotionConfig
    from experiments.research.probe_motion import main as probe_motion_main

    result = probe_motion_main(ProbeMotionConfig(checkpoint=str(student), data_dir=str(tmp_path / "data"), steps=2,
                                                 batch=4, estimator_steps=2, bf16="off", sim_envs=4,
                                                 sim_seconds=2.0, sim_estimator_steps=2, teacher=str(teacher_path),
                                                 sim_motion=("odometry", "noisy_odometry", "exact"),
                                                 error_drive_envs=2, error_drive_steps=6,
                                                 out_dir=str(tmp_path / "pm")))  # fmt: skip
    saved = json.loads((tmp_path / "pm" / "probe_motion.json").read_text())
    assert saved["rows"] == result["rows"] == len(data.episode) and saved["receptive_field"] == 63
    assert set(saved["estimator_heldout"]) == set(saved["motion_r2"]) == {"student", "two_frame", "odometry", "exact"}
    sim = saved["simulated"]  # the estimators of the simulated worlds, scored there and on each source
    assert sim["episodes"] >= 4
    errs = sim["odometry_errors"]  # measured on a drive of 2 cars x 6 frames of the run's camera env
    assert errs["frames"] == 12 and set(errs["gain"]) == set(errs["residual_std"]) == set(MOTION)
    assert all(v > 0 for v in errs["residual_std"].values())
    for kind in ("odometry", "noisy_odometry", "exact"):
        assert set(sim[kind]["recorded"]) == {"student", "two_frame", "odometry", "exact"}
        assert set(sim[kind]["heldout_simulated"]) == set(saved["estimator_heldout"]["student"])
        assert all(isinstance(v, float) for v in sim[kind]["recorded"]["odometry"].values())  # NaN: runs < 2 s
    # The velocities of an earlier run are read back, not measured again; another run's are refused by name.
    import experiments.research.probe_motion as probe_motion_module

    def no_tracking(*args, **kwargs):
        raise AssertionError("the odometry was measured again")

    monkeypatch.setattr(probe_motion_module, "track_episodes", no_tracking)
    pm, pm2 = tmp_path / "pm", tmp_path / "pm2"
    probe_motion_main(ProbeMotionConfig(checkpoint=str(student), data_dir=str(tmp_path / "data"),
                                        sources=("odometry",), motion_from=str(pm / "motion.pt"), estimator_steps=2,
                                        bf16="off", out_dir=str(pm2)))  # fmt: skip
    assert torch.equal(torch.load(pm2 / "motion.pt")["odometry"], torch.load(pm / "motion.pt")["odometry"])
    moved = torch.load(tmp_path / "pm" / "motion.pt")
    moved["step"] = moved["step"] + 1
    save_atomic(moved, tmp_path / "other.pt")
    with pytest.raises(ConfigError, match="not this run's"):
        probe_motion_main(ProbeMotionConfig(checkpoint=str(student), data_dir=str(tmp_path / "data"),
                                            sources=("odometry",), motion_from=str(tmp_path / "other.pt")))  # fmt: skip
    with pytest.raises(ConfigError, match="folds"):
        ProbeMotionConfig(checkpoint=str(student), folds=1)
    with pytest.raises(ConfigError, match="sim_estimator_batch"):
        ProbeMotionConfig(checkpoint=str(student), sim_estimator_batch=0)
    with pytest.raises(ConfigError, match="error_drive_envs"):
        ProbeMotionConfig(checkpoint=str(student), error_drive_envs=0)
    with pytest.raises(ConfigError, match="once each"):
        ProbeMotionConfig(checkpoint=str(student), sources=("odometry", "odometry"))


def test_redrawn_worlds_reach_the_collected_targets_but_not_the_saved_world(teacher_path, tmp_path):
    # Collection episodes of 12 steps with a new world every 0.4 s (6 steps): the friction target changes inside an
    # episode; the world saved with the run (evaluation, checkpoints) is the teacher's.
    run = distiller(teacher_path, tmp_path / "r", dagger=replace(DAGGER, rounds=1, redraw_seconds=0.4))
    assert run.env.cfg.randomization.redraw_seconds == 0.4
    assert run.env_cfg.randomization.redraw_seconds == 0.0 and run.eval_env.cfg.randomization.redraw_seconds == 0.0
    run.run(show_progress=False)
    import h5py

    from envs.vehicle import VEHICLE_ESTIMATES

    shard = tmp_path / "r" / "data" / read_manifest(tmp_path / "r" / "data")["shards"][0]["file"]
    with h5py.File(shard, "r") as f:
        n = int(f.attrs["n_valid"])
        episode, friction = f["episode"][:n], f["targets"][:n, VEHICLE_ESTIMATES.column("friction")]
    changed = [len(set(friction[episode == e].round(6))) > 1 for e in set(episode.tolist())
               if (episode == e).sum() > 6]  # fmt: skip
    assert changed and all(changed)
    saved = torch.load(sorted((tmp_path / "r" / "checkpoints").glob("*.pt"))[-1], weights_only=False)
    assert "redraw_seconds: 0.0" in saved["env_yaml"]


def test_low_grip_share_reaches_the_collection_env_only(teacher_path, tmp_path):
    run = distiller(teacher_path, tmp_path / "r", dagger=replace(DAGGER, rounds=1, low_grip_share=0.5))
    assert run.env.cfg.randomization.friction_low_share == 0.5
    assert (
        run.env_cfg.randomization.friction_low_share == 0.0 and run.eval_env.cfg.randomization.friction_low_share == 0
    )
    with pytest.raises(ConfigError, match="low_grip_share"):
        replace(DAGGER, low_grip_share=-0.1)
