"""Genesis backend (CPU, few envs; each scene type compiles kernels once per machine, then comes from the cache)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from envs.racing.config import EnvConfig
from envs.racing.physics_bicycle import CarParams
from tests.helpers import NO_RANDOMIZATION

pytestmark = pytest.mark.genesis
CFG = EnvConfig(num_envs=4, physics="genesis", randomization=NO_RANDOMIZATION, compile=False)


@pytest.fixture(scope="module")
def physics():
    from envs.racing.physics_genesis import GenesisPhysics

    phys = GenesisPhysics(CFG, torch.device("cpu"))
    yield phys
    phys.close()


def run(phys, steer, speed, friction=(1.0, 1.0, 1.0, 1.0), seconds=4.0):
    ids = torch.arange(4)
    zero = torch.zeros(4)
    params = CarParams.nominal(4)
    params.friction.copy_(torch.tensor(friction))
    phys.set_params(params, ids)
    phys.reset(ids, zero, zero, zero, zero)
    trace = []
    for _ in range(int(seconds / phys.dt)):
        s = phys.step(torch.tensor(steer, dtype=torch.float32), torch.tensor(speed, dtype=torch.float32))
        trace.append(torch.stack([s.x, s.y, s.speed, s.yaw_rate, s.vy], -1))
    return torch.stack(trace)


def test_drives_straight_at_the_commanded_speed(physics):
    tr = run(physics, [0.0] * 4, [0.5, 1.0, 1.5, 2.0], seconds=3.0)
    speed = tr[-60:, :, 2].mean(0)
    assert speed.tolist() == pytest.approx([0.5, 1.0, 1.5, 2.0], rel=0.08)
    assert tr[-1, :, 1].abs().max() < 0.15, "no drift sideways"


def test_constant_steering_gives_the_kinematic_radius_at_low_speed(physics):
    steer = [0.15, 0.3, -0.3, 0.45]
    tr = run(physics, steer, [0.6] * 4, seconds=5.0)
    radius = tr[-120:, :, 2].mean(0) / tr[-120:, :, 3].abs().mean(0)
    rear = torch.sqrt(radius**2 - CFG.car.cg_to_rear**2)
    expected = torch.tensor([CFG.car.wheelbase / math.tan(abs(d)) for d in steer])
    assert torch.allclose(rear, expected, rtol=0.15), (rear, expected)


def test_friction_changes_sliding_at_speed(physics):
    """At 1.5 m/s and 0.3 rad (4.2 m/s^2 on the kinematic circle) the grippy car follows its circle; at low
    friction it slides (large sideslip) and its lateral acceleration is capped by the friction."""
    tr = run(physics, [0.3] * 4, [1.5] * 4, friction=(1.0, 0.6, 0.3, 0.15), seconds=4.0)
    late = tr[-120:]
    sideslip = (late[..., 4].abs() / late[..., 2].clamp(min=1e-3)).mean(0)
    assert sideslip[3] > 2 * sideslip[0] and sideslip[2] > sideslip[0], sideslip
    lat = (late[..., 2] * late[..., 3]).abs().mean(0)
    assert lat[3] < 0.15 * 9.81 * 1.5, "lateral acceleration is friction-limited"
    kinematic = 1.5**2 / (CFG.car.wheelbase / math.tan(0.3))
    assert lat[0] == pytest.approx(kinematic, rel=0.15) and lat[0] > lat[3]


def test_mass_randomization_scales_each_car_with_its_inertia(physics):
    """Per-env mass scale: every link's mass and inertia scale by it (a heavier car of the same shape); a second
    episode's scale applies to the nominal car, not on top of the previous one."""
    car, ids = physics.car, torch.arange(4)
    nominal_mass, nominal_inertia = car.get_links_mass()[0].clone(), car.get_links_inertia()[0].clone()
    params = CarParams.nominal(4)
    for scale in ([1.0, 0.85, 1.2, 1.5], [1.0, 1.2, 0.9, 1.5]):
        params.mass_scale.copy_(torch.tensor(scale))
        physics.set_params(params, ids)
        mass, inertia = car.get_links_mass(), car.get_links_inertia()
        for i, k in enumerate(scale):
            assert torch.allclose(mass[i], nominal_mass * k, rtol=1e-4), (i, k)
            assert torch.allclose(inertia[i], nominal_inertia * k, rtol=1e-4, atol=1e-9), (i, k)
    assert float(mass[0].sum()) == pytest.approx(CFG.car.mass, rel=1e-4)
    physics.set_params(CarParams.nominal(4), ids)


