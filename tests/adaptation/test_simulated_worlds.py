"""Simulated worlds for the factor estimator's fit: who drives them, what they record, and the exact odometry they
read."""

import torch

from adaptation.estimator_fit import MotionErrors, episode_spans
from adaptation.factor_estimator import MOTION as MOTION_NAMES
from adaptation.simulated_worlds import simulated_inputs
from envs.racing.config import EnvConfig
from envs.vehicle import VEHICLE_ESTIMATES


class ConstantDriver:
    """Full throttle, straight ahead, on any observation; records what it was shown."""

    def __init__(self, n_actions):
        self.n_actions, self.seen = n_actions, []

    def act(self, obs):
        self.seen.append(obs["env_factors"].clone())
        return torch.full((obs.batch_size[0], 1), self.n_actions - 1, dtype=torch.long)


def test_simulated_worlds_give_contiguous_episodes_blind_driving_and_the_students_errors():
    from envs.racing.env import RacingEnv
    from envs.racing.randomization import FACTOR_NAMES

    env_cfg = EnvConfig(num_envs=4, camera="none", compile=False)
    n_actions = RacingEnv(env_cfg).action_space.num_actions
    weights = torch.zeros(4 + 2 * 2, 3)  # two lags of commands, unused
    weights[0, 0], weights[1:4] = 0.1, torch.diag(torch.tensor([0.5, 1.0, 1.0]))
    errors = MotionErrors(weights, [torch.zeros(10, 3)])
    driver = ConstantDriver(n_actions)
    sim = simulated_inputs(driver, env_cfg, errors, envs=6, steps=40, seed=3, first_episode=100)
    assert sim.inputs.shape == (240, 5) and sim.targets.shape == (240, len(VEHICLE_ESTIMATES.targets))
    assert int(sim.episode.min()) == 100
    for a, b in episode_spans(sim.episode):  # each episode's rows together, one step apart, from a reset
        assert torch.equal(sim.step[a:b], sim.step[a] + torch.arange(b - a))
    assert bool((sim.step[torch.nonzero(sim.episode[1:] != sim.episode[:-1])[:, 0] + 1] == 0).all())
    speed = sim.targets[:, VEHICLE_ESTIMATES.column("speed")]
    centre, scale = VEHICLE_ESTIMATES.scale["speed"]
    assert torch.allclose(sim.inputs[:, 2], 0.1 + 0.5 * (speed - centre) / scale, atol=1e-5)
    assert float(speed.max()) > 1.0  # the cars drove
    friction = sim.targets[:, VEHICLE_ESTIMATES.column("friction")]
    assert float(friction.std()) > 0.05  # randomized worlds
    for name in ("friction", "motor_gain"):  # the driver saw the nominal value only
        shown = torch.stack(driver.seen)[..., FACTOR_NAMES.index(name)]
        assert float(shown.std()) < 1e-6
    again = simulated_inputs(ConstantDriver(n_actions), env_cfg, errors, envs=6, steps=40, seed=3, first_episode=100)
    assert torch.equal(again.targets, sim.targets)


class CameraDriver(ConstantDriver):
    """A student's interface: acts on the camera frames (straight ahead at full throttle), records its resets."""

    def __init__(self, n_actions):
        super().__init__(n_actions)
        self.resets = []

    def act(self, obs):
        self.seen.append(obs["camera"][:, 0, 60:].float().mean((1, 2)))  # the lower half: the track ahead
        return torch.full((obs.batch_size[0], 1), self.n_actions - 1, dtype=torch.long)

    def reset(self, dones):
        self.resets.append(dones.bool().clone())


def test_simulated_worlds_driven_through_the_camera_reset_the_driver_where_each_episode_ends():
    from dataclasses import replace

    from envs.racing.env import RacingEnv

    env_cfg = EnvConfig(num_envs=3, camera="projective", compile=False)
    driver = CameraDriver(RacingEnv(replace(env_cfg, camera="none")).action_space.num_actions)
    sim = simulated_inputs(driver, env_cfg, None, envs=3, steps=45, seed=3, first_episode=7, camera=True)
    assert sim.inputs.shape == (135, 5) and int(sim.episode.min()) == 7
    assert len(driver.seen) == 45 and float(torch.stack(driver.seen).std()) > 1.0  # real frames, changing
    assert len(driver.resets) == 46 and bool(driver.resets[0].all())  # all cleared before the first frame
    ends = torch.stack(driver.resets[1:], 1)  # (envs, steps): the episode that ended at each step
    per_car = sim.episode.view(3, 45)
    assert torch.equal(ends[:, :-1], per_car[:, 1:] != per_car[:, :-1]) and bool(ends.any())  # full throttle crashes
    speed = sim.targets[:, VEHICLE_ESTIMATES.column("speed")]
    assert float(speed.max()) > 1.0


def test_simulated_worlds_with_exact_odometry_read_the_cameras_pose_change():
    from dataclasses import replace

    from adaptation.estimator_fit import normalize_velocities, normalized_motion
    from envs.racing.env import RacingEnv

    env_cfg = EnvConfig(num_envs=4, camera="none", compile=False)
    driver = ConstantDriver(RacingEnv(env_cfg).action_space.num_actions)

    def speeds(cfg):
        sim = simulated_inputs(driver, cfg, None, envs=6, steps=40, seed=3, first_episode=100)
        still = normalize_velocities(torch.zeros(1, 3))  # no frame before an episode's first: no motion
        assert torch.allclose(sim.inputs[sim.step == 0, 2:], still.expand(int((sim.step == 0).sum()), 3))
        k = MOTION_NAMES.index("speed")
        return sim, normalized_motion(sim.targets)[:, k], sim.inputs[:, 2 + k]

    # Without camera latency, the chord speed between two frames lies between the car's speeds at the two frames.
    rnd = replace(env_cfg.randomization, camera_latency=False, nominal_camera_latency_ms=0.0)
    sim, truth, odo = speeds(replace(env_cfg, randomization=rnd))
    after = torch.nonzero(sim.step > 0)[:, 0]
    lo, hi = torch.minimum(truth[after - 1], truth[after]), torch.maximum(truth[after - 1], truth[after])
    assert bool(((odo[after] >= lo - 1e-3) & (odo[after] <= hi + 1e-3)).all())
    assert float((odo[after] - truth[after]).abs().max()) > 0.01  # the chord, not the car's speed at the frame
    assert float((odo[after] - truth[after]).mean()) < 0.0  # cars accelerating from rest: it trails them
    # With the camera latency drawn per world it trails as well, and the same seed draws the same worlds.
    sim, truth, odo = speeds(env_cfg)
    late = sim.step > 0
    assert float((odo[late] - truth[late]).mean()) < 0.0
    again = simulated_inputs(ConstantDriver(driver.n_actions), env_cfg, None, envs=6, steps=40, seed=3,
                             first_episode=100)  # fmt: skip
    assert torch.equal(again.inputs, sim.inputs)
