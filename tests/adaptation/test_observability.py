"""Observability bound: windows stay inside episodes, the regressor finds a signal that is there and no other,
the blind driver sees the nominal factor, and the script runs end to end on a tiny teacher."""

import json

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from adaptation.observability import FEATURES, Recording, blind_factor, fit_r2, shard_recording, windows
from datasets.rollouts import ShardWriter, add_shard, rollout_schema
from envs.errors import ConfigError
from envs.racing.config import EnvConfig
from envs.racing.evaluation import EvalConfig
from envs.racing.randomization import FACTOR_NAMES, denormalize_factor
from envs.task import get_task
from envs.vehicle import VEHICLE_ESTIMATES
from experiments.research.observability import ObservabilityConfig, main
from teacher.config import PPOConfig, TeacherPolicyConfig
from teacher.trainer import TeacherTrainer, TrainerConfig


def recording() -> Recording:
    # env 0: an episode of 3 steps, then a new one; env 1: one episode throughout. Feature 0 names (env, step).
    t, f = 7, len(FEATURES)
    features = torch.zeros(2, t, f)
    features[..., 0] = 100 * torch.arange(2)[:, None] + torch.arange(t)[None, :]
    episode = torch.tensor([[0, 0, 0, 2, 2, 2, 2], [1, 1, 1, 1, 1, 1, 1]])
    since = torch.tensor([[1, 2, 3, 1, 2, 3, 4], [1, 2, 3, 4, 5, 6, 7]])
    target = torch.tensor([[0.7] * 3 + [1.1] * 4, [0.9] * 7])
    return Recording(features, target, since, episode, torch.zeros(2, t))


