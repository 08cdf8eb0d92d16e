import warnings
from dataclasses import replace

import pytest
import torch

from envs.camera_model import CameraConfig
from envs.errors import ConfigError
from envs.genesis_import import GenesisConfig
from envs.racing.config import EnvConfig
from envs.racing.env import RacingEnv
from envs.racing.evaluation import (
    EpisodeRecord,
    EvalConfig,
    completion_by_factor,
    evaluate,
    evaluation_env_config,
    failures_by_section,
    run_episodes,
)
from envs.racing.observations import teacher_dim
from envs.racing.pure_pursuit import PurePursuitDriver
from envs.racing.randomization import FACTOR_NAMES, RandomizationConfig
from envs.racing.rewards import TerminationConfig
from experiments.evaluate import failure_line
from tests.helpers import NO_RANDOMIZATION, small_env_config


def random_actions(env, steps, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randint(0, env.action_space.num_choices, (env.num_envs, 1), generator=gen).float() for _ in range(steps)
    ]


def test_vec_env_contract_and_observation_groups():
    env = RacingEnv(small_env_config(num_envs=3, camera="projective"))
    obs = env.get_observations()
    assert env.num_actions == 1 and env.max_episode_length == 300
    assert obs["teacher"].shape == (3, teacher_dim(env.cfg.obs.lookahead_points))
    assert obs["env_factors"].shape == (3, len(FACTOR_NAMES))
    assert obs["camera"].shape == (3, 1, 120, 160) and obs["camera"].dtype == torch.uint8
    assert obs["proprio"].shape == (3, 2)
    obs, rew, dones, extras = env.step(torch.zeros(3, 1))
    assert rew.shape == (3,) and dones.shape == (3,) and extras["time_outs"].shape == (3,)
    state_only = RacingEnv(small_env_config(num_envs=2))
    assert "camera" not in state_only.get_observations().keys()
    imu = RacingEnv(small_env_config(num_envs=2, obs=replace(EnvConfig().obs, proprio_imu=True)))
    assert imu.get_observations()["proprio"].shape == (2, 5)


def test_env_factors_are_normalized_and_vary():
    env = RacingEnv(EnvConfig(num_envs=256, compile=False))
    f = env.get_observations()["env_factors"]
    assert f.min() >= -1.0 and f.max() <= 1.0
    assert (f.std(dim=0)[:8] > 0.01).all()  # every randomized factor varies; battery is constant in training
    # The nominal world, by hand: friction 1.0 in (0.3, 1.5) -> 2 * 0.7 / 1.2 - 1; unit gains and scales in
    # (0.5, 1.5) -> 0; no steering offset -> 0; no action noise -> -1; a full battery -> +1.
    nominal = RacingEnv(small_env_config(num_envs=2)).get_observations()["env_factors"][0]
    by_name = dict(zip(FACTOR_NAMES, nominal.tolist(), strict=True))
    expected = {"friction": 2 * 0.7 / 1.2 - 1, "mass_scale": 0.0, "motor_gain": 0.0, "steering_gain": 0.0,
                "steering_offset": 0.0, "action_noise": -1.0, "battery": 1.0}  # fmt: skip
    assert {k: by_name[k] for k in expected} == pytest.approx(expected, abs=1e-6)


def test_masked_reset_leaves_other_envs_untouched():
    env = RacingEnv(EnvConfig(num_envs=6, compile=False, camera="projective"))
    for a in random_actions(env, 10):
        env.step(a)
    before = {k: v.clone() for k, v in env.get_observations().items()}
    state = env.physics.state.clone()
    friction = env.world.params.friction.clone()
    ids = torch.tensor([1, 4])
    env._reset_idx(ids)
    obs = env._observe()
    keep = torch.tensor([0, 2, 3, 5])
    for key in before.keys():
        assert torch.equal(obs[key][keep], before[key][keep]), key
    assert torch.equal(env.physics.state.x[keep], state.x[keep])
    assert torch.equal(env.world.params.friction[keep], friction[keep])
    assert (env.episode_length_buf[ids] == 0).all() and (env.episode_length_buf[keep] == 10).all()