def test_masked_reset_leaves_other_envs(physics):
    run(physics, [0.2] * 4, [1.0] * 4, seconds=1.0)
    before = physics.state.clone()
    physics.reset(torch.tensor([1]), torch.tensor([3.0]), torch.tensor([2.0]), torch.tensor([0.5]), torch.zeros(1))
    after = physics.state
    assert after.x[1].item() == pytest.approx(3.0, abs=1e-3) and after.y[1].item() == pytest.approx(2.0, abs=1e-3)
    keep = torch.tensor([0, 2, 3])
    assert torch.allclose(after.x[keep], before.x[keep]) and torch.allclose(after.yaw[keep], before.yaw[keep])


def test_one_genesis_mode_per_process(physics):
    from envs.errors import ConfigError
    from envs.genesis_import import GenesisConfig, init_genesis

    assert init_genesis(torch.device("cpu"), GenesisConfig()) is physics.gs
    with pytest.raises(ConfigError, match="performance_mode"):
        init_genesis(torch.device("cpu"), GenesisConfig(performance_mode=True))


def test_env_with_genesis_physics_and_camera():
    from envs.racing.env import RacingEnv

    env = RacingEnv(replace(CFG, num_envs=2, camera="genesis", start_points=(0.0, 0.5)))
    obs = env.get_observations()
    cam = obs["camera"]
    assert cam.shape == (2, 1, 120, 160) and cam.dtype == torch.uint8
    assert (cam[0].float() - cam[1].float()).abs().mean() > 3, "different poses, different images"
    assert cam.float().std() > 10, "a textured scene, not a blank frame"
    obs, rew, dones, _ = env.step(torch.full((2, 1), 5.0))
    assert rew.shape == (2,)
    # Start-up of each backend is timed apart from the rest of construction (what the benchmark reports).
    assert 0 < env.startup_seconds["physics"] and 0 < env.startup_seconds["camera"]
    env.close()


@pytest.mark.gpu
def test_gpu_backend_builds():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from envs.racing.env import RacingEnv

    env = RacingEnv(replace(CFG, device="cuda"))
    for _ in range(15):  # one second, straight ahead at the top speed
        obs, *_ = env.step(torch.full((env.num_envs, 1), 5.0, device="cuda"))
    assert obs["teacher"].device.type == "cuda"
    assert (env.physics.state.speed > 0.5).all(), "the cars drive"


def test_reality_proxy_env_builds_renders_and_steps():
    from envs.racing.env import RacingEnv
    from envs.racing.evaluation import EvalConfig, evaluation_env_config
    from envs.racing.reality import RealityConfig, reality_env_config

    base = replace(CFG, physics="bicycle", camera="projective")
    proxy = reality_env_config(base, RealityConfig(variant="sunlight"))
    env = RacingEnv(evaluation_env_config(proxy, EvalConfig(start_points=1, max_seconds=3.0)))
    assert env.cfg.physics == "genesis" and env.cfg.dt_physics == pytest.approx(1 / 120)
    cam = env.get_observations()["camera"].float()
    assert cam.shape == (2, 1, 120, 160)
    corners = torch.cat([cam[..., :6, :6], cam[..., :6, -6:]], -1)
    assert corners.mean() > 20, "the fisheye fills its frame: no black corners"
    for _ in range(10):
        obs, rew, dones, _ = env.step(torch.full((2,), 7, dtype=torch.long))
    assert env.physics.state.speed.min() > 0.3 and env.world.battery.max() < 1.0
    env.close()


def test_genesis_start_up_names_the_cpu_without_a_subprocess(physics):
    """`init_genesis` hands Genesis the CPU's name from /proc/cpuinfo during `gs.init` and puts py-cpuinfo back."""
    import cpuinfo
    import genesis.utils.misc as gs_misc

    from envs.genesis_import import _cpu_name_without_subprocess, _CpuName

    assert _CpuName.get_cpu_info()["brand_raw"]
    with _cpu_name_without_subprocess():
        assert gs_misc.cpuinfo is _CpuName
    assert gs_misc.cpuinfo is cpuinfo