def test_windows_never_cross_an_episode_start_and_end_late_enough():
    x, y, env = windows(recording(), length=3, min_steps=2)
    got = {(int(v) // 100, int(v) % 100): float(target) for v, target in zip(x[:, -1, 0], y)}
    # env 0: the window ending at step 3 ends too soon after its reset, the one ending at step 4 (2 steps after it)
    # would reach back into the first episode.
    expected = {(0, 2): 0.7, (0, 5): 1.1, (0, 6): 1.1, **{(1, s): 0.9 for s in range(2, 7)}}
    assert got == pytest.approx(expected)
    assert torch.equal(env, torch.tensor([e for e, _ in got]))
    steps = x[..., 0] % 100
    assert torch.equal(steps[:, 1:] - steps[:, :-1], torch.ones(len(x), 2)), "consecutive steps of one env"
    with pytest.raises(ValueError, match="no window"):
        windows(recording(), length=3, min_steps=8)


def test_regressor_finds_a_real_signal_and_not_a_spurious_one():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4000, 5, 3, generator=gen)
    test = torch.arange(4000) % 5 == 0
    signal = x[:, :, 1].mean(1) * 0.3 + 1.0  # the factor is in the features
    noise = torch.rand(4000, generator=gen)  # the factor is not
    assert fit_r2(x, signal, test, iterations=400)["test_r2"] > 0.9
    r = fit_r2(x, noise, test, iterations=400)
    assert r["test_r2"] < 0.1
    assert r["train_r2"] > r["test_r2"], "what it fits on noise does not carry over to held-out windows"


def test_the_blind_driver_sees_the_nominal_factor_and_the_env_keeps_the_truth():
    factors = torch.rand(4, len(FACTOR_NAMES)) * 2 - 1
    obs = TensorDict({"env_factors": factors.clone()}, batch_size=[4])
    out = blind_factor(obs, "friction", get_task("racing"))
    col = FACTOR_NAMES.index("friction")
    assert torch.allclose(denormalize_factor("friction", out["env_factors"][:, col]), torch.ones(4))
    others = [i for i in range(len(FACTOR_NAMES)) if i != col]
    assert torch.equal(out["env_factors"][:, others], factors[:, others])
    assert torch.equal(obs["env_factors"], factors), "the env's observation is not modified"
    blinded = blind_factor(obs, "action_latency", get_task("racing"))
    latency = blinded["env_factors"][:, FACTOR_NAMES.index("action_latency")]
    assert torch.allclose(denormalize_factor("action_latency", latency), torch.full((4,), 1 / 30))


def test_the_latency_recording_holds_each_cars_true_action_latency_in_seconds():
    from adaptation.observability import record
    from envs.racing.env import RacingEnv

    env = RacingEnv(EnvConfig(num_envs=6, compile=False))

    class Still:
        def act(self, obs):
            return torch.zeros(obs.batch_size[0], 1)

    truth = env.world.action_latency.float() * env.cfg.dt_physics
    rec = record(Still(), env, "action_latency", steps=3)
    first = rec.episode[:, 2] == rec.episode[:, 0]  # cars still in their first episode
    assert first.any() and torch.allclose(rec.target[first, 0], truth[first])
    assert 0.0 <= float(rec.target.min()) and float(rec.target.max()) <= 0.1 + 1e-6  # the 0-100 ms range


def test_observability_script_on_a_tiny_teacher(tmp_path):
    env = EnvConfig(num_envs=4, compile=False)
    trainer = TeacherTrainer(env, TeacherPolicyConfig(hidden_dims=(16,), critic_hidden_dims=(16,)),
                             PPOConfig(num_steps_per_env=4), TrainerConfig(iterations=1),
                             EvalConfig(start_points=1, laps=1, max_seconds=2.0), tmp_path)  # fmt: skip
    teacher = trainer.save(tmp_path / "teacher.pt")
    cfg = ObservabilityConfig(teacher=str(teacher), envs=10, seconds=3.0, windows=(3, 5), min_seconds=0.5,
                              iterations=20, motion_r2=(0.9,), out_dir=str(tmp_path / "obs"))  # fmt: skip
    result = main(cfg)
    saved = json.loads((tmp_path / "obs" / "observability.json").read_text())
    assert [row["steps"] for row in saved["history"]] == [3, 5]
    assert all(row["windows"] == r["windows"] > 0 for row, r in zip(saved["history"], result["history"]))
    noisy = "commands+body_velocities (estimates at R² 0.9)"
    assert saved["feature_sets"][-1] == noisy
    assert all(set(row) >= {"commands", "full_state", "seconds", noisy} for row in saved["history"])
    assert all(row[noisy]["motion_r2"] == 0.9 for row in saved["history"])
    assert "grip_use_percentiles" in saved
    with pytest.raises(ConfigError, match="windows is empty"):
        ObservabilityConfig(windows=())
    with pytest.raises(ConfigError, match="factor='mass'"):
        ObservabilityConfig(factor="mass")
    with pytest.raises(ConfigError, match="motion_r2=1.2"):
        ObservabilityConfig(motion_r2=(1.2,))
    with pytest.raises(ConfigError, match="--teacher"):
        main(ObservabilityConfig())


def test_a_runs_shards_become_one_padded_row_per_episode(tmp_path):
    schema = rollout_schema(
        num_outputs=3, latent_dim=2, num_factors=2, num_targets=7, privileged_dim=6, image_hw=(4, 5)
    )
    writer = ShardWriter(tmp_path / "round_000.h5", schema)
    for ep, length, friction in ((5, 4, 0.8), (9, 2, 1.1)):
        rows = {k: np.zeros((length, *f.shape), dtype=f.dtype) for k, f in schema.items()}
        rows["episode"][:], rows["step"][:] = ep, np.arange(length)
        rows["prev_action"][:, 0] = -0.5
        rows["prev_action"][:, 1] = np.arange(length) / 10
        cols = {"friction": friction, "speed": 2.0, "lateral_speed": 0.1, "yaw_rate": np.arange(length)}
        for name, value in cols.items():
            rows["targets"][:, VEHICLE_ESTIMATES.column(name)] = value
        writer.append(rows)
    writer.close()
    add_shard(tmp_path, tmp_path / "round_000.h5", {"rows": 6})
    rec = shard_recording(tmp_path, "friction")
    assert rec.features.shape == (2, 4, len(FEATURES))
    assert rec.since_reset.tolist() == [[0, 1, 2, 3], [0, 1, -1, -1]], "the shorter episode is padded"
    assert torch.allclose(rec.target[0], torch.full((4,), 0.8)) and torch.allclose(rec.target[1, :2], torch.tensor(1.1))
    col = {name: FEATURES.index(name) for name in FEATURES}
    assert rec.features[0, :, col["speed_cmd"]].tolist() == pytest.approx([0.0, 0.1, 0.2, 0.3])
    assert rec.features[0, :, col["lateral_accel"]].tolist() == pytest.approx([0.0, 2.0, 4.0, 6.0])  # speed * yaw
    assert torch.isnan(rec.features[..., col["steer"]]).all(), "the shards hold no steering angle"
    # grip use = |lateral accel| / (friction g); windows never reach into the padding
    assert rec.grip_use[0, 3].item() == pytest.approx(6.0 / (0.8 * 9.81))
    x, y, env = windows(rec, length=2, min_steps=1)
    assert len(y) == 4 and env.tolist() == [0, 1, 0, 0]
    with pytest.raises(ValueError, match="factor='mass'"):
        shard_recording(tmp_path, "mass")


def test_observability_from_a_runs_shards_needs_one_source(tmp_path):
    with pytest.raises(ConfigError, match="either --teacher .* or --run-dir"):
        main(ObservabilityConfig(teacher="a.pt", run_dir="b"))
    with pytest.raises(ConfigError, match="not a DAgger run directory"):
        main(ObservabilityConfig(run_dir=str(tmp_path)))


def test_estimate_noise_gives_each_motion_column_the_asked_r2_and_leaves_the_rest():
    from adaptation.losses import r2_score
    from adaptation.observability import estimate_noise

    x = torch.randn(20000, 4, 5, generator=torch.Generator().manual_seed(0)) * torch.tensor([1.0, 2.0, 3.0, 0.5, 7.0])
    noisy = estimate_noise(x, [2, 3, 4], 0.9, torch.Generator().manual_seed(1))
    for c in (2, 3, 4):  # SSE / SST = 1 - 0.9 whatever the column's scale
        assert r2_score(noisy[..., c], x[..., c]) == pytest.approx(0.9, abs=0.005)
    assert torch.equal(noisy[..., :2], x[..., :2]), "the commands stay exact"
    again = estimate_noise(x, [2, 3, 4], 0.9, torch.Generator().manual_seed(1))
    assert torch.equal(noisy, again), "deterministic under a seed"
    assert torch.equal(estimate_noise(x, [2], 1.0, torch.Generator()), x)
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="must be in"):
            estimate_noise(x, [2], bad, torch.Generator())


def test_ridge_probe_reads_a_linear_signal_and_not_noise():
    from adaptation.probe import ridge_r2

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3000, 8, generator=gen)
    test = torch.arange(3000) % 5 == 0
    y = 2.0 * x[:, 3] - x[:, 5] + 7.0
    assert ridge_r2(x, y, test, ridge=0.0) == pytest.approx(1.0, abs=1e-9)
    assert ridge_r2(x, y, test, ridge=1e-2) > 0.99  # a small penalty barely shrinks it; the intercept is free
    assert ridge_r2(x, torch.randn(3000, generator=gen), test) < 0.02
    with pytest.raises(ValueError, match="held-out rows"):
        ridge_r2(x, y, torch.zeros(3000, dtype=torch.bool))
