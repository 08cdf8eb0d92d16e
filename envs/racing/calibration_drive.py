"""The calibration drive: a scripted command sequence that excites every dynamics parameter, a bench that drives it
in the sim (or the reality proxy's dynamics) off any track, and the checks a logged drive must pass before a fit.

The protocol (under 2 minutes at 15 Hz, on an open floor about 5 m across): straight accelerations to three speeds
and back to rest (motor gain, throttle map, drivetrain lag), straight driving with small steering commands either
side (trim, deadband), steady circles both ways at two steering angles and three speeds (steering gain, grip at the
fastest), steering steps at two speeds (latency, servo lag and slew rate), a steering sweep of rising frequency
(latency), and the accelerations again (a battery that sags over the drive shows as a drop between the two).

The bench applies the env's actuation chain (`RacingEnv.step`): the actuation effects' command map, the battery gain,
the action delay line (with jitter), the servo slew rate, then the physics backend's substeps; the camera delay line
gives the pose each frame was taken from. Nothing here knows about tracks: the car drives on an open floor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import torch

from envs.errors import GapbridgeError
from envs.racing.config import EnvConfig
from envs.racing.effects import ActuatorEffects, DelayLine, jitter_steps, mean_jitter_ms
from envs.racing.randomization import sample_world

IRREGULAR_YAW_RATE = 0.2
"""mean frame-to-frame change of the yaw rate (rad/s) in a held command's steady part above which the car slides
irregularly (beyond its grip limit, spinning and catching): no smooth model follows that frame by frame"""


class DegenerateLogError(GapbridgeError, ValueError):
    """A logged drive cannot identify the dynamics: too short, no variation, broken timestamps."""


@dataclass(frozen=True)
class Protocol:
    """A scripted drive: per control step the commanded steering (degrees, + left) and speed (m/s), and the segments
    (first step, name, what the driver does)."""

    steering_deg: np.ndarray  # (T,)
    speed: np.ndarray  # (T,)
    segments: tuple[tuple[int, str, str], ...]
    control_hz: float

    @property
    def seconds(self) -> float:
        return len(self.speed) / self.control_hz

    def segment_of(self, rows: np.ndarray) -> np.ndarray:
        """Index into `segments` of each control step in `rows`."""
        starts = np.array([s[0] for s in self.segments])
        return np.searchsorted(starts, rows, side="right") - 1


def calibration_protocol(control_hz: float = 15.0) -> Protocol:
    """The calibration drive of the module docstring, at `control_hz`."""
    steer: list[np.ndarray] = []
    speed: list[np.ndarray] = []
    segments: list[tuple[int, str, str]] = []
    rows = lambda seconds: max(1, int(round(seconds * control_hz)))  # noqa: E731

    def hold(seconds: float, steer_deg: float, v: float) -> None:
        n = rows(seconds)
        steer.append(np.full(n, steer_deg))
        speed.append(np.full(n, v))

    def segment(name: str, text: str) -> None:
        segments.append((sum(len(s) for s in speed), name, text))

    segment("rest", "stand still")
    hold(1.0, 0.0, 0.0)
    for tag in ("accelerations", "accelerations-again"):
        if tag == "accelerations-again":
            segment(tag, "the straight accelerations again")
        else:
            segment(tag, "straight: 0.8, 1.6 and 2.4 m/s for 2 s each, stopping in between")
        for v in (0.8, 1.6, 2.4):
            hold(2.0, 0.0, v)
            hold(1.5, 0.0, 0.0)
        if tag == "accelerations":
            segment("small-steering", "straight at 1.2 m/s, steering 0, ±0.25, ±0.5, ±0.75, ±1, ±1.5, ±2, ±3 degrees "
                    "for 0.6 s each")  # fmt: skip
            hold(1.0, 0.0, 1.2)
            for a in (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0):
                hold(0.6, a, 1.2)
                hold(0.6, -a, 1.2)
            hold(0.8, 0.0, 1.2)
            hold(1.0, 0.0, 0.0)
            for steer_deg, v, name in ((15.0, 1.0, "circles-slow"), (30.0, 1.5, "circles-tight"),
                                       (30.0, 2.2, "circles-fast")):  # fmt: skip
                segment(name, f"steady circles at {steer_deg:.0f} degrees, {v} m/s: 4 s left, 4 s right")
                hold(4.0, steer_deg, v)
                hold(4.0, -steer_deg, v)
                hold(1.0, 0.0, 0.0)
            for v in (1.0, 2.0):
                segment(f"steering-steps-{v:.0f}", f"at {v} m/s: steering 0, +15, 0, -15, +25, -25, +8, -8 degrees")
                hold(1.0, 0.0, v)
                for a in (15.0, 0.0, -15.0, 25.0, -25.0, 8.0, -8.0):
                    hold(0.7, a, v)
                hold(0.7, 0.0, v)
                hold(1.0, 0.0, 0.0)
            segment("sweep", "at 1.5 m/s: steering ±15 degrees, left-right ever faster (0.3 to 2 Hz) for 10 s")
            n = rows(10.0)
            t = np.arange(n) / control_hz
            phase = 2 * math.pi * (0.3 * t + 0.5 * (2.0 - 0.3) / 10.0 * t**2)
            steer.append(15.0 * np.sin(phase))
            speed.append(np.full(n, 1.5))
            hold(1.0, 0.0, 0.0)
    segment("rest-end", "stand still")
    hold(1.0, 0.0, 0.0)
    return Protocol(np.concatenate(steer), np.concatenate(speed), tuple(segments), control_hz)


@dataclass
class DriveLog:
    """What the fit reads from a logged drive: per row the timestamp (s), commanded steering (deg) and speed (m/s);
    per row transition the measured motion `(T-1, 3)` (forward, left, yaw change; nan where unknown); the segment
    of each row (`segment_names`) and, for a generated drive, the true parameters."""

    time: np.ndarray
    steering_deg: np.ndarray
    speed: np.ndarray
    motion: np.ndarray
    motion_source: str
    segment: np.ndarray
    segment_names: tuple[str, ...]
    truth: dict[str, float] | None = None


@dataclass
class BenchDrive:
    """A protocol driven on the bench: per row the timestamp (s), commanded steering (deg) and speed (m/s), the pose
    `(T, 3)` (x, y, yaw) the camera frame of that row was taken from, and the true parameters."""

    time: np.ndarray
    steering_deg: np.ndarray
    speed: np.ndarray
    camera_pose: np.ndarray
    truth: dict[str, float]


def true_parameters(cfg: EnvConfig, world, effects_cfg) -> dict[str, float]:
    """The drive's parameters in the fit's terms (trim: the wheel-angle offset, gain times the effects' command-space
    trim plus the car's own; loop latency: action plus camera latency plus the mean jitter)."""
    p = world.params
    ms = 1000.0 * cfg.dt_physics
    gain = float(p.steering_gain[0])
    trim = float(p.steering_offset[0]) + gain * math.radians(effects_cfg.steering_offset_deg)
    action, camera = float(world.action_latency[0]) * ms, float(world.camera_latency[0]) * ms
    return {
        "motor_gain": float(p.motor_gain[0]), "steering_gain": gain, "steering_offset_deg": math.degrees(trim),
        "motor_time_constant": cfg.car.motor_time_constant, "steering_time_constant": cfg.car.steering_time_constant,
        "throttle_exponent": effects_cfg.throttle_exponent, "friction": float(p.friction[0]),
        "steering_deadband_deg": effects_cfg.steering_deadband_deg, "servo_rate_dps": effects_cfg.servo_rate_dps,
        "action_latency_ms": action, "camera_latency_ms": camera,
        "loop_latency_ms": action + camera + mean_jitter_ms(effects_cfg.latency_jitter_ms, cfg.dt_physics),
        "battery_sag_per_minute": effects_cfg.battery_sag_per_minute,
    }  # fmt: skip


@torch.no_grad()
def drive_protocol(cfg: EnvConfig, protocol: Protocol, seed: int = 0) -> BenchDrive:
    """Drive `protocol` with the dynamics of `cfg` (one car, parameters drawn by its randomization with `seed`, no
    action noise) on an open floor; the camera pose of each row as its frame would show it."""
    from envs.racing.env import make_physics  # the env module pulls in the track and observation code

    cfg = replace(cfg, num_envs=1, control_hz=protocol.control_hz, compile=False)
    device = torch.device("cpu")
    gen = torch.Generator().manual_seed(seed)
    world = sample_world(cfg.randomization, 1, cfg.dt_physics, gen, device)
    physics = make_physics(cfg, device)
    ids = torch.zeros(1, dtype=torch.long)
    zero = torch.zeros(1)
    physics.set_params(world.params, ids)
    physics.reset(ids, zero, zero, zero, zero)
    effects = None
    if cfg.effects.active:
        effects = ActuatorEffects(cfg.effects, 1, cfg.dt_physics, cfg.car.max_speed, device)
        effects.reset(ids, gen)
    jitter = jitter_steps(cfg.effects.latency_jitter_ms, cfg.dt_physics)
    capacity = int(world.action_latency.max()) + int(world.camera_latency.max()) + jitter + 2
    action_delay, pose_delay = DelayLine(1, 2, capacity), DelayLine(1, 3, capacity)
    pose_delay.fill(physics.pose(), ids)
    poses = np.zeros((len(protocol.speed), 3))
    for k, (steer_deg, v) in enumerate(zip(protocol.steering_deg, protocol.speed, strict=True)):
        poses[k] = pose_delay.read(world.camera_latency)[0].numpy()
        steer, speed = torch.tensor([math.radians(steer_deg)]), torch.tensor([float(v)])
        latency = world.action_latency
        if effects is not None:
            steer, speed = effects.command(steer, speed)
            speed = speed * effects.battery_gain()
            latency = effects.latency(latency, gen)
        command = torch.stack([steer, speed], -1)
        for _ in range(cfg.substeps):
            action_delay.push(command)
            delayed = action_delay.read(latency)
            steer_now = delayed[:, 0] if effects is None else effects.servo(delayed[:, 0])
            physics.advance(steer_now, delayed[:, 1])
            pose_delay.push(physics.pose())
    time = np.arange(len(protocol.speed)) / protocol.control_hz
    truth = true_parameters(cfg, world, cfg.effects)
    return BenchDrive(time, protocol.steering_deg.copy(), protocol.speed.copy(), poses, truth)


def motion_from_poses(poses: np.ndarray) -> np.ndarray:
    """Frame poses `(T, 3)` -> frame-to-frame motions `(T-1, 3)`: forward and left displacement in the earlier
    frame's pose and the wrapped yaw change (the planar odometry's convention)."""
    d = poses[1:, :2] - poses[:-1, :2]
    c, s = np.cos(poses[:-1, 2]), np.sin(poses[:-1, 2])
    dyaw = np.remainder(poses[1:, 2] - poses[:-1, 2] + np.pi, 2 * np.pi) - np.pi
    return np.stack([c * d[:, 0] + s * d[:, 1], -s * d[:, 0] + c * d[:, 1], dyaw], -1)


@dataclass(frozen=True)
class DriveCheck:
    """What a logged drive allows: the transitions to use `(T-1,)`, and which parameter groups it identifies."""

    valid: np.ndarray
    grip: bool
    deadband: bool
    slew: bool
    flags: tuple[str, ...]


def check_drive(log: DriveLog, control_hz: float, min_seconds: float = 30.0) -> DriveCheck:
    """Refuse a log that cannot identify the dynamics (`DegenerateLogError` naming what is missing); flag what it
    identifies only in part (dropped frames left out; no grip, deadband or slew-rate excitation)."""
    n = len(log.time)
    period = 1.0 / control_hz
    if n < 2 or not np.all(np.isfinite(log.time)):
        raise DegenerateLogError(f"the log has {n} rows or non-finite timestamps: nothing to fit")
    gaps = np.diff(log.time)
    if (gaps <= 0).any():
        row = int(np.argmax(gaps <= 0)) + 1
        raise DegenerateLogError(f"timestamps are not increasing (row {row}: {log.time[row - 1]:.3f} s then "
                                 f"{log.time[row]:.3f} s): the log is corrupt or two logs were joined")  # fmt: skip
    median = float(np.median(gaps))
    if abs(median - period) > 0.2 * period:
        raise DegenerateLogError(
            f"frames come every {1000 * median:.1f} ms, the fit expects {control_hz:g} Hz ({1000 * period:.1f} ms): "
            "set the control rate of the log"
        )
    seconds = log.time[-1] - log.time[0] + period
    if seconds < min_seconds:
        raise DegenerateLogError(
            f"the log is {seconds:.1f} s long, the fit needs at least {min_seconds:g} s (drive the calibration "
            "protocol: experiments.run_car proxy --protocol calibration)"
        )
    steer, speed = np.asarray(log.steering_deg), np.asarray(log.speed)
    if np.ptp(steer) < 5.0 or np.std(steer) < 1.0:
        raise DegenerateLogError(
            f"no steering variation (commands between {steer.min():.1f} and {steer.max():.1f} degrees): steering "
            "gain, trim, servo lag and latency not identifiable"
        )
    if np.ptp(speed) < 0.5:
        raise DegenerateLogError(
            f"no speed variation (commands between {speed.min():.2f} and {speed.max():.2f} m/s): motor gain, "
            "throttle map and drivetrain lag not identifiable"
        )
    dropped = gaps > 1.5 * period
    valid = ~dropped & np.isfinite(log.motion).all(-1)
    flags = []
    irregular = _irregular_holds(steer, speed, np.nan_to_num(log.motion[:, 2]) / period, control_hz)
    for a, b, _ in irregular:
        valid[a:b] = False
    if irregular:
        shown = ", ".join(f"rows {a}-{b} ({change:.2f} rad/s)" for a, b, change in irregular)
        flags.append(f"{len(irregular)} held command(s) where the car slides irregularly, its yaw rate changing by "
                     f"more than {IRREGULAR_YAW_RATE} rad/s from frame to frame (beyond its grip limit): {shown}; "
                     "left out of the fit")  # fmt: skip
    if dropped.any():
        rows = np.nonzero(dropped)[0] + 1
        shown = ", ".join(str(r) for r in rows[:5]) + (" ..." if len(rows) > 5 else "")
        flags.append(f"{len(rows)} dropped frame(s) (gaps before rows {shown}): windows across them are left out")
        if dropped.mean() > 0.1:
            raise DegenerateLogError(f"{dropped.mean():.0%} of the frames were dropped: too many to fit")
    unknown = ~np.isfinite(log.motion).all(-1)
    if unknown.mean() > 0.3:
        raise DegenerateLogError(f"the motion is unknown for {unknown.mean():.0%} of the frames (odometry lost)")

    velocity = np.nan_to_num(log.motion) / period
    v_fwd, lateral_accel = velocity[:, 0], np.abs(velocity[:, 0] * velocity[:, 2])
    held = _held(np.abs(steer[:-1]) >= 10.0, int(round(control_hz)))
    fast = held & (v_fwd > 1.0) & valid
    grip = bool(fast.any() and lateral_accel[fast].max() >= 0.5 * 9.81) and not irregular
    if irregular:
        flags.append("the car slid beyond its grip limit in a held circle: grip not identifiable, friction kept at "
                     "nominal and not written")  # fmt: skip
    elif not grip:
        best = lateral_accel[fast].max() if fast.any() else 0.0
        flags.append(f"no steady circle at > 1 m/s reaching 0.5 g (best {best / 9.81:.2f} g): grip not identifiable, "
                     "friction kept at nominal and not written")  # fmt: skip
    small = (np.abs(steer) > 0.2) & (np.abs(steer) < 3.0) & (speed > 0.5)
    deadband = bool(small.sum() >= control_hz)
    if not deadband:
        flags.append("no small steering commands (0.2 to 3 degrees) while moving: deadband not identifiable")
    slew = bool((np.abs(np.diff(steer)) >= 10.0).sum() >= 4)
    if not slew:
        flags.append("fewer than 4 steering steps of >= 10 degrees: servo slew rate not identifiable")
    return DriveCheck(valid, grip, deadband, slew, tuple(flags))


def _irregular_holds(
    steer: np.ndarray, speed: np.ndarray, yaw_rate: np.ndarray, control_hz: float
) -> list[tuple[int, int, float]]:
    """Commands held for at least 2 s whose steady part (after the first 2/3 s) shows the yaw rate `(T-1,)` jumping
    from frame to frame by more than IRREGULAR_YAW_RATE on average: (first row, end row, mean change) of each."""
    out, n, start = [], len(yaw_rate), 0
    settle, shortest = int(round(control_hz * 2 / 3)), int(round(2 * control_hz))
    for k in range(1, n + 1):
        if k < n and steer[k] == steer[start] and speed[k] == speed[start]:
            continue
        if k - start >= shortest:
            change = float(np.abs(np.diff(yaw_rate[start + settle : k])).mean())
            if change > IRREGULAR_YAW_RATE:
                out.append((start, k, change))
        start = k
    return out


def _held(mask: np.ndarray, rows: int) -> np.ndarray:
    """Rows of `mask` inside a run of at least `rows` consecutive True, after its first `rows` (steady, not
    transient)."""
    out = np.zeros_like(mask)
    run = 0
    for i, m in enumerate(mask):
        run = run + 1 if m else 0
        out[i] = run > rows
    return out
