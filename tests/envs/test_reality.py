"""Reality-proxy effects with hand-computed values, the sensor model, proxy configs and variants."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from envs.errors import ConfigError
from envs.racing.config import EnvConfig
from envs.racing.effects import ActuatorEffects, EffectsConfig, jitter_steps, mean_jitter_ms
from envs.racing.env import RacingEnv
from envs.racing.reality import VARIANTS, RealityConfig, reality_env_config
from envs.racing.sensor import SensorConfig, SensorModel, vignette_gain
from experiments.cli import parse
from tests.helpers import small_env_config

DT = 1 / 60


def effects(**kw) -> ActuatorEffects:
    return ActuatorEffects(EffectsConfig(**kw), 3, DT, 4.0, torch.device("cpu"))


def test_servo_rate_limit_caps_the_change_per_substep():
    fx = effects(servo_rate_dps=300.0)  # 5 degrees per 1/60 s substep
    target = torch.tensor([math.radians(20.0), math.radians(-2.0), 0.0])
    first = fx.servo(target)
    assert torch.allclose(first, torch.tensor([math.radians(5.0), math.radians(-2.0), 0.0]), atol=1e-6)
    for _ in range(3):
        out = fx.servo(target)
    assert out[0].item() == pytest.approx(math.radians(20.0), abs=1e-6)  # reached after four substeps
    fx.reset(torch.tensor([0]))
    assert fx.servo_angle[0].item() == 0.0


def test_deadband_zeroes_small_commands_and_trim_adds():
    fx = effects(steering_deadband_deg=1.5, steering_offset_deg=1.0)
    steer = torch.tensor([math.radians(1.0), math.radians(-1.4), math.radians(3.0)])
    out, _ = fx.command(steer, torch.ones(3))
    expected = torch.tensor([math.radians(1.0), math.radians(1.0), math.radians(4.0)])
    assert torch.allclose(out, expected, atol=1e-6)


def test_throttle_map_is_the_power_law():
    fx = effects(throttle_exponent=2.0)
    _, speed = fx.command(torch.zeros(3), torch.tensor([1.0, 2.0, 4.0]))
    assert torch.allclose(speed, torch.tensor([0.25, 1.0, 4.0]))  # 4 * (v / 4) ** 2


def test_battery_sags_with_session_time_down_to_the_floor():
    fx = effects(battery_sag_per_minute=0.05, battery_floor=0.85)
    for _ in range(60 * 60):  # one minute of substeps
        fx.servo(torch.zeros(3))
    assert fx.battery_gain()[0].item() == pytest.approx(0.95, abs=1e-4)
    fx.reset(torch.arange(3))  # a new episode does not recharge the battery
    assert fx.battery_gain()[0].item() == pytest.approx(0.95, abs=1e-4)
    fx.drive_seconds.fill_(600.0)
    assert fx.battery_gain()[0].item() == pytest.approx(0.85)


def test_latency_jitter_stays_in_range():
    fx = effects(latency_jitter_ms=50.0)  # 3 substeps at 60 Hz
    g = torch.Generator().manual_seed(0)
    base = torch.full((3,), 2, dtype=torch.long)
    draws = torch.stack([fx.latency(base, g) for _ in range(200)])
    assert draws.min().item() == 2 and draws.max().item() == 5


@pytest.mark.parametrize("jitter_ms", [0.0, 20.0, 30.0, 50.0])
def test_mean_jitter_is_the_mean_of_the_drawn_extra_latency(jitter_ms):
    # the calibrated world takes this mean off its action latency: it must be what the env draws on average
    fx = effects(latency_jitter_ms=jitter_ms)
    g = torch.Generator().manual_seed(1)
    base = torch.zeros(3, dtype=torch.long)
    extra_ms = torch.stack([fx.latency(base, g) for _ in range(4000)]).float().mean() * 1000.0 * DT
    assert fx.jitter_steps == jitter_steps(jitter_ms, DT) == round(jitter_ms * 60 / 1000)
    assert extra_ms.item() == pytest.approx(mean_jitter_ms(jitter_ms, DT), abs=0.4)


def test_effects_config_refuses_out_of_range():
    with pytest.raises(ConfigError, match="effects.throttle_exponent"):
        EffectsConfig(throttle_exponent=0.0)
    assert not EffectsConfig().active and EffectsConfig(servo_rate_dps=100.0).active


def test_env_with_effects_slows_and_resumes_exactly():
    cfg = small_env_config(num_envs=2, effects=EffectsConfig(battery_sag_per_minute=0.5, throttle_exponent=1.5))
    env, ref = RacingEnv(cfg), RacingEnv(small_env_config(num_envs=2))
    actions = torch.full((2,), 4, dtype=torch.long)  # straight ahead at 1.4 m/s, half the top speed
    for _ in range(30):
        env.step(actions)
        ref.step(actions)
    # Half throttle through the 1.5-power map gives 0.5 ** 0.5 of the linear speed, and the battery has sagged 1/60.
    ratio = env.physics.state.speed / ref.physics.state.speed
    assert ratio.tolist() == pytest.approx([0.5**0.5 * (1.0 - 0.5 * 2.0 / 60.0)] * 2, rel=0.01)
    assert env.world.battery[0].item() == pytest.approx(1.0 - 0.5 * 2.0 / 60.0, abs=1e-3)
    saved = env.state_dict()
    a = [env.step(actions)[0]["teacher"] for _ in range(5)]
    env.load_state_dict(saved)
    b = [env.step(actions)[0]["teacher"] for _ in range(5)]
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_vignette_and_noise():
    gain = vignette_gain(120, 160, 0.3)
    assert gain.max().item() == pytest.approx(1.0, abs=0.01)
    assert gain[0, 0].item() == pytest.approx(0.7, abs=0.01)
    model = SensorModel(SensorConfig(vignetting=0.3, read_noise=4.0), 120, 160)
    frames = torch.full((2, 1, 120, 160), 100, dtype=torch.uint8)
    out = model.apply(frames, torch.Generator().manual_seed(0))
    assert out.dtype == torch.uint8 and out.shape == frames.shape
    centre = out[:, :, 50:70, 70:90].float()
    assert centre.mean().item() == pytest.approx(100.0, abs=1.0)
    assert centre.std().item() == pytest.approx(4.0, rel=0.15)
    assert out[:, :, :5, :5].float().mean().item() < 80.0


def test_reality_config_variants_and_parts():
    base = EnvConfig(camera="projective")
    sun = RealityConfig(variant="sunlight").resolved()
    assert sun.scene.glare_patches == VARIANTS["sunlight"]["scene.glare_patches"]
    # an explicit value wins over the variant
    mine = RealityConfig(variant="sunlight", scene=replace(RealityConfig().scene, glare_patches=2)).resolved()
    assert mine.scene.glare_patches == 2
    full = reality_env_config(base, RealityConfig())
    assert (full.physics, full.camera, full.substeps, full.optics.lens) == ("genesis", "genesis", 8, "fisheye")
    assert full.effects.active and full.sensor.active and not full.randomization.action_noise
    dyn = reality_env_config(base, RealityConfig(), part="dynamics")
    assert dyn.physics == "genesis" and dyn.camera == "projective" and not dyn.sensor.active
    per = reality_env_config(base, RealityConfig(), part="perception")
    assert per.physics == "bicycle" and per.camera == "genesis" and not per.effects.active
    assert not per.randomization.friction
    office = reality_env_config(base, RealityConfig(variant="office-corridor"))
    assert not office.scene.walls and office.scene.floor == "office"
    far = reality_env_config(base, RealityConfig(variant="out-of-range"), part="dynamics")  # outside `transfer`
    rnd = far.randomization
    assert rnd.nominal_action_latency_ms == 150.0 and rnd.motor_gain_range == pytest.approx((0.679, 0.721))
    assert far.effects.steering_offset_deg == 4.0


def test_reality_config_refuses_bad_values():
    with pytest.raises(ConfigError, match="reality.variant"):
        RealityConfig(variant="moon")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="reality.friction"):
        RealityConfig(friction=5.0)


def test_reality_config_round_trips_through_the_cli():
    presets = {"default": ("proxy", RealityConfig())}
    cfg = parse(presets, "", ["default", "--variant", "office-corridor", "--effects.servo-rate-dps", "200",
                              "--sensor.read-noise", "5", "--scene.glare-patches", "9"])  # fmt: skip
    assert cfg.variant == "office-corridor" and cfg.effects.servo_rate_dps == 200.0
    assert cfg.sensor.read_noise == 5.0 and cfg.scene.glare_patches == 9
    with pytest.raises(SystemExit):
        parse(presets, "", ["default", "--variant", "moon"])


def test_randomized_effects_draw_strengths_between_off_and_the_value():
    cfg = EffectsConfig(servo_rate_dps=300.0, throttle_exponent=2.0, battery_floor=0.8, randomize=True)
    fx = ActuatorEffects(cfg, 256, DT, 4.0, torch.device("cpu"))
    fx.reset(torch.arange(256), torch.Generator().manual_seed(0))
    gain = fx.battery_gain()
    assert gain.min() >= 0.8 and gain.max() <= 1.0 and gain.std() > 0.03
    _, speed = fx.command(torch.zeros(256), torch.full((256,), 2.0))
    assert speed.min() >= 1.0 - 1e-5 and speed.max() <= 2.0 + 1e-5 and speed.std() > 0.1  # 4 * 0.5 ** [1, 2]
    out = fx.servo(torch.full((256,), 1.0))
    assert out.min() >= math.radians(5.0) - 1e-6, "a weaker effect is a faster servo, never a slower one"
