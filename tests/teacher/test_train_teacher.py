"""Teacher training: smoke run, exact resume, evaluation determinism, checkpoint refusal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from datasets.checkpoints import CheckpointError, save_atomic
from envs.errors import ConfigError
from envs.racing.config import EnvConfig
from envs.racing.env import RacingEnv
from envs.racing.evaluation import EvalConfig, evaluate
from teacher.config import PPOConfig, TeacherPolicyConfig
from teacher.policy import load_teacher
from teacher.trainer import TeacherTrainer, TrainerConfig, TrainingDiverged

ROOT = Path(__file__).resolve().parents[2]
ENV = EnvConfig(num_envs=16, compile=False)
PPO = PPOConfig(num_steps_per_env=8, num_mini_batches=2, num_learning_epochs=2)
POLICY = TeacherPolicyConfig(hidden_dims=(32, 32), critic_hidden_dims=(32, 32))
EVAL = EvalConfig(start_points=1, laps=1, max_seconds=3.0)


def trainer(tmp_path, iterations, **kw) -> TeacherTrainer:
    cfg = TrainerConfig(iterations=iterations, eval_every=2, save_every=2, seed=5)
    return TeacherTrainer(kw.get("env", ENV), POLICY, PPO, cfg, EVAL, tmp_path)


def collect(t: TeacherTrainer) -> list[dict]:
    seen: list[dict] = []
    t.log = lambda metrics, step: seen.append({k: v for k, v in metrics.items() if not k.startswith("perf/")})
    return seen


def test_resume_reproduces_the_uninterrupted_run_exactly(tmp_path):
    full = trainer(tmp_path / "full", 6)
    full_log = collect(full)
    full.train(show_progress=False)

    part = trainer(tmp_path / "part", 4)
    collect(part)
    part.train(show_progress=False)  # "interrupted" after iteration 4 (its last checkpoint)
    resumed = trainer(tmp_path / "resumed", 6)
    resumed.resume(tmp_path / "part" / "checkpoints" / "iter_000004.pt")
    resumed_log = collect(resumed)
    resumed.train(show_progress=False)
    assert [m["train/iteration"] for m in resumed_log] == [5.0, 6.0]
    assert json.dumps(resumed_log) == json.dumps(full_log[4:])  # bit-exact, NaN (no lap yet) included
    a = full.alg.get_policy().state_dict()
    b = resumed.alg.get_policy().state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_checkpoint_loads_in_one_call_and_exposes_z(tmp_path):
    t = trainer(tmp_path, 2)
    t.train(show_progress=False)
    teacher = load_teacher(tmp_path / "checkpoints" / "iter_000002.pt")
    env = RacingEnv(replace(ENV, num_envs=3))
    obs = env.get_observations()
    assert teacher.act(obs).shape == (3, 1)
    z = teacher.z(obs)
    assert z.shape == (3, POLICY.latent_dim) and z.abs().max() < 1
    assert teacher.logits(obs).shape == (3, env.action_space.num_choices)
    teacher.check_env(env)
    # Same weights as the trainer's actor in eval mode.
    t.alg.eval_mode()
    actor = t.alg.get_policy()
    assert torch.equal(actor(obs), teacher.act(obs))
    with torch.no_grad():
        assert torch.equal(actor.encode(obs), z)
        assert torch.equal(actor.mlp(actor.get_latent(obs)), teacher.logits(obs))


def test_evaluation_is_deterministic_under_a_fixed_seed(tmp_path):
    t = trainer(tmp_path, 1)
    policy = t.policy_fn()
    t.alg.eval_mode()
    cfg = EvalConfig(start_points=2, laps=1, max_seconds=4.0, seed=9)
    m1, r1, env = evaluate(policy, ENV, cfg)
    m2, r2, _ = evaluate(policy, ENV, cfg, env=env)  # the same env object again: re-seeded per evaluation
    assert json.dumps(m1, sort_keys=True) == json.dumps(m2, sort_keys=True)
    assert len(r1) == len(r2) == 4 and all((a.path == b.path).all() for a, b in zip(r1, r2))


def test_wrong_checkpoints_are_refused(tmp_path):
    t = trainer(tmp_path, 1)
    path = t.save(tmp_path / "ok.pt")
    other_space = RacingEnv(replace(ENV, num_envs=2, action_space="fast-throttle"))
    with pytest.raises(CheckpointError, match="action space mismatch"):
        load_teacher(path).check_env(other_space)
    other_obs = RacingEnv(replace(ENV, num_envs=2, obs=replace(ENV.obs, lookahead_points=5)))
    with pytest.raises(CheckpointError, match="observation layout mismatch.*teacher"):
        load_teacher(path).check_env(other_obs)
    data = torch.load(path, weights_only=True)
    del data["actor"]
    save_atomic(data, tmp_path / "missing.pt")
    with pytest.raises(CheckpointError, match=r"missing keys \['actor'\]"):
        load_teacher(tmp_path / "missing.pt")
    (tmp_path / "corrupt.pt").write_bytes(path.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        load_teacher(tmp_path / "corrupt.pt")
    other = TeacherTrainer(
        replace(ENV, seed=1), POLICY, replace(PPO, gamma=0.9), TrainerConfig(iterations=1), EVAL, tmp_path / "o"
    )
    with pytest.raises(CheckpointError, match="ppo configuration differs"):
        other.resume(path)


def test_nan_in_observations_stops_with_the_group_named_and_a_checkpoint(tmp_path, monkeypatch):
    t = trainer(tmp_path, 3)
    original = t.env.step

    def poisoned(actions):
        obs, rew, dones, extras = original(actions)
        if t.iteration == 1:
            obs["env_factors"][2, 0] = float("nan")
        return obs, rew, dones, extras

    monkeypatch.setattr(t.env, "step", poisoned)
    with pytest.raises(TrainingDiverged, match="'env_factors' at iteration 1, rollout step 0, env 2"):
        t.train(show_progress=False)
    assert (tmp_path / "checkpoints" / "diverged.pt").is_file()


def test_train_teacher_smoke_subprocess(tmp_path):
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.train_teacher", "smoke", "--run-dir", str(tmp_path / "run")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(list((tmp_path / "run" / "checkpoints").glob("iter_*.pt"))) == 3
    summary = json.loads((tmp_path / "run" / "eval.json").read_text())
    assert summary["iterations"] == 3
    # The run's teacher: the selected checkpoint, copied beside the checkpoints.
    selected = torch.load(tmp_path / "run" / "teacher.pt", weights_only=False)
    assert summary["checkpoint"].endswith("teacher.pt") and selected["iteration"] == summary["selected"]["iteration"]
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.evaluate", "smoke", "--checkpoint",
         str(tmp_path / "run" / "checkpoints" / "iter_000003.pt"), "--out-dir", str(tmp_path / "ev")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    entry = json.loads((tmp_path / "ev" / "eval.json").read_text())["tracks"]["reinvent2018"]
    assert "lap_completion" in entry["metrics"]
    # The randomized worlds' breakdown: every varying factor in thirds, printed as a table.
    assert {"friction", "motor_gain", "action_latency"} <= set(entry["by_factor"])
    assert sum(r["episodes"] for r in entry["by_factor"]["friction"]) == len(entry["episodes"])
    assert "lap completion by world factor" in proc.stdout
    # Each episode keeps its world and where it ended; the failures by section count the failed ones.
    first = entry["episodes"][0]
    assert set(first["factors"]) >= {"friction", "motor_gain"} and 0.0 <= first["end_position"] < 1.0
    failed = sum(not e["success"] for e in entry["episodes"])
    assert sum(map(sum, entry["failures_by_section"].values())) == failed
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.evaluate", "smoke", "--checkpoint", str(tmp_path / "nope.pt")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 2 and "checkpoint not found" in proc.stderr


def test_hidden_factors_do_not_reach_the_actor(tmp_path):
    """A teacher blind to friction and motor gain acts and encodes z the same whatever their values, after a save
    and load; a factor it sees still changes its output; the critic still reads every factor."""
    policy = replace(POLICY, hidden_factors=("friction", "motor_gain"))
    t = TeacherTrainer(
        ENV, policy, PPO, TrainerConfig(iterations=2, eval_every=2, save_every=2, seed=5), EVAL, tmp_path
    )
    t.train(show_progress=False)
    teacher = load_teacher(tmp_path / "checkpoints" / "iter_000002.pt")
    obs = RacingEnv(replace(ENV, num_envs=4)).get_observations()
    names = teacher.layout.factor_names

    def with_factor(name: str, value: float):
        changed = obs.clone()
        changed["env_factors"][:, names.index(name)] = value
        return changed

    for name in ("friction", "motor_gain"):
        for value in (-1.0, 1.0):
            assert torch.equal(teacher.logits(with_factor(name, value)), teacher.logits(obs))
            assert torch.equal(teacher.z(with_factor(name, value)), teacher.z(obs))
    assert not torch.equal(
        teacher.z(with_factor("action_latency", 1.0)), teacher.z(with_factor("action_latency", -1.0))
    )
    critic = t.alg.critic
    with torch.no_grad():
        assert not torch.equal(critic(with_factor("friction", 1.0)), critic(with_factor("friction", -1.0)))


def test_unknown_hidden_factor_is_refused():
    """The task's factor names decide: refused when the trainer is built and when the script's config is."""
    from envs.task import get_task
    from experiments.train_teacher import TrainTeacherConfig

    with pytest.raises(ConfigError, match="hidden_factors.*grip"):
        TeacherPolicyConfig(hidden_factors=("grip",)).check_factors(get_task("racing").factor_names)
    with pytest.raises(ConfigError, match="hidden_factors.*grip"):
        TrainTeacherConfig(policy=TeacherPolicyConfig(hidden_factors=("grip",)))


def test_ablation_races_every_variant_in_the_proxy_at_one_top_speed(tmp_path, monkeypatch):
    """`--proxy-top-speed 2.1` races a policy of the default action space (top speed 2.8 m/s) at 75% in the proxy;
    the proxy row records the setting and is read back only for the same setting."""
    import experiments.ablate
    from experiments.ablate import PROXY_KEYS, AblateConfig, proxy_row

    trainer(tmp_path / "base", 2).train(show_progress=False)
    seen = []

    class Closed:
        def close(self):
            pass

    def fake_evaluate_one(policy, env_cfg, eval_cfg):
        seen.append(env_cfg.max_speed_percent)
        return {k: 0.5 for k in PROXY_KEYS}, [], Closed()

    monkeypatch.setattr(experiments.ablate, "evaluate_one", fake_evaluate_one)
    cfg = AblateConfig(stage="teacher", proxy=True, proxy_top_speed=2.1)
    row = proxy_row(cfg, tmp_path / "base")
    assert seen == [pytest.approx(75.0)] and row["proxy/max_speed_percent"] == pytest.approx(75.0)
    assert proxy_row(cfg, tmp_path / "base") == row and len(seen) == 1, "the same setting is read back"
    own = proxy_row(replace(cfg, proxy_top_speed=0.0), tmp_path / "base")
    assert seen[-1] == 100.0 and "proxy/max_speed_percent" not in own
    with pytest.raises(ConfigError, match="proxy_top_speed"):
        AblateConfig(proxy_top_speed=-1.0)


def test_the_selected_checkpoint_is_the_best_evaluated_latest_of_equals(tmp_path):
    """The run's teacher is the checkpoint whose periodic evaluation scored best on lap completion, then progress; of
    equals the later one; an evaluation without a checkpoint on disk is never chosen."""
    cfg = TrainerConfig(iterations=4, eval_every=1, save_every=1, seed=5)
    t = TeacherTrainer(ENV, POLICY, PPO, cfg, EVAL, tmp_path)
    t.train(show_progress=False)
    scores = {1: (1.0, 0.9), 2: (1.0, 0.95), 3: (1.0, 0.95), 4: (0.7, 1.0)}
    t.history = [{"iteration": i, "lap_completion": a, "progress": b} for i, (a, b) in scores.items()]
    path, best = t.selected_checkpoint()
    assert path.name == "iter_000003.pt" and best["iteration"] == 3
    path.unlink()
    assert t.selected_checkpoint()[0].name == "iter_000002.pt"
    t.history[1]["lap_completion"] = float("nan")  # an evaluation that could not be scored ranks last
    assert t.selected_checkpoint()[0].name == "iter_000001.pt"
