"""The two-arm reality proxy: the actuation effects and the look by hand (pure tensors), the config's refusals, variants
and parts (training untouched, dynamics and perception split cleanly), then one Genesis env built from the proxy."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from envs.bimanual.actuation import backlash, deadband, dropped, hold_dropped, jittered_delay, wrist_element
from envs.bimanual.camera import RaycastCamera
from envs.bimanual.config import BimanualConfig, EffectsConfig, ObservationConfig, exact_sensors
from envs.bimanual.control import ActionDelay
from envs.bimanual.handover import HandoverConfig
from envs.bimanual.look import (
    CAMERA_LOOKAT,
    CAMERA_POS,
    CAMERA_UP,
    CameraLook,
    LookJitter,
    camera_pose,
    distort,
    lens_grid,
    sensor_noise,
)
from envs.bimanual.reality import VARIANTS, ArmRealityConfig, reality_env_config
from envs.bimanual.scene import ARM_TORQUE, joint_torque_limits
from envs.errors import ConfigError
from tests.envs.test_bimanual_camera import toy_geometry, toy_poses


# ------------------------------------------------------------------------------------------------- actuation
def test_backlash_and_deadband_by_hand():
    out = torch.tensor(0.0)
    steps = []
    for command in (0.05, 0.3, 0.25, 0.0):  # within the play, out past it, a reversal within it, back through it
        out = backlash(torch.tensor(command), out, 0.2)
        steps.append(round(out.item(), 6))
    assert steps == [0.0, 0.2, 0.2, 0.1]
    held = deadband(torch.tensor([0.05, 0.15, -0.12]), torch.zeros(3), 0.1)
    assert held.tolist() == pytest.approx([0.0, 0.15, -0.12])
    x, y = torch.randn(5), torch.randn(5)
    assert torch.equal(wrist_element(x, y, 0.0, 0.0), x), "zero play and band: the command itself"
    # play then band: a 0.05 overshoot past the play is under a 0.1 band, so the target holds
    assert wrist_element(torch.tensor(0.15), torch.tensor(0.0), 0.2, 0.1).item() == 0.0
    assert wrist_element(torch.tensor(0.35), torch.tensor(0.0), 0.2, 0.1).item() == pytest.approx(0.25)


def test_jitter_keeps_the_newest_arrived_command_and_none_is_the_plain_delay():
    delay = ActionDelay(num_envs=1, width=1, max_delay=3)
    delay.fill(torch.zeros(1, 1), torch.arange(1))
    got = [delay.push(torch.full((1, 1), float(t + 1)), torch.tensor([e]))[0, 0].item()
           for t, e in enumerate([2, 0, 2, 1, 0])]  # fmt: skip
    # command 1 arrives at step 3, after command 2 (step 2): never applied; 3 and 4 wait until step 5 with 5
    assert got == [0.0, 2.0, 2.0, 2.0, 5.0]
    plain, zero = ActionDelay(3, 1, 2), ActionDelay(3, 1, 2)
    for d in (plain, zero):
        d.set_delay(torch.tensor([0, 1, 2]), torch.arange(3))
        d.fill(torch.zeros(3, 1), torch.arange(3))
    for t in range(5):
        c = torch.full((3, 1), float(t + 1))
        assert torch.equal(plain.push(c), zero.push(c, torch.zeros(3, dtype=torch.long)))
    g = torch.Generator().manual_seed(0)
    drawn = jittered_delay(torch.full((4000,), 3), 2, g)
    assert set(drawn.unique().tolist()) == {3, 4, 5}
    state = g.get_state()
    assert torch.equal(jittered_delay(torch.full((4,), 3), 0, g), torch.full((4,), 3))
    assert not dropped(4, 0.0, g).any() and torch.equal(g.get_state(), state), "off: no random numbers drawn"


def test_dropped_commands_hold_the_previous_one():
    g = torch.Generator().manual_seed(1)
    rate = dropped(8000, 0.25, g).float().mean().item()
    assert rate == pytest.approx(0.25, abs=0.02)
    new, old = torch.ones(3, 2), torch.zeros(3, 2)
    out = hold_dropped(new, old, torch.tensor([False, True, False]))
    assert out.tolist() == [[1.0, 1.0], [0.0, 0.0], [1.0, 1.0]]


def test_wrist_torque_limits_by_hand():
    assert joint_torque_limits(0.5).tolist() == [87.0, 87.0, 87.0, 87.0, 6.0, 6.0, 6.0]
    assert torch.equal(joint_torque_limits(), torch.tensor(ARM_TORQUE))


# ------------------------------------------------------------------------------------------------------ look
def test_lens_and_sensor_noise():
    img = torch.zeros(1, 1, 32, 32, dtype=torch.uint8)
    yy, xx = torch.meshgrid(torch.arange(32), torch.arange(32), indexing="ij")
    img[0, 0][((yy - 15.5) ** 2 + (xx - 15.5) ** 2) < 64] = 200  # a disc of radius 8 pixels
    assert torch.equal(distort(img, lens_grid(32, 0.0)), img), "no distortion: the same frame"
    barrel, pincushion = distort(img, lens_grid(32, -0.3)), distort(img, lens_grid(32, 0.3))
    lit = lambda x: int((x > 100).sum())  # noqa: E731
    assert lit(barrel) < lit(img) < lit(pincushion), "barrel pulls the disc toward the centre"
    grey = torch.full((2, 1, 64, 64), 128, dtype=torch.uint8)
    a = sensor_noise(grey, 4.0, torch.Generator().manual_seed(2))
    assert torch.equal(a, sensor_noise(grey, 4.0, torch.Generator().manual_seed(2))), "seeded"
    assert (a.float() - 128).std().item() == pytest.approx(4.0, rel=0.1)
    dark = sensor_noise(torch.zeros(1, 1, 8, 8, dtype=torch.uint8), 10.0, torch.Generator().manual_seed(3))
    assert dark.dtype == torch.uint8 and dark.min() == 0


def test_the_training_look_renders_as_before_and_each_change_shows():
    pos, quat = toy_poses(3)
    plain = RaycastCamera(toy_geometry(), 32)
    assert torch.equal(RaycastCamera(toy_geometry(), 32, look=CameraLook()).render(pos, quat), plain.render(pos, quat))
    assert camera_pose(CameraLook()) == (CAMERA_POS, CAMERA_LOOKAT, CAMERA_UP)
    frame = plain.render(pos, quat)
    for change in (dict(camera_shift=(0.02, 0.0, 0.0)), dict(camera_rotation_deg=(1.0, 0.0, 0.0)),
                   dict(light=(0.9, -0.1, 0.5)), dict(light_intensity=1.5), dict(ambient=0.5), dict(background=0.3),
                   dict(table_texture=0.3), dict(clutter=4)):  # fmt: skip
        cam = RaycastCamera(toy_geometry(), 32, look=CameraLook(**change))
        assert not torch.equal(cam.render(pos, quat), frame), change
    cluttered = RaycastCamera(toy_geometry(), 32, look=CameraLook(clutter=4))
    assert torch.equal(cluttered.render_links(pos, quat), plain.render_links(pos, quat)), "clutter is no link"
    p, look, up = camera_pose(CameraLook(camera_shift=(0.01, 0.0, 0.0), camera_rotation_deg=(2.0, -1.0, 3.0)))
    view = torch.tensor(look) - torch.tensor(p)
    nominal = torch.tensor(CAMERA_LOOKAT) - torch.tensor(CAMERA_POS)
    assert view.norm().item() == pytest.approx(nominal.norm().item(), rel=1e-6)
    assert abs(float(view @ torch.tensor(up))) < 1e-6, "up stays square to the view"
    turned = math.degrees(math.acos(float(view @ nominal / (view.norm() * nominal.norm()))))
    assert 1.5 < turned < 2.5


# ------------------------------------------------------------------------------------------------ the config
@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: ArmRealityConfig(variant="moon"), "reality.variant"),  # type: ignore[arg-type]
        (lambda: ArmRealityConfig(wrist_torque_scale=0.1), "reality.wrist_torque_scale"),
        (lambda: ArmRealityConfig(drop_prob=0.7), "reality.drop_prob"),
        (lambda: ArmRealityConfig(arm_gain=(1.0, 5.0)), r"reality.arm_gain\[1\]"),
        (lambda: ArmRealityConfig(renderer="pyrender"), "reality.renderer"),  # type: ignore[arg-type]
        (lambda: CameraLook(noise=-1.0), "look.noise"),
        (lambda: CameraLook(camera_rotation_deg=(0.0, 30.0, 0.0)), r"look.camera_rotation_deg\[1\]"),
        (lambda: EffectsConfig(drop_prob=1.0), "effects.drop_prob"),
        (lambda: BimanualConfig(effects=EffectsConfig(latency_jitter=5)), "effects.latency_jitter"),
        (lambda: reality_env_config(BimanualConfig(), ArmRealityConfig(dt=0.003)), "reality.dt"),
        (lambda: reality_env_config(BimanualConfig(), ArmRealityConfig(), part="half"), "part"),
        (lambda: reality_env_config(HandoverConfig(), ArmRealityConfig(com_shift=2.0)), "randomization.com_shift"),
    ],
)
def test_out_of_range_settings_are_refused_naming_the_field(make, field):
    with pytest.raises(ConfigError, match=field):
        make()


def test_variants_resolve_and_an_explicit_flag_wins():
    for name, values in VARIANTS.items():
        cfg = ArmRealityConfig(variant=name).resolved()  # type: ignore[arg-type]
        for key, value in values.items():
            obj = cfg
            for part in key.split("."):
                obj = getattr(obj, part)
            assert obj == value, (name, key)
        for base in (BimanualConfig(), HandoverConfig()):
            for part in ("all", "dynamics", "perception", "none"):
                reality_env_config(base, cfg, part)
    mine = ArmRealityConfig(variant="laggy", drop_prob=0.05).resolved()
    assert mine.drop_prob == 0.05 and mine.action_latency_ms == VARIANTS["laggy"]["action_latency_ms"]


def test_the_reality_config_round_trips_through_the_cli():
    from experiments.cli import parse

    presets = {"default": ("proxy", ArmRealityConfig())}
    cfg = parse(presets, "", ["default", "--variant", "worn-wrist", "--arm-gain", "0.8", "1.0", "--look.noise", "5",
                              "--look.clutter", "6"])  # fmt: skip
    assert cfg.variant == "worn-wrist" and cfg.arm_gain == (0.8, 1.0) and cfg.look.noise == 5.0
    assert cfg.resolved().wrist_torque_scale == VARIANTS["worn-wrist"]["wrist_torque_scale"]
    with pytest.raises(SystemExit):
        parse(presets, "", ["default", "--variant", "moon"])


def camera_config(cls):
    cfg = cls()
    return replace(cfg, observations=replace(cfg.observations, camera=True))


@pytest.mark.parametrize("cls", [BimanualConfig, HandoverConfig])
def test_parts_split_cleanly_and_training_is_untouched(cls):
    base = camera_config(cls)
    assert cls().effects == EffectsConfig() and ObservationConfig().look == CameraLook(), "training: all off"
    reality = ArmRealityConfig()
    every = {p: reality_env_config(base, reality, p) for p in ("all", "dynamics", "perception", "none")}
    for cfg in every.values():
        assert cfg.control_dt == pytest.approx(base.control_dt) and cfg.max_episode_length == base.max_episode_length
        assert (cfg.randomization.object_xy, cfg.randomization.object_yaw) == (
            base.randomization.object_xy, base.randomization.object_yaw)  # fmt: skip
    rnd = base.randomization
    for name in ("all", "dynamics"):  # the proxy's physics, actuation, base and object
        cfg = every[name]
        assert (cfg.dt, cfg.decimation) == (reality.dt, 10) and cfg.effects.wrist_torque_scale == 0.8
        assert cfg.effects.latency_jitter == 2 and cfg.randomization.action_latency == (3, 3)
        assert cfg.randomization.friction == (0.6, 0.6) and cfg.randomization.gain_scale == (1.0, 1.0)
        assert cfg.randomization.com_shift[0] == pytest.approx(1.25 * rnd.com_shift[1])
    for name in ("perception", "none"):  # the training dynamics at nominal values
        cfg = every[name]
        assert (cfg.dt, cfg.decimation, cfg.effects) == (base.dt, base.decimation, EffectsConfig())
        middle = tuple(0.5 * sum(rnd.object_mass) for _ in range(2))
        assert cfg.randomization.object_mass == pytest.approx(middle) and cfg.randomization.action_latency == (0, 0)
    for name in ("dynamics", "none"):  # the training look; every part reads its wrench estimate at the true scale
        obs = every[name].observations
        assert obs == exact_sensors(base.observations) and base.observations.wrench_gain != (1.0, 1.0)
        assert obs.look_jitter == LookJitter() != base.observations.look_jitter, "one look, never jittered"
        assert every[name].randomization.camera_latency == (0, 0)
    assert all(cfg.observations.wrench_gain == (1.0, 1.0) for cfg in every.values())
    assert all(cfg.observations.look_jitter == LookJitter() for cfg in every.values())
    for name in ("all", "perception"):
        obs = every[name].observations
        assert obs.look == reality.look and obs.camera_renderer == "raycast" and obs.look != CameraLook()
    rendered = reality_env_config(base, ArmRealityConfig(variant="rasterized"), "perception")
    assert rendered.observations.camera_renderer == "genesis"
    blind = reality_env_config(cls(), reality, "perception")  # no camera: nothing to perceive
    assert blind.observations == exact_sensors(cls().observations)


def test_both_arm_tasks_register_the_proxy():
    from envs.bimanual.env import scene_config
    from envs.task import get_task

    for name in ("bimanual-lift", "bimanual-handover"):
        assert get_task(name).reality_env_config is reality_env_config
    scene = scene_config(BimanualConfig(), "bar", (0.3, 0.04, 0.04))
    assert (scene.contact_timeconst, scene.arm_base_shift, scene.wrist_torque_scale) == (0.0, (0.0, 0.0, 0.0), 1.0)
    assert scene.look == CameraLook()


# --------------------------------------------------------------------------------------------- Genesis env
N = 4


@pytest.fixture(scope="module")
def proxy_env():
    from envs.bimanual.env import BimanualEnv

    base = replace(camera_config(BimanualConfig), num_envs=N, seed=3)
    base = replace(base, observations=replace(base.observations, camera_res=32))
    env = BimanualEnv(reality_env_config(base, ArmRealityConfig()))
    yield env
    env.close()


@pytest.mark.genesis
def test_the_proxy_env_realizes_its_world(proxy_env):
    env, bs = proxy_env, proxy_env.bs
    low, high = bs.arms[0].get_dofs_force_range(bs.arm_dofs)
    assert torch.allclose(high[0], joint_torque_limits(0.8)) and torch.allclose(low, -high)
    assert torch.allclose(env.gain[:, 1], torch.tensor(0.85)) and torch.allclose(bs.friction(), torch.tensor(0.6))
    assert torch.allclose(bs.object_com_shift()[:, 0], torch.tensor(0.025), atol=1e-6)
    assert env.factor_values()["action_latency"][0].item() == pytest.approx(1.5), "3 steps of 5 ms, in 10 ms units"
    # arm 1 truly stands 6 mm out and 5 mm aside; its controller reads its TCP from the believed base: a mirror of arm 0
    assert torch.allclose(bs.arms[1].get_pos()[0], torch.tensor([0.706, -0.005, 0.0]), atol=1e-6)
    env.reset()
    tcp = env.ctrl.poses().pos
    assert torch.allclose(tcp[:, 1], tcp[:, 0] * torch.tensor([-1.0, -1.0, 1.0]), atol=1e-4)
    # the camera: the proxy's look differs from training's frame of the same state, and its noise differs per frame
    from envs.bimanual.camera import scene_geometry

    training = RaycastCamera(scene_geometry(bs), 32).render(bs.solver.get_links_pos(), bs.solver.get_links_quat())
    frame = bs.render_gray(env.generator)
    assert frame.shape == training.shape and (frame != training).float().mean() > 0.2
    assert not torch.equal(frame, bs.render_gray(env.generator))
    # the scripted expert drives through the effects (jitter, drops, backlash, the payload) without a failed step
    from envs.bimanual.expert import ScriptedExpert

    expert, obs = ScriptedExpert(env), env.get_observations()
    for _ in range(40):
        obs, _, _, extras = env.step(expert.act(obs))
        assert not extras["error_envs"].any()
    assert obs["camera"].shape == (N, 1, 32, 32) and torch.isfinite(obs["proprio"]).all()