def test_same_seed_same_rollout_and_other_seed_differs():
    def rollout(seed):
        env = RacingEnv(EnvConfig(num_envs=8, seed=seed, compile=False, camera="projective"))
        out = []
        for a in random_actions(env, 40):
            obs, rew, dones, _ = env.step(a)
            out.append((obs["teacher"].clone(), obs["camera"].clone(), rew.clone(), dones.clone()))
        return out

    a, b, c = rollout(3), rollout(3), rollout(4)
    for x, y in zip(a, b):
        for u, v in zip(x, y):
            assert torch.equal(u, v)
    assert not torch.equal(a[-1][0], c[-1][0])


def test_time_limit_truncates_and_auto_resets():
    env = RacingEnv(small_env_config(num_envs=2, termination=TerminationConfig(episode_seconds=1.0, stuck_seconds=5.0)))
    for _ in range(15):
        obs, _, dones, extras = env.step(torch.full((2, 1), 4.0))  # straight ahead, slow
    assert dones.all() and extras["time_outs"].all() and not extras["terminated"].any()
    assert (env.episode_length_buf == 0).all()
    assert "Episode/progress" in extras["log"]


def test_offtrack_terminates_with_penalty():
    env = RacingEnv(small_env_config(num_envs=1))
    for _ in range(60):
        _, rew, dones, extras = env.step(torch.tensor([[9.0]]))  # full left at speed: leaves the track
        if dones.any():
            break
    assert extras["offtrack"].item() and extras["terminated"].item() and not extras["time_outs"].item()
    assert rew.item() == env.cfg.reward.offtrack
    assert extras["log"]["Episode/offtrack_rate"].item() == 1.0


def test_stuck_car_is_terminated():
    # Steering hard at the slowest speed on the oval does not leave the track quickly; a zero-speed table does.
    env = RacingEnv(small_env_config(num_envs=1, action_space="console-default"))
    env.world.params.motor_gain[:] = 0.0
    env.physics.set_params(env.world.params, torch.tensor([0]))
    for t in range(60):  # noqa: B007 (t is checked after the loop)
        _, _, dones, extras = env.step(torch.tensor([[4.0]]))
        if dones.any():
            break
    assert extras["terminated"].item() and not extras["offtrack"].item()
    assert t + 1 == 30  # stuck_seconds (2 s) at 15 Hz


def test_directions_alternate_every_episode():
    rnd = replace(NO_RANDOMIZATION, direction="alternate")
    env = RacingEnv(small_env_config(num_envs=2, randomization=rnd))
    first = env.direction.clone()
    assert first.tolist() == [1.0, -1.0]
    env._reset_idx(torch.tensor([0, 1]))
    assert env.direction.tolist() == [-1.0, 1.0]


@pytest.mark.parametrize("track", ["oval", "reinvent2018", "technical"])
def test_pure_pursuit_completes_laps_both_directions_under_randomization(track):
    cfg = EnvConfig(track=track, compile=False)
    env = RacingEnv(replace(cfg, num_envs=1))
    driver = PurePursuitDriver(env.action_space, cfg.car, cfg.obs.lookahead_points, cfg.obs.lookahead_spacing)
    metrics, records, eval_env = evaluate(driver.act, cfg, EvalConfig(start_points=2, laps=1, max_seconds=25.0))
    assert metrics["forward/lap_completion"] == 1.0 and metrics["reverse/lap_completion"] == 1.0
    assert 1.0 < metrics["lap_time_ratio"] < 1.8
    assert all(r.path.shape[1] == 2 and len(r.path) > 10 for r in records)


