"""The bar-lift task: the success test on scripted counter-examples and the reward's minimum over the arms (pure
tensors), config refusals by field name, then one Genesis env (4 envs) for masked resets and the scripted expert, and
the teacher's smoke run in a subprocess."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from envs.bimanual.config import BimanualConfig, ObservationConfig, RandomizationConfig
from envs.bimanual.success import (
    LiftWindow,
    bar_tilt,
    grip_reward,
    lift_reward,
    lift_success_over,
    reach_reward,
    update_streak,
)
from envs.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
WINDOW = LiftWindow()
T = 40


def trajectory(height: float | list[float], grip: tuple[bool, bool] = (True, True), tilt_deg: float = 0.0,
               other: bool = False) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """One env's `(T, 1)` trajectory: bar height (constant or per step), per-gripper both-finger grip, tilt, other
    contact."""
    h = torch.tensor(height if isinstance(height, list) else [height] * T, dtype=torch.float32)[:, None]
    fingers = torch.tensor(grip)[None, None, :, None].expand(len(h), 1, 2, 2)
    tilt = torch.full_like(h, math.radians(tilt_deg))
    return h, tilt, fingers, torch.full(h.shape, other)


def succeeds(h, tilt, fingers, other) -> bool:
    return bool(lift_success_over(h, tilt, fingers, other, WINDOW)[0])


def test_a_level_two_arm_lift_held_for_the_window_succeeds_and_a_break_restarts_it():
    assert succeeds(*trajectory(0.16))
    assert not succeeds(*trajectory([0.16] * 19 + [0.02] + [0.16] * 19)), "two 19-step holds are no 20-step hold"
    assert not succeeds(*trajectory(0.16, tilt_deg=12.0)), "tilted beyond 10 degrees"
    streak = update_streak(torch.tensor([3, 7]), torch.tensor([True, False]))
    assert streak.tolist() == [4, 0]


def test_counter_examples_never_succeed():
    # touch only: both grippers on the bar, which still rests on the table
    assert not succeeds(*trajectory(0.02, other=True))
    # one-arm lift: the bar in the window, but only arm 0's fingers on it
    assert not succeeds(*trajectory(0.16, grip=(True, False)))
    # fling through the window: up through 0.13-0.20 m in a few steps and out
    assert not succeeds(*trajectory([0.02 + 0.03 * t for t in range(T)], grip=(False, False)))
    assert not succeeds(*trajectory([0.02 + 0.01 * t for t in range(T)])), "held but rising straight through"
    # bar resting on the table untouched
    assert not succeeds(*trajectory(0.02, grip=(False, False), other=True))
    # lifted but also touching something else (an arm's link, the table)
    assert not succeeds(*trajectory(0.16, other=True))


def test_reward_terms_take_the_minimum_over_the_arms():
    both = torch.ones(1, 2, 2, dtype=torch.bool)
    one = both.clone()
    one[0, 1] = False
    assert grip_reward(both).item() == 1.0 and grip_reward(one).item() == 0.0
    # arm 0 raised its end to the target, arm 1's end is still on the table
    ends = torch.tensor([[0.165, 0.02]])
    assert lift_reward(ends, both, 0.02, 0.165).item() == pytest.approx(0.0)
    assert lift_reward(torch.tensor([[0.165, 0.0925]]), both, 0.02, 0.165).item() == pytest.approx(0.5)
    assert lift_reward(torch.tensor([[0.165, 0.165]]), one, 0.02, 0.165).item() == 0.0, "arm 1 does not grip"
    d = torch.tensor([[[0.0, 0.0, 0.0], [0.05, 0.0, 0.0]]])
    assert reach_reward(d, 0.05).item() == pytest.approx(math.exp(-1.0))


def test_bar_tilt_by_hand():
    ten = math.radians(10.0)  # a turn about y by 10 degrees tilts the bar's x axis by 10 degrees
    quat = torch.tensor([[math.cos(ten / 2), 0.0, math.sin(ten / 2), 0.0], [1.0, 0.0, 0.0, 0.0]])
    assert torch.allclose(bar_tilt(quat), torch.tensor([ten, 0.0]), atol=1e-6)


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: RandomizationConfig(object_mass=(-0.1, 0.2)), "randomization.object_mass"),
        (lambda: RandomizationConfig(friction=(0.4, 5.0)), "randomization.friction"),
        (lambda: BimanualConfig(randomization=RandomizationConfig(action_latency=(0, 8))), "action_latency"),
        (lambda: BimanualConfig(variant="juggle"), "env.variant"),
        (lambda: BimanualConfig(bar_length=0.5), "env.bar_length"),
        (lambda: ObservationConfig(camera_res=4), "observations.camera_res"),
        (lambda: ObservationConfig(wrench_gain=(1.5, 0.5)), "observations.wrench_gain"),
    ],
)
def test_out_of_range_settings_are_refused_naming_the_field(make, field):
    with pytest.raises(ConfigError, match=field):
        make()


# --------------------------------------------------------------------------------------------- Genesis env
N = 4


@pytest.fixture(scope="module")
def env():
    from envs.bimanual.env import BimanualEnv

    env = BimanualEnv(BimanualConfig(num_envs=N, seed=3))
    yield env
    env.close()


@pytest.mark.genesis
def test_observation_groups_and_a_masked_reset_touches_only_its_envs(env):
    from envs.bimanual.config import nominal
    from envs.bimanual.env import FACTOR_NAMES
    from envs.task import get_task

    obs = env.get_observations()
    assert set(obs.keys()) == set(get_task("bimanual-lift").observation_groups(env.cfg))
    assert obs["env_factors"].shape == (N, len(FACTOR_NAMES)) and obs["proprio"].shape[-1] > 10
    for _ in range(3):
        obs, rewards, dones, extras = env.step(torch.full((N, 10), 0.3))
    assert rewards.shape == (N,) and torch.isfinite(obs["teacher"]).all() and not extras["error_envs"].any()
    before = env.state_dict()
    env._reset_idx(torch.tensor([1]))
    after = env.state_dict()
    keep = torch.tensor([0, 2, 3])
    for name in ("arm_qpos", "object_qpos", "mass", "friction", "gain", "target_pos", "episode_length_buf",
                 "wrench_gain", "wrench_bias"):  # fmt: skip
        assert torch.equal(after[name][keep], before[name][keep]), name
    assert not torch.equal(after["wrench_gain"][1], before["wrench_gain"][1]), "a reset recalibrates its wrench"
    lo, hi = env.cfg.observations.wrench_gain
    assert lo <= float(after["wrench_gain"].min()) and float(after["wrench_gain"].max()) <= hi
    assert after["wrench_gain"].std() > 0.1 * (hi - lo), "a gain per env, arm and axis"
    assert nominal(env.cfg).observations.wrench_gain == (1.0, 1.0)
    assert after["episode_length_buf"][1] == 0 and not torch.equal(after["arm_qpos"][1], before["arm_qpos"][1])
    assert torch.allclose(env.bs.object_mass(), env.mass, atol=1e-6)


@pytest.mark.genesis
def test_an_exploding_env_is_reset_and_counted_and_a_saved_state_loads_back(env):
    env.reset()
    for _ in range(2):
        env.step(torch.zeros(N, 10))
    saved = env.state_dict()
    before = env.error_count
    velocity = torch.zeros(1, 6)
    velocity[0, 2] = 10.0 * env.cfg.error_speed  # the bar shot upward: an exploded simulation in env 2 only
    env.bs.object.set_dofs_velocity(velocity, envs_idx=torch.tensor([2]))
    _, rewards, dones, extras = env.step(torch.zeros(N, 10))
    assert extras["error_envs"].tolist() == [False, False, True, False] and dones[2] and rewards[2] == 0.0
    assert env.error_count == before + 1 and extras["log"]["error_resets"].item() == 1.0
    assert env.episode_length_buf[2] == 0 and env.episode_length_buf[0] == 3
    env.load_state_dict(saved)
    again = env.state_dict()
    for name in ("arm_qpos", "object_qpos", "target_pos", "mass", "gain", "episode_length_buf"):
        assert torch.allclose(again[name].float(), saved[name].float(), atol=1e-5), name


@pytest.mark.genesis
def test_the_scripted_expert_lifts_the_bar_at_nominal_settings(env):
    from envs.bimanual.config import nominal
    from envs.bimanual.expert import ScriptedExpert
    from envs.bimanual.task import BimanualEvalConfig, run_episodes, summarize

    original = env.cfg
    env.cfg = nominal(original)  # the same scene (one per session), every factor nominal from the next reset on
    expert, most_held = ScriptedExpert(env), torch.zeros(N, dtype=torch.long)

    def act(obs):
        most_held.copy_(torch.maximum(most_held, env.held_steps))
        return expert(obs)

    try:
        records = run_episodes(act, env, BimanualEvalConfig(episodes=N, seed=11))
    finally:
        env.cfg = original
    metrics = summarize(records)
    assert metrics["success"] == 1.0, records
    assert metrics["error_episodes"] == 0.0
    # a success holds the bar in all four fingers for its last second: the holding clock saw (nearly) all of it
    assert bool((most_held >= env.hold_steps - 1).all()), (most_held, env.hold_steps)
    assert bool((env.held_steps == 0).all()), "every env was reset at its success: its clock restarts"


@pytest.mark.genesis
def test_the_teacher_smoke_run_trains_the_arm_task(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.train_teacher", "smoke", "--task", "bimanual-lift", "--run-dir",
         str(tmp_path)],
        cwd=ROOT, env={**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}, capture_output=True,
        text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "eval.json").read_text())
    assert summary["iterations"] == 2 and 0.0 <= summary["final_eval"]["success"] <= 1.0
    assert (tmp_path / "teacher.pt").is_file()
