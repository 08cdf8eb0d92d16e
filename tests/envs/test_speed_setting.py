"""The car's maximum-speed setting drawn per env (`randomization.max_speed_percent`): draws, what the car executes,
what the policies read, what evaluations drive at and report, and the refusal of bad ranges."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from envs.errors import ConfigError
from envs.racing.deploy import DeepRacerCommands
from envs.racing.env import RacingEnv
from envs.racing.evaluation import EvalConfig, completion_by_factor, evaluation_env_config, run_episodes
from envs.racing.randomization import FACTOR_NAMES, RandomizationConfig
from experiments import cli
from tests.helpers import NO_RANDOMIZATION, small_env_config

DRAWN = replace(NO_RANDOMIZATION, max_speed_percent=True, max_speed_percent_range=(60.0, 100.0), direction="forward")
STRAIGHT_FAST = 5.0
"""the default action space's (0 degrees, 2.8 m/s)"""


def drawn_env(num_envs: int, seed: int = 0, **changes) -> RacingEnv:
    return RacingEnv(small_env_config(num_envs=num_envs, randomization=DRAWN, seed=seed, **changes))


def test_settings_are_drawn_per_env_within_the_range_and_under_the_env_seed():
    env = drawn_env(16)
    settings = env.world.max_speed_percent.clone()
    assert settings.shape == (16,) and bool(((settings >= 60.0) & (settings <= 100.0)).all())
    assert len(set(settings.tolist())) == 16
    assert torch.equal(drawn_env(16).world.max_speed_percent, settings)
    assert not torch.equal(drawn_env(16, seed=1).world.max_speed_percent, settings)
    # a masked reset draws anew for those envs only
    ids = torch.tensor([1, 4])
    env.reset_to(ids, torch.zeros(2), torch.ones(2))
    kept = torch.ones(16, dtype=torch.bool)
    kept[ids] = False
    assert torch.equal(env.world.max_speed_percent[kept], settings[kept])
    assert not torch.equal(env.world.max_speed_percent[ids], settings[ids])
    # off (the default): every env at the fixed setting
    fixed = RacingEnv(small_env_config(num_envs=3, max_speed_percent=80.0))
    assert not RandomizationConfig().max_speed_percent and fixed.world.max_speed_percent.tolist() == [80.0] * 3


def test_each_env_drives_at_its_own_setting_and_reads_the_command_it_chose():
    """Two envs, the same straight-ahead 2.8 m/s action, settings drawn apart: after 1.5 s (motor lag 0.2 s) each car
    runs at 2.8 m/s times its own setting, so their speeds stand at the ratio of their settings, while both
    previous-action inputs (the `proprio` group and the `teacher` group's last two columns) say the fastest action."""
    env = drawn_env(2, seed=3)
    settings = env.world.max_speed_percent.clone()
    assert abs(float(settings[0] - settings[1])) > 5.0
    for _ in range(22):
        obs, _, dones, _ = env.step(torch.full((2, 1), STRAIGHT_FAST))
        assert not dones.any()
    speed = env.physics.state.speed
    assert speed.tolist() == pytest.approx((2.8 * settings / 100.0).tolist(), rel=0.01)
    assert float(speed[0] / speed[1]) == pytest.approx(float(settings[0] / settings[1]), rel=1e-3)
    chosen = torch.tensor([[0.0, 1.0]] * 2)
    torch.testing.assert_close(obs["proprio"], chosen)
    torch.testing.assert_close(obs["teacher"][:, -2:], chosen)
    assert obs["env_factors"].shape == (2, len(FACTOR_NAMES)), "the setting is no env factor"


def test_the_deployment_runtime_feeds_back_what_the_env_does(tmp_path):
    """The runtime at a 70% setting sends 0.7 * 2.8 m/s and returns the same previous-action input as the env."""
    env = drawn_env(1)
    (tmp_path / "model_metadata.json").write_text(json.dumps(env.action_space.to_metadata()))
    commands = DeepRacerCommands(tmp_path, max_speed_percent=70.0)
    logits = torch.nn.functional.one_hot(torch.tensor([int(STRAIGHT_FAST)]), commands.num_outputs).float().numpy()
    command, previous = commands.command(logits)
    obs, _, _, _ = env.step(torch.tensor([[STRAIGHT_FAST]]))
    assert command.speed == pytest.approx(0.7 * 2.8)
    torch.testing.assert_close(torch.from_numpy(previous), obs["proprio"])


def test_evaluations_drive_at_the_fixed_setting_and_report_the_drawn_one():
    cfg = small_env_config(randomization=DRAWN, max_speed_percent=75.0)
    plan = EvalConfig(start_points=2, directions=("forward",), repeats=2, max_seconds=1.0, record_trajectories=False)
    fixed = RacingEnv(evaluation_env_config(cfg, plan))
    assert fixed.world.max_speed_percent.tolist() == [75.0] * 4
    records = run_episodes(lambda obs: torch.full((4, 1), STRAIGHT_FAST), fixed, plan)
    assert [r.factors["max_speed_percent"] for r in records] == [75.0] * 4
    assert "max_speed_percent" not in completion_by_factor(records)
    drawn = RacingEnv(replace(evaluation_env_config(cfg, plan), randomization=DRAWN))
    records = run_episodes(lambda obs: torch.full((4, 1), STRAIGHT_FAST), drawn, plan)
    by_factor = completion_by_factor(records, bins=2)
    assert sum(row["episodes"] for row in by_factor["max_speed_percent"]) == 4
    assert all(60.0 <= r.factors["max_speed_percent"] <= 100.0 for r in records)


def test_env_state_keeps_the_drawn_settings_and_older_states_restore_the_fixed_one():
    env = drawn_env(3)
    saved = env.state_dict()
    env.reset()
    env.load_state_dict(saved)
    assert torch.equal(env.world.max_speed_percent, saved["world.max_speed_percent"])
    fixed = RacingEnv(small_env_config(num_envs=3, max_speed_percent=80.0))
    older = {k: v for k, v in fixed.state_dict().items() if k != "world.max_speed_percent"}
    fixed.world.max_speed_percent.fill_(50.0)
    fixed.load_state_dict(older)
    assert fixed.world.max_speed_percent.tolist() == [80.0] * 3
    with pytest.raises(ConfigError, match="world.max_speed_percent"):
        env.load_state_dict({k: v for k, v in saved.items() if k != "world.max_speed_percent"})


@pytest.mark.parametrize("bad", [(90.0, 80.0), (5.0, 100.0), (70.0, 120.0)])
def test_invalid_setting_ranges_are_refused_naming_the_flag(bad):
    with pytest.raises(ConfigError, match=r"randomization\.max_speed_percent_range"):
        RandomizationConfig(max_speed_percent=True, max_speed_percent_range=bad)


def test_the_flags_reach_the_env_config(capsys):
    from experiments.train_teacher import PRESETS

    flags = ["--env.randomization.max-speed-percent", "--env.randomization.max-speed-percent-range", "70", "90"]
    rnd = cli.parse(PRESETS, "", ["smoke", *flags]).env.randomization
    assert rnd.max_speed_percent and rnd.max_speed_percent_range == (70.0, 90.0)
    with pytest.raises(SystemExit):
        cli.parse(PRESETS, "", ["smoke", "--env.randomization.max-speed-percent-range", "90", "70"])
    assert "randomization.max_speed_percent_range=(90.0, 70.0) is invalid" in capsys.readouterr().err