def test_episode_records_carry_their_world():
    """Each record carries its episode's world in physical units, as the env drew it at the episode's start."""
    cfg = EnvConfig(track="oval", compile=False)
    plan = EvalConfig(start_points=2, laps=1, max_seconds=3.0)
    env = RacingEnv(evaluation_env_config(cfg, plan))
    driver = PurePursuitDriver(env.action_space, cfg.car, cfg.obs.lookahead_points, cfg.obs.lookahead_spacing)
    drawn = {}

    def act(obs):
        if not drawn:  # first step: the worlds of this plan's episodes
            drawn["friction"] = env.world.params.friction.tolist()
            drawn["latency"] = (env.world.action_latency.float() * cfg.dt_physics).tolist()
        return driver.act(obs)

    records = run_episodes(act, env, plan)
    assert sorted(records[0].factors) == sorted([*FACTOR_NAMES, "max_speed_percent"])
    assert [r.factors["friction"] for r in records] == pytest.approx(drawn["friction"], abs=1e-5)
    assert [r.factors["action_latency"] for r in records] == pytest.approx(drawn["latency"], abs=1e-6)
    assert len(set(drawn["friction"])) == len(records)  # randomized: every episode its own world


def test_episodes_end_where_the_record_says():
    """`end_position` (start +/- progress along the direction of travel) is where the car is when the episode ends."""
    cfg = EnvConfig(track="oval", compile=False)
    plan = EvalConfig(start_points=2, laps=1, max_seconds=1.5)  # every episode stops early: none succeeds
    env = RacingEnv(evaluation_env_config(cfg, plan))
    driver = PurePursuitDriver(env.action_space, cfg.car, cfg.obs.lookahead_points, cfg.obs.lookahead_spacing)
    records = run_episodes(driver.act, env, plan)
    length = env.track.length
    for r in records:
        assert not r.success and 0.05 < r.progress < 0.5
        xy, _, _ = env.track.interpolate(torch.tensor(r.end_position * length))
        wrong = (r.start - (1.0 if r.direction == "forward" else -1.0) * r.progress) % 1.0
        xy_wrong, _, _ = env.track.interpolate(torch.tensor(wrong * length))
        last = torch.from_numpy(r.path[-1]).float()  # the state before the last step: within a step of the end
        assert float((xy - last).norm()) < 0.4 < float((xy_wrong - last).norm()), r.direction
    by = failures_by_section(records, sections=4)
    assert sorted(by) == ["forward", "reverse"] and sum(map(sum, by.values())) == len(records)


def test_failures_by_section_hand_example():
    def rec(start, direction, success, progress):
        return EpisodeRecord(start, direction, success, 1.0, float("nan"), progress, not success, 1.0, None)

    records = [rec(0.0, "forward", False, 0.35), rec(0.5, "forward", False, 0.87), rec(0.5, "forward", True, 1.0),
               rec(0.5, "reverse", False, 0.15), rec(0.0, "reverse", False, 0.25)]  # fmt: skip
    # forward ends at 0.35 and 0.37 (section 3 of 10); reverse at 0.35 (section 3) and 0.75 (section 7)
    assert [r.end_position for r in records] == pytest.approx([0.35, 0.37, 0.5, 0.35, 0.75])
    out = failures_by_section(records)
    assert out["forward"] == [0, 0, 0, 2, 0, 0, 0, 0, 0, 0]
    assert out["reverse"] == [0, 0, 0, 1, 0, 0, 0, 1, 0, 0]
    assert failure_line(out) == "0.3–0.4: 2 fwd / 1 rev, 0.7–0.8: 0 fwd / 1 rev"
    assert failure_line(failures_by_section([rec(0.0, "forward", True, 1.0)])) == ""


