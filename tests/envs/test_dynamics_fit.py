"""Dynamics calibration: the rollout's gradient, the latency search, recovery of a generated drive's parameters,
refusal of degenerate logs, and the calibrated config through --env-file into EnvConfig."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import pytest
import torch
import yaml

from envs.param_fit import ParamBox, adam_fit, block_bootstrap_weights
from envs.racing.calibrated_world import calibrated_sections
from envs.racing.calibration_drive import (
    DegenerateLogError,
    DriveLog,
    calibration_protocol,
    check_drive,
    drive_protocol,
    motion_from_poses,
)
from envs.racing.car import CarSpec
from envs.racing.config import EnvConfig
from envs.racing.dynamics_calibration import (
    PARAMS,
    DynamicsFit,
    DynamicsFitConfig,
    fit_dynamics,
    make_windows,
    rollout,
    window_losses,
)
from envs.racing.randomization import RandomizationConfig
from envs.racing.reality import RealityConfig, reality_env_config
from experiments import cli

HZ = 15.0


@dataclass(frozen=True)
class ScriptConfig:
    """A script config with an env (what --env-file goes over)."""

    env: EnvConfig = field(default_factory=lambda: EnvConfig(num_envs=2))


def sim_env(action_ms: float, camera_ms: float) -> EnvConfig:
    """The training sim with a car of known, non-nominal parameters (the ranges are single values)."""
    rnd = RandomizationConfig(
        friction_range=(0.9, 0.9), mass_range=(1.0, 1.0), motor_gain_range=(0.92, 0.92),
        steering_gain_range=(1.07, 1.07), steering_offset_deg=1.5, action_latency=False,
        nominal_action_latency_ms=action_ms, camera_latency=False, nominal_camera_latency_ms=camera_ms,
        action_noise=False,
    )  # fmt: skip
    return EnvConfig(num_envs=1, randomization=rnd)


def drive_log(env: EnvConfig, seed: int = 0) -> DriveLog:
    protocol = calibration_protocol(HZ)
    drive = drive_protocol(env, protocol, seed=seed)
    rows = np.arange(len(drive.time))
    return DriveLog(
        drive.time, drive.steering_deg, drive.speed, motion_from_poses(drive.camera_pose), "true camera pose",
        protocol.segment_of(rows), tuple(s[1] for s in protocol.segments), drive.truth,
    )  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The fit's batches are small: one thread, as experiments.calibrate runs it (more only contend on a busy CPU)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def sim_log() -> DriveLog:
    return drive_log(sim_env(50.0, 33.3), seed=3)


def physical(**values: float) -> torch.Tensor:
    spec = CarSpec()
    base = {"motor_gain": 1.0, "motor_time_constant": spec.motor_time_constant, "throttle_exponent": 1.0,
            "steering_gain": 1.0, "steering_offset_deg": 0.0, "steering_time_constant": spec.steering_time_constant,
            "friction": 1.0, "steering_deadband_deg": 0.0, "servo_slew": 0.0, "battery_sag_per_minute": 0.0,
            "cornering_stiffness": spec.cornering_stiffness, "max_accel": spec.max_accel, "max_brake": spec.max_brake,
            "turn_drag": 1.0, "steering_cubic": 0.0}  # fmt: skip
    base.update(values)
    return torch.tensor([[base[n] for n in PARAMS.names]], dtype=torch.float64)


def test_protocol_fits_in_two_minutes_and_covers_every_excitation():
    protocol = calibration_protocol(HZ)
    names = [s[1] for s in protocol.segments]
    assert protocol.seconds <= 120.0 and len(protocol.speed) == len(protocol.steering_deg)
    for needed in ("accelerations", "circles-fast", "steering-steps-1", "steering-steps-2", "small-steering"):
        assert needed in names
    assert protocol.steering_deg.max() == 30.0 and protocol.steering_deg.min() == -30.0


def test_rollout_loss_gradient_matches_finite_differences(sim_log):
    check = check_drive(sim_log, HZ)
    win = make_windows(sim_log, check.valid, burn_in=4, length=6)
    keep = torch.arange(0, len(win.start), 12)
    win = replace(win, start=win.start[keep], init_velocity=win.init_velocity[keep].double(),
                  motion=win.motion[keep].double(), segment=win.segment[keep], steer=win.steer.double(),
                  speed=win.speed.double())  # fmt: skip
    dt = 1.0 / HZ / 4
    smooth = [PARAMS.index(n) for n in ("motor_gain", "motor_time_constant", "throttle_exponent", "steering_gain",
                                        "steering_offset_deg", "steering_time_constant", "friction",
                                        "cornering_stiffness", "turn_drag", "steering_cubic")]  # fmt: skip
    x = physical(motor_gain=0.97, steering_gain=1.03, steering_offset_deg=0.7, throttle_exponent=1.1, friction=0.8,
                 cornering_stiffness=15.0, turn_drag=0.6, steering_cubic=0.05)  # fmt: skip
    latency = torch.tensor([3])

    def loss(values: torch.Tensor) -> torch.Tensor:
        return window_losses(rollout(values, latency, win, CarSpec(), 4, dt), win).mean()

    x.requires_grad_(True)
    loss(x).backward()
    for i in smooth:
        h = 1e-5 * max(1.0, abs(float(x[0, i].detach())))
        up, down = x.detach().clone(), x.detach().clone()
        up[0, i] += h
        down[0, i] -= h
        numeric = (loss(up) - loss(down)).item() / (2 * h)
        assert x.grad[0, i].item() == pytest.approx(numeric, rel=1e-4, abs=1e-6), PARAMS.names[i]


def test_integer_latency_search_finds_the_loop_latency(sim_log):
    """At the true parameters the loss over candidate loop latencies is lowest at action + camera latency."""
    check = check_drive(sim_log, HZ)
    win = make_windows(sim_log, check.valid, burn_in=6, length=15)
    dt = 1.0 / HZ / 4
    t = sim_log.truth
    x = physical(motor_gain=t["motor_gain"], steering_gain=t["steering_gain"],
                 steering_offset_deg=t["steering_offset_deg"], friction=t["friction"]).float()  # fmt: skip
    candidates = torch.arange(0, 13)
    with torch.no_grad():
        pred = rollout(x.repeat(len(candidates), 1), candidates, win, CarSpec(), 4, dt)
        loss = window_losses(pred, win).mean(1)
    assert int(loss.argmin()) * dt * 1000 == pytest.approx(t["loop_latency_ms"], abs=1.0)
    assert float(loss.min()) < 1e-3 < float(loss.sort().values[1])


def test_nominal_extra_terms_are_the_training_sim(sim_log):
    """At the nominal drivetrain and steering terms the fit's model is the training sim: the drive's own motion."""
    check = check_drive(sim_log, HZ)
    win = make_windows(sim_log, check.valid, burn_in=6, length=15)
    t = sim_log.truth
    x = physical(motor_gain=t["motor_gain"], steering_gain=t["steering_gain"],
                 steering_offset_deg=t["steering_offset_deg"], friction=t["friction"]).float()  # fmt: skip
    with torch.no_grad():
        loss = window_losses(rollout(x, torch.tensor([5]), win, CarSpec(), 4, 1.0 / HZ / 4), win)
    assert float(loss.mean()) < 1e-3


def test_tyre_and_drivetrain_terms_recovered_beside_the_gains(sim_log):
    """A drive whose motion is the fit's model with known tyre and drivetrain terms (stiffer tyres, lower
    acceleration limits, a drivetrain that holds its speed in turns, a steering that grows faster than linearly):
    Adam from the nominal car, gains and trim free beside them, finds them all (every sixth window, for time)."""
    check = check_drive(sim_log, HZ)
    win = make_windows(sim_log, check.valid, burn_in=6, length=15)
    keep = torch.arange(0, len(win.start), 6)
    win = replace(win, start=win.start[keep], init_velocity=win.init_velocity[keep], segment=win.segment[keep])
    dt, latency = 1.0 / HZ / 4, torch.tensor([5])
    known = {"motor_gain": 0.9, "steering_gain": 0.95, "steering_offset_deg": 1.0, "cornering_stiffness": 25.0,
             "max_accel": 3.2, "max_brake": 3.5, "turn_drag": 0.3, "steering_cubic": 0.08}  # fmt: skip
    with torch.no_grad():
        win = replace(win, motion=rollout(physical(**known).float(), latency, win, CarSpec(), 4, dt)[0])
    loss = lambda unit: window_losses(rollout(PARAMS.from_unit(unit), latency, win, CarSpec(), 4, dt), win).mean(1)  # noqa: E731
    free = [n in known for n in PARAMS.names]
    fit = PARAMS.from_unit(adam_fit(loss, PARAMS.to_unit(physical().float()), 100, lr=0.05, free=free).unit)[0]
    got = {n: float(fit[PARAMS.index(n)]) for n in known}
    assert got["motor_gain"] == pytest.approx(0.9, rel=0.01) and got["steering_gain"] == pytest.approx(0.95, rel=0.01)
    assert got["steering_offset_deg"] == pytest.approx(1.0, abs=0.1)
    assert got["turn_drag"] == pytest.approx(0.3, abs=0.1) and got["steering_cubic"] == pytest.approx(0.08, abs=0.02)
    assert got["max_accel"] == pytest.approx(3.2, rel=0.05) and got["max_brake"] == pytest.approx(3.5, rel=0.1)
    assert got["cornering_stiffness"] == pytest.approx(25.0, rel=0.2)


def test_adam_over_sets_and_bootstrap_weights():
    box = ParamBox(("a", "b"), (0.0, -1.0), (2.0, 1.0))
    target = box.to_unit(torch.tensor([1.5, -0.25]))
    result = adam_fit(lambda u: (u - target).square().sum(-1), torch.full((3, 2), 0.5), 300, lr=0.1)
    assert torch.allclose(box.from_unit(result.unit), torch.tensor([1.5, -0.25]).expand(3, 2), atol=1e-3)
    weights = block_bootstrap_weights(torch.tensor([0, 0, 1, 1, 2]), 4, torch.Generator().manual_seed(0))
    assert weights.shape == (4, 5) and torch.all(weights[:, 0] == weights[:, 1])
    assert torch.all(weights[:, [0, 2, 4]].sum(1) == 3)


def test_fit_recovers_a_generated_drive(sim_log):
    cfg = DynamicsFitConfig(max_latency_ms=150.0, bootstrap=3, adam_iterations=60, refine_iterations=40,
                            cma_generations=8, top_latencies=2)  # fmt: skip
    check = check_drive(sim_log, HZ)
    fit = fit_dynamics(sim_log, check, CarSpec(), HZ, cfg)
    t = sim_log.truth
    assert fit.converged and fit.residual < 0.2
    assert abs(fit.latency_ms - t["loop_latency_ms"]) <= 15.0
    assert fit.values["motor_gain"] == pytest.approx(t["motor_gain"], rel=0.05)
    assert fit.values["steering_gain"] == pytest.approx(t["steering_gain"], rel=0.05)
    assert abs(fit.values["steering_offset_deg"] - t["steering_offset_deg"]) <= 0.5
    assert set(fit.spread) == set(fit.identified) and "friction" in fit.identified


def test_fit_recovers_a_proxy_drive():
    """The reality proxy's dynamics (its actuation effects: deadband, slew rate, throttle map, latency jitter, trim,
    battery sag) on the bicycle car, at its finer physics step."""
    env = reality_env_config(EnvConfig(num_envs=1), RealityConfig(physics="bicycle"), part="dynamics")
    log = drive_log(replace(env, randomization=replace(env.randomization, action_noise=False)), seed=1)
    cfg = DynamicsFitConfig(max_latency_ms=150.0, bootstrap=3, adam_iterations=60, refine_iterations=40,
                            cma_generations=10, top_latencies=2)  # fmt: skip
    fit = fit_dynamics(log, check_drive(log, HZ), CarSpec(), HZ, cfg)
    t = log.truth
    assert abs(fit.latency_ms - t["loop_latency_ms"]) <= 15.0
    assert fit.values["motor_gain"] == pytest.approx(t["motor_gain"], rel=0.05)
    assert fit.values["steering_gain"] == pytest.approx(t["steering_gain"], rel=0.05)
    assert abs(fit.values["steering_offset_deg"] - t["steering_offset_deg"]) <= 0.5
    assert fit.values["throttle_exponent"] == pytest.approx(t["throttle_exponent"], abs=0.1)


def degenerate(log: DriveLog, **changes) -> DriveLog:
    return replace(log, **changes)


def test_degenerate_logs_are_refused_naming_what_is_missing(sim_log):
    n = len(sim_log.time)
    with pytest.raises(DegenerateLogError, match=r"10\.0 s long"):
        check_drive(degenerate(sim_log, time=sim_log.time[:150], steering_deg=sim_log.steering_deg[:150],
                               speed=sim_log.speed[:150], motion=sim_log.motion[:149]), HZ)  # fmt: skip
    with pytest.raises(DegenerateLogError, match="no steering variation"):
        check_drive(degenerate(sim_log, steering_deg=np.zeros(n)), HZ)
    with pytest.raises(DegenerateLogError, match="no speed variation"):
        check_drive(degenerate(sim_log, speed=np.full(n, 1.0)), HZ)
    backwards = sim_log.time.copy()
    backwards[400] = backwards[398]
    with pytest.raises(DegenerateLogError, match="not increasing"):
        check_drive(degenerate(sim_log, time=backwards), HZ)
    dropped = sim_log.time.copy()
    dropped[500:] += 2.0 / HZ
    check = check_drive(degenerate(sim_log, time=dropped), HZ)
    assert any("1 dropped frame" in f for f in check.flags) and not check.valid[499]
    check = check_drive(degenerate(sim_log, motion=sim_log.motion * [1.0, 1.0, 0.2]), HZ)  # no hard cornering
    assert not check.grip and any("grip not identifiable" in f for f in check.flags)
    spinning = sim_log.motion.copy()  # the fastest circle's first hold, its yaw rate jumping from frame to frame
    start = next(row for row, name, _ in calibration_protocol(HZ).segments if name == "circles-fast")
    spinning[start + 20 : start + 60, 2] += 0.03 * (-1.0) ** np.arange(40)
    check = check_drive(degenerate(sim_log, motion=spinning), HZ)
    assert not check.valid[start : start + 60].any() and check.valid[start + 60 : start + 120].all()
    assert any("slides irregularly" in f and f"rows {start}-{start + 60}" in f for f in check.flags)


def test_calibrated_config_round_trips_through_env_file(tmp_path):
    fit = DynamicsFit(
        values={"motor_gain": 0.93, "motor_time_constant": 0.25, "throttle_exponent": 1.2, "steering_gain": 1.05,
                "steering_offset_deg": 1.05, "steering_time_constant": 0.07, "friction": 0.9,
                "steering_deadband_deg": 1.0, "servo_slew": 1.0 / math.radians(360.0)},
        spread={"motor_gain": 0.004, "steering_gain": 0.006, "steering_offset_deg": 0.05, "friction": 0.02},
        identified=("motor_gain", "motor_time_constant", "throttle_exponent", "steering_gain", "steering_offset_deg",
                    "steering_time_constant", "friction", "steering_deadband_deg", "servo_slew"),
        latency_ms=83.3, latency_spread_ms=4.0, latency_profile={}, residual=0.1, segment_residuals={},
        converged=True, reasons=[], flags=[], seconds=1.0,
    )  # fmt: skip
    sections, _ = calibrated_sections(fit, camera_latency_ms=33.3, dt_physics=1.0 / 60.0)
    path = tmp_path / "calibrated.yaml"
    path.write_text(yaml.safe_dump({"optics": {"hfov_deg": 119.0}, **sections}, sort_keys=False))
    presets = {"default": ("", ScriptConfig())}
    env = cli.parse(presets, "", ["--env-file", str(path)]).env
    rnd = env.randomization
    assert env.optics.hfov_deg == 119.0 and env.car.motor_time_constant == 0.25
    assert rnd.motor_gain_range == pytest.approx((0.92, 0.94)) and rnd.nominal_action_latency_ms == 50.0
    assert rnd.action_latency_ms[0] < 50.0 < rnd.action_latency_ms[1] and not rnd.camera_latency
    assert env.effects.steering_offset_deg == pytest.approx(1.0) and env.effects.servo_rate_dps == pytest.approx(360)
    assert env.effects.throttle_exponent == 1.2 and env.effects.steering_deadband_deg == 1.0
    assert rnd.friction_range == pytest.approx((0.86, 0.94))
    assert not env.effects.randomize and env.effects.latency_jitter_ms == 0.0  # every env at the fitted effects


def test_calibrated_world_keeps_the_loop_latency_and_the_battery():
    """The written jitter's mean comes off the action latency (the log's loop latency holds it), and a battery that
    sagged during the log widens the motor gain's range downwards."""
    fit = DynamicsFit(
        values={"motor_gain": 0.8, "motor_time_constant": 0.2, "throttle_exponent": 1.0, "steering_gain": 1.0,
                "steering_offset_deg": 0.0, "steering_time_constant": 0.06, "friction": 1.0,
                "battery_sag_per_minute": 0.03},
        spread={"motor_gain": 0.002}, identified=("motor_gain", "battery_sag_per_minute"), latency_ms=150.0,
        latency_spread_ms=0.0, latency_profile={}, residual=0.1, segment_residuals={}, converged=True, reasons=[],
        flags=[], seconds=1.0,
    )  # fmt: skip
    dt = 1.0 / 60.0
    plain, _ = calibrated_sections(fit, camera_latency_ms=33.3, dt_physics=dt)
    jittered, notes = calibrated_sections(fit, camera_latency_ms=33.3, dt_physics=dt, jitter_ms=30.0)
    # 30 ms at 1/60-s substeps: 0, 1 or 2 substeps, 16.7 ms on average
    assert plain["randomization"]["nominal_action_latency_ms"] == pytest.approx(116.7, abs=0.05)
    assert jittered["randomization"]["nominal_action_latency_ms"] == pytest.approx(100.0, abs=0.05)
    assert jittered["effects"]["latency_jitter_ms"] == 30.0 and jittered["effects"]["randomize"] is False
    low, high = jittered["randomization"]["motor_gain_range"]
    assert low == pytest.approx(0.8 * 0.8) and high == pytest.approx(0.81)  # 10 minutes at 3%: down to the floor
    assert any("battery" in n for n in notes)
