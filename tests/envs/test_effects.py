import pytest
import torch

from envs.errors import ConfigError
from envs.racing.effects import DelayLine, action_noise
from envs.racing.env import RacingEnv
from envs.racing.randomization import RandomizationConfig
from tests.helpers import NO_RANDOMIZATION, small_env_config


def test_delay_line_delays_by_exactly_the_requested_pushes():
    line = DelayLine(num_envs=3, dim=1, capacity=8)
    delay = torch.tensor([0, 2, 5])
    seen = []
    for t in range(10):
        line.push(torch.full((3, 1), float(t)))
        seen.append(line.read(delay)[:, 0].tolist())
    for t in range(5, 10):
        assert seen[t] == [t, t - 2, t - 5]


def test_delay_line_fill_erases_history_of_the_given_envs():
    line = DelayLine(2, 1, 4)
    for t in range(4):
        line.push(torch.full((2, 1), float(t + 1)))
    line.fill(torch.tensor([[9.0]]), torch.tensor([1]))
    assert line.read(torch.tensor([3, 3]))[:, 0].tolist() == [1.0, 9.0]


@pytest.mark.parametrize("latency_substeps", [0, 2, 5])
def test_action_latency_delays_the_actuators_by_the_sampled_substeps(latency_substeps):
    """A steering command issued at step 0 reaches the servo exactly `latency` physics substeps later (one substep
    per control step here, so control steps count substeps)."""
    rnd = RandomizationConfig(
        **{**NO_RANDOMIZATION.__dict__, "nominal_action_latency_ms": latency_substeps * 1000 / 60}
    )
    env = RacingEnv(small_env_config(num_envs=1, randomization=rnd, substeps=1, control_hz=60.0))
    assert env.world.action_latency.item() == latency_substeps
    left = torch.tensor([[8.0]])  # +30 degrees
    steer = []
    for _ in range(8):
        env.step(left)
        steer.append(env.physics.state.steer.item())
    first_moving = next(k for k, v in enumerate(steer) if v > 0)
    assert first_moving == latency_substeps


def test_fractional_frame_latency_with_substeps():
    """Two substeps of latency inside a four-substep frame: the servo moves during the first frame, but less."""

    def steer_after_one_frame(latency_ms):
        rnd = RandomizationConfig(**{**NO_RANDOMIZATION.__dict__, "nominal_action_latency_ms": latency_ms})
        env = RacingEnv(small_env_config(num_envs=1, randomization=rnd))
        env.step(torch.tensor([[8.0]]))
        return env.physics.state.steer.item()

    none, half, full = steer_after_one_frame(0.0), steer_after_one_frame(2000 / 60), steer_after_one_frame(4000 / 60)
    assert none > half > 0.0 and full == 0.0


def test_action_noise_scale_and_zero_scale_identity():
    gen = torch.Generator().manual_seed(0)
    steer, speed = torch.zeros(10000), torch.full((10000,), 2.0)
    s0, v0 = action_noise(steer, speed, torch.zeros(10000), 0.5, gen)
    assert torch.equal(s0, steer) and torch.equal(v0, speed)
    s1, v1 = action_noise(steer, speed, torch.full((10000,), 0.1), 0.5, gen)
    assert s1.abs().max() <= 0.05 + 1e-6 and s1.abs().max() > 0.045
    assert 0.09 < (v1 / 2.0 - 1).abs().max() <= 0.1 + 1e-6


def test_max_speed_setting_scales_the_car_and_not_the_policy_input():
    """The car's maximum-speed setting at 60%: straight ahead at the 2.8 m/s action settles at 0.6 * 2.8 = 1.68 m/s
    (first-order motor lag of 0.2 s: after 1.5 s e^-7.5 of the step is left), while the previous-action input still
    says the fastest action (2.8 / 2.8 = 1)."""
    env = RacingEnv(small_env_config(num_envs=1, max_speed_percent=60.0))
    straight_fast = torch.tensor([[5.0]])
    assert env.action_space.choices[5] == (0.0, 2.8)
    for _ in range(22):
        obs, _, dones, _ = env.step(straight_fast)
        assert not dones.any()
    assert env.physics.state.speed.item() == pytest.approx(1.68, rel=0.01)
    assert obs["proprio"][0].tolist() == pytest.approx([0.0, 1.0])
    with pytest.raises(ConfigError, match="env.max_speed_percent"):
        small_env_config(max_speed_percent=120.0)
