import textwrap

import pytest
import torch

from envs.errors import GapbridgeError, RewardFunctionError
from envs.racing.deepracer_reward import PARAM_KEYS, DeepRacerParams, evaluate_reward_function, load_reward_function
from envs.racing.env import RacingEnv
from envs.racing.rewards import RewardConfig, centerline_reward, is_offtrack, progress_reward
from tests.helpers import small_env_config

# DeepRacer's default reward function, as shipped in the console (follow the center line).
DEFAULT_REWARD = textwrap.dedent(
    """
    def reward_function(params):
        track_width = params['track_width']
        distance_from_center = params['distance_from_center']
        marker_1 = 0.1 * track_width
        marker_2 = 0.25 * track_width
        marker_3 = 0.5 * track_width
        if distance_from_center <= marker_1:
            reward = 1.0
        elif distance_from_center <= marker_2:
            reward = 0.5
        elif distance_from_center <= marker_3:
            reward = 0.1
        else:
            reward = 1e-3  # likely crashed/ close to off track
        return float(reward)
    """
)


def test_centerline_reward_markers_by_hand():
    width = torch.full((6,), 1.0)
    d = torch.tensor([0.0, 0.1, 0.2, 0.25, 0.4, 0.6])
    assert centerline_reward(d, width).tolist() == pytest.approx([1.0, 1.0, 0.5, 0.5, 0.1, 1e-3])
    assert centerline_reward(-d, width).tolist() == pytest.approx([1.0, 1.0, 0.5, 0.5, 0.1, 1e-3])


def test_progress_reward_and_offtrack_by_hand():
    assert progress_reward(torch.tensor([0.2]), max_speed=3.0, dt=1 / 15).item() == pytest.approx(1.0)
    off = is_offtrack(torch.tensor([0.5, 0.55, -0.6]), torch.tensor([0.45, 0.45, 0.45]), 0.081)
    assert off.tolist() == [False, True, True]


def test_adapter_runs_default_function_like_the_vectorized_reward(tmp_path):
    path = tmp_path / "reward.py"
    path.write_text(DEFAULT_REWARD)
    fn = load_reward_function(path)
    env = RacingEnv(small_env_config(num_envs=64, track="reinvent2018"))
    gen = torch.Generator().manual_seed(1)
    offset = (torch.rand(64, generator=gen) - 0.5) * 0.8
    s = torch.rand(64, generator=gen) * env.track.length
    xy, heading, hw = env.track.interpolate(s)
    builder = DeepRacerParams(env.track)
    params = builder.build(
        xy[:, 0], xy[:, 1], heading, s, offset, hw, s, torch.ones(64), torch.zeros(64), torch.ones(64),
        torch.zeros(64, dtype=torch.long), 0.081,
    )  # fmt: skip
    assert set(params[0]) == set(PARAM_KEYS)
    ours = centerline_reward(offset, 2 * hw)
    theirs = evaluate_reward_function(fn, params)
    assert torch.allclose(ours, theirs)


def test_closest_waypoints_follow_the_travel_direction():
    env = RacingEnv(small_env_config(num_envs=1, track="oval"))
    builder = DeepRacerParams(env.track)
    s_mid = float(builder.waypoint_s[10] + builder.waypoint_s[11]) / 2
    assert builder.closest_waypoints(s_mid, reversed_=False) == [10, 11]
    m = len(builder.waypoint_s)
    prev, nxt = builder.closest_waypoints(s_mid, reversed_=True)
    rev = builder.waypoints_rev
    assert rev[prev] == builder.waypoints_fwd[11] and rev[nxt] == builder.waypoints_fwd[10]
    assert 0 <= prev < m and 0 <= nxt < m


def test_env_uses_a_user_reward_file(tmp_path):
    path = tmp_path / "speedy.py"
    path.write_text(
        "def reward_function(params):\n    return float(params['speed']) + (0.5 if params['is_reversed'] else 0)\n"
    )
    env = RacingEnv(small_env_config(num_envs=2, reward=RewardConfig(deepracer_function=str(path))))
    _, rew, _, _ = env.step(torch.tensor([[1.0], [0.0]]))
    speeds = [env.action_space.choices[1][1], env.action_space.choices[0][1]]
    assert rew.tolist() == pytest.approx(speeds)
    bad = tmp_path / "bad.py"
    bad.write_text("def reward_function(params):\n    return 'high'\n")
    env = RacingEnv(small_env_config(num_envs=1, reward=RewardConfig(deepracer_function=str(bad))))
    with pytest.raises(RewardFunctionError, match=r"bad\.py: reward_function returned 'high' at step 1 of env 0"):
        env.step(torch.zeros(1, 1))


def test_a_reward_function_that_raises_names_file_exception_step_env_and_keys(tmp_path):
    path = tmp_path / "typo.py"
    path.write_text(
        "def reward_function(params):\n"
        "    if params['steps'] < 2:\n"
        "        return 1.0\n"
        "    return params['nonexistent_key']\n"
    )
    env = RacingEnv(small_env_config(num_envs=2, reward=RewardConfig(deepracer_function=str(path))))
    env.step(torch.zeros(2, 1))
    with pytest.raises(RewardFunctionError) as caught:
        env.step(torch.zeros(2, 1))
    message = str(caught.value)
    assert "\n" not in message
    assert f"{path}:4: reward_function raised KeyError: 'nonexistent_key' at step 2 of env 0" in message
    assert "params keys: all_wheels_on_track, closest_objects," in message and message.endswith("x, y")
    assert isinstance(caught.value, GapbridgeError)


def test_edge_penalty_by_hand():
    from envs.racing.rewards import edge_penalty

    hw = torch.full((4,), 0.5)
    out = edge_penalty(torch.tensor([0.0, 0.35, -0.425, 0.6]), hw, 0.7)
    assert out.tolist() == pytest.approx([0.0, 0.0, -0.25, -((0.5 / 0.3) ** 2)])