def test_completion_by_factor_hand_example():
    def rec(success, friction, gain):
        return EpisodeRecord(0.0, "forward", success, 1.0, float("nan"), 1.0, not success, 1.0, None,
                             {"friction": friction, "motor_gain": gain, "battery": 1.0})  # fmt: skip

    # The two lowest-friction worlds fail; the battery never varies (left out).
    records = [rec(False, 0.6, 1.0), rec(False, 0.7, 1.1), rec(True, 0.8, 0.9),
               rec(True, 0.9, 1.0), rec(True, 1.0, 1.1), rec(True, 1.1, 0.9)]  # fmt: skip
    out = completion_by_factor(records, bins=3)
    assert set(out) == {"friction", "motor_gain"}
    assert [r["lap_completion"] for r in out["friction"]] == [0.0, 1.0, 1.0]
    assert [(r["lo"], r["hi"]) for r in out["friction"]] == [(0.6, 0.7), (0.8, 0.9), (1.0, 1.1)]
    # motor gain 0.9 x2 (both succeed), 1.0 x2 (one fails), 1.1 x2 (one fails)
    assert [r["lap_completion"] for r in out["motor_gain"]] == [1.0, 0.5, 0.5]
    assert [r["episodes"] for r in out["motor_gain"]] == [2.0, 2.0, 2.0]
    assert out["friction"][0]["ci_low"] == 0.0 and 0.0 < out["friction"][0]["ci_high"] < 1.0
    assert completion_by_factor([]) == {}


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: EnvConfig(num_envs=0), "env.num_envs"),
        (lambda: RandomizationConfig(friction_range=(1.2, 0.7)), "randomization.friction_range"),
        (lambda: RandomizationConfig(action_noise_max=0.9), "randomization.action_noise_max"),
        (lambda: EnvConfig(start_points=(1.5,)), "env.start_points"),
        (lambda: TerminationConfig(episode_seconds=-1.0), "termination.episode_seconds"),
        (lambda: EnvConfig(physics="genesis", substeps=2), "env.physics=genesis"),
        (lambda: EnvConfig(camera="genesis", optics=CameraConfig(lens="fisheye", hfov_deg=160.0)), "optics.hfov_deg"),
        (lambda: EnvConfig(genesis=GenesisConfig(performance_mode=True)), "env.genesis"),
        (lambda: GenesisConfig(msaa_samples=3), "genesis.msaa_samples"),
    ],
)
def test_out_of_range_config_names_the_field(make, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        make()


def test_unknown_track_and_mid_episode_shift():
    with pytest.raises(ConfigError, match="unknown track"):
        RacingEnv(small_env_config(track="monaco"))
    env = RacingEnv(small_env_config(num_envs=3))
    env.shift_world(torch.tensor([1]), friction=0.4, action_latency=3)
    assert env.world.params.friction.tolist() == pytest.approx([1.0, 0.4, 1.0])
    assert env.physics.params.friction.tolist() == pytest.approx([1.0, 0.4, 1.0])
    assert env.world.action_latency.tolist()[1] == 3
    with pytest.raises(ConfigError, match="unknown factor"):
        env.shift_world(torch.tensor([0]), grip=1.0)


def test_redraw_changes_the_dynamics_every_period_and_nothing_else():
    rnd = RandomizationConfig(friction_range=(0.5, 1.2), action_latency_ms=(0.0, 100.0), visual=False)
    env = RacingEnv(small_env_config(num_envs=4, randomization=replace(rnd, redraw_seconds=1.0)))  # every 15 steps
    driver = PurePursuitDriver(
        env.action_space, env.cfg.car, env.cfg.obs.lookahead_points, env.cfg.obs.lookahead_spacing
    )

    def hold(e=env):  # drive on: no episode ends in 30 steps
        return driver.act(e.get_observations())

    factors0, visuals0, direction0 = (
        env.world.params.friction.clone(),
        env.visuals.asphalt.clone(),
        env.direction.clone(),
    )
    for _ in range(14):
        env.step(hold())
    assert torch.equal(env.world.params.friction, factors0), "no redraw before the period"
    obs, _, dones, _ = env.step(hold())  # step 15
    assert not dones.any() and env.episode_length_buf.tolist() == [15] * 4
    friction = env.world.params.friction
    assert (friction != factors0).all() and ((friction >= 0.5) & (friction <= 1.2)).all()
    assert torch.equal(env.physics.params.friction, friction), "the physics runs with the new draw"
    assert torch.equal(obs["env_factors"], RacingEnv.__dict__["_observe"](env)["env_factors"])
    assert torch.equal(env.visuals.asphalt, visuals0) and torch.equal(env.direction, direction0)
    latency_before = env.world.action_latency.clone()
    for _ in range(15):
        env.step(hold())
    assert not torch.equal(env.world.action_latency, latency_before) or env.world.action_latency.max() == 0
    steady = RacingEnv(small_env_config(num_envs=4, randomization=rnd))
    start = steady.world.params.friction.clone()
    for _ in range(30):
        steady.step(hold(steady))
    assert torch.equal(steady.world.params.friction, start), "redraw_seconds 0: one world per episode"
    with pytest.raises(ConfigError, match="redraw_seconds"):
        RandomizationConfig(redraw_seconds=-1.0)


def test_low_grip_share_draws_from_the_lowest_third_and_leaves_the_other_factors():
    from envs.racing.randomization import sample_world

    def draw(share: float):
        cfg = RandomizationConfig(friction_range=(0.6, 1.2), friction_low_share=share)
        return sample_world(cfg, 20_000, 1 / 60, torch.Generator().manual_seed(3), torch.device("cpu"))

    base, half, only_low = draw(0.0), draw(0.5), draw(1.0)
    low_third = lambda w: float((w.params.friction <= 0.8).float().mean())  # noqa: E731
    assert low_third(base) == pytest.approx(1 / 3, abs=0.015)
    assert low_third(half) == pytest.approx(0.5 + 0.5 / 3, abs=0.015), "half the draws, plus the uniform half's third"
    assert low_third(only_low) == 1.0 and float(only_low.params.friction.min()) >= 0.6
    for name in ("mass_scale", "motor_gain", "steering_gain", "steering_offset"):
        assert torch.equal(getattr(half.params, name), getattr(base.params, name)), name
    assert torch.equal(half.action_latency, base.action_latency) and torch.equal(half.action_noise, base.action_noise)
    kept = half.params.friction > 0.8
    assert torch.equal(half.params.friction[kept], base.params.friction[kept]), "a draw it does not replace is kept"
    with pytest.raises(ConfigError, match="friction_low_share"):
        RandomizationConfig(friction_low_share=1.5)


def test_compiled_env_matches_eager_closely():
    eager = RacingEnv(EnvConfig(num_envs=16, compile=False))
    comp = RacingEnv(EnvConfig(num_envs=16, compile=True))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for a in random_actions(eager, 20):
            o1, r1, d1, _ = eager.step(a)
            o2, r2, d2, _ = comp.step(a)
            assert torch.equal(d1, d2)
            assert torch.allclose(r1, r2, atol=1e-4)
            assert torch.allclose(o1["teacher"], o2["teacher"], atol=1e-3)
    if any("torch.compile unavailable" in str(w.message) for w in caught):
        pytest.skip("torch.compile cannot build here: the compiled env fell back to eager, nothing was compared")


def test_state_dict_round_trip_continues_bit_exactly_and_refuses_a_foreign_state():
    """The env's own state_dict: a second env loaded from it takes the same steps; a state missing an entry or
    holding one of another shape is refused by name before anything changes."""
    cfg = EnvConfig(num_envs=6, compile=False)
    a = RacingEnv(cfg)
    actions = torch.randint(0, a.action_space.num_outputs, (20, 6, 1)).float()
    for t in range(10):
        a.step(actions[t])
    saved = a.state_dict()
    b = RacingEnv(replace(cfg, seed=99))
    b.load_state_dict(saved)
    for t in range(10, 20):
        oa, ra, da, _ = a.step(actions[t])
        ob, rb, db, _ = b.step(actions[t])
        assert torch.equal(ra, rb) and torch.equal(da, db) and torch.equal(oa["teacher"], ob["teacher"])
    with pytest.raises(ConfigError, match=r"env state is missing \['buf.travel'\]"):
        b.load_state_dict({k: v for k, v in saved.items() if k != "buf.travel"})
    bad = dict(saved, **{"buf.travel": torch.zeros(3)})
    with pytest.raises(ConfigError, match=r"env state 'buf.travel' has shape"):
        b.load_state_dict(bad)
