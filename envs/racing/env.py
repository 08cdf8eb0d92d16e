"""`RacingEnv`: the batched DeepRacer-style env with rsl_rl's VecEnv contract and four observation groups.

One env serves every consumer (ManiSkill's obs_mode idea): `teacher` (privileged ground truth), `env_factors` (the
randomized world, normalized), `camera` (what the car's camera delivers, after latency) and `proprio` (what the real
car knows about itself). One action per 15 Hz camera frame; physics substeps inside; latencies are ring buffers in
substeps. Episodes auto-reset inside `step`; `extras["time_outs"]` marks truncation and `extras["log"]` carries
per-episode metrics of the envs that finished this step.
"""

from __future__ import annotations

import math
import time

import torch
from tensordict import TensorDict
from torch import Tensor

from envs.errors import ConfigError
from envs.jit import maybe_compile
from envs.racing.builtin_tracks import load_track
from envs.racing.camera import make_camera
from envs.racing.car import Calibration, load_action_space
from envs.racing.config import EnvConfig
from envs.racing.deepracer_reward import DeepRacerParams, evaluate_reward_function, load_reward_function
from envs.racing.effects import ActuatorEffects, DelayLine, action_noise
from envs.racing.observations import imu_reading, teacher_observation
from envs.racing.physics_bicycle import BicyclePhysics, CarParams, CarState
from envs.racing.randomization import (
    WorldSample,
    env_factors,
    sample_directions,
    sample_visuals,
    sample_world,
    uniform,
)
from envs.racing.rewards import is_offtrack, total_reward
from envs.racing.sensor import SensorModel
from envs.racing.track import wrap_angle
from envs.racing.track_texture import TrackScene
from envs.state_io import check_state, dataclass_state, load_dataclass_state, substate

WORLD_TENSORS = ("action_latency", "camera_latency", "action_noise", "battery", "max_speed_percent")
"""the per-env world factors held as tensors on the `WorldSample` itself (the car's are in its `params`)"""
BUFFERS = (
    "direction", "segment", "s", "travel", "laps", "lap_start_step", "last_lap_time", "stuck_mark",
    "stuck_steps", "episode_length_buf", "episode_count", "prev_action", "prev_vel", "start_index",
)  # fmt: skip
"""the env's own per-env buffers (its mutable state besides the world, visuals, delay lines, physics and effects)"""


def make_physics(cfg: EnvConfig, device: torch.device, track=None):
    if cfg.physics == "bicycle":
        return BicyclePhysics(cfg.num_envs, cfg.car, cfg.dt_physics, device, compile=cfg.compile)
    from envs.racing.physics_genesis import GenesisPhysics  # imported lazily: genesis is slow to import

    return GenesisPhysics(cfg, device, track=track)


def assign_world(dst: WorldSample, src: WorldSample, env_ids: Tensor) -> None:
    """dst[env_ids] = src for every field of a WorldSample (src has M entries)."""
    for name in CarParams.__dataclass_fields__:
        getattr(dst.params, name)[env_ids] = getattr(src.params, name)
    for name in WORLD_TENSORS:
        getattr(dst, name)[env_ids] = getattr(src, name)


class RacingEnv:
    """Batched racing env (rsl_rl VecEnv-compatible). All tensors have a leading `num_envs`."""

    def __init__(self, cfg: EnvConfig) -> None:
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.num_envs = cfg.num_envs
        self.track = load_track(cfg.track, device=self.device)
        self.action_space = load_action_space(cfg.action_space)
        self.calibration = Calibration.load(cfg.calibration) if cfg.calibration else Calibration()
        self.num_actions = self.action_space.num_actions
        self.max_episode_length = cfg.max_episode_length
        self.max_speed = self.action_space.max_speed
        self.generator = torch.Generator(device=self.device).manual_seed(cfg.seed)
        self._action_table = self.action_space.table(self.device) if self.action_space.kind == "discrete" else None
        self.optimal_lap_time = self.track.optimal_lap_time(
            mu=1.0, a_accel=cfg.car.max_accel, a_brake=cfg.car.max_brake, v_max=self.max_speed
        )
        started = time.perf_counter()
        self.physics = make_physics(cfg, self.device, self.track)
        # Seconds each backend took to start (Genesis: `gs.init` and the scene build), apart from the rest of
        # construction (the first reset, and torch.compile of the hot paths when `compile` is on).
        self.startup_seconds = {"physics": time.perf_counter() - started, "camera": 0.0}
        # Full-batch hot paths (fixed shapes, so each compiles once); resets use the eager functions.
        self._project_all = maybe_compile(self.track.project, cfg.compile)
        self._teacher_obs = maybe_compile(teacher_observation, cfg.compile)
        self._user_reward = None
        if cfg.reward.deepracer_function:
            self._user_reward = load_reward_function(cfg.reward.deepracer_function)
            self._deepracer_params = DeepRacerParams(self.track)
        self.scene = TrackScene(self.track, cfg.scene, self.device) if cfg.camera != "none" else None
        started = time.perf_counter()
        self.camera = self._make_camera() if cfg.camera != "none" else None
        self.startup_seconds["camera"] = time.perf_counter() - started
        self.effects = None
        if cfg.effects.active:
            self.effects = ActuatorEffects(cfg.effects, self.num_envs, cfg.dt_physics, self.max_speed, self.device)
        self.sensor = None
        if self.camera is not None and cfg.sensor.active:
            self.sensor = SensorModel(cfg.sensor, cfg.optics.height_px, cfg.optics.width, self.device)
        self._allocate()
        self.reset()

    def _make_camera(self):
        if self.cfg.camera == "genesis":
            from envs.racing.camera_genesis import GenesisCamera

            return GenesisCamera(self.physics, self.scene, self.cfg.optics, self.device, self.cfg.genesis)
        return make_camera(self.cfg.camera, self.scene, self.cfg.optics, self.device)

    # ------------------------------------------------------------------------------------------------ buffers
    def _allocate(self) -> None:
        n, dev, cfg = self.num_envs, self.device, self.cfg
        zeros = lambda *shape, dtype=torch.float32: torch.zeros(n, *shape, dtype=dtype, device=dev)  # noqa: E731
        rnd = cfg.randomization
        max_latency_ms = rnd.max_latency_ms() + cfg.effects.latency_jitter_ms
        capacity = int(math.ceil(max_latency_ms / 1000.0 / cfg.dt_physics)) + 2
        self.action_delay = DelayLine(n, 2, capacity, dev)
        self.pose_delay = DelayLine(n, 3, capacity, dev)
        self.world = sample_world(rnd, n, cfg.dt_physics, self.generator, dev, cfg.max_speed_percent)
        self.visuals = sample_visuals(rnd, n, self.generator, dev)
        self.direction = torch.ones(n, device=dev)
        self.segment = zeros(dtype=torch.long)
        self.s = zeros()
        self.travel = zeros()  # metres along the travel direction since the episode started
        self.laps = zeros(dtype=torch.long)
        self.lap_start_step = zeros(dtype=torch.long)
        self.last_lap_time = torch.full((n,), float("nan"), device=dev)
        self.stuck_mark = zeros()  # travel distance at the last "moving" check
        self.stuck_steps = zeros(dtype=torch.long)
        self.episode_length_buf = zeros(dtype=torch.long)
        self.episode_count = zeros(dtype=torch.long)
        self.prev_action = zeros(2)  # normalized previous command (steering / max, speed / max)
        self.prev_vel = zeros(2)
        self.start_index = torch.arange(n, device=dev) % len(cfg.start_points)
        self._redraw_steps = int(round(rnd.redraw_seconds * cfg.control_hz))
        self._obs: TensorDict | None = None

    # ------------------------------------------------------------------------------------------------- resets
    @torch.no_grad()
    def reset(self) -> tuple[TensorDict, dict]:
        """Reset every env (new randomization draw) and return the observations."""
        self._reset_idx(torch.arange(self.num_envs, device=self.device), first=True)
        self._obs = self._observe()
        return self._obs, {}

    @torch.no_grad()
    def reset_to(self, env_ids: Tensor, start: Tensor, direction: Tensor) -> TensorDict:
        """Start new episodes for `env_ids` at lap fractions `start` `(M,)` driving `direction` `(M,)` (+1/-1), on the
        centerline; the world is randomized as configured. For evaluation with fixed start points."""
        self._reset_idx(env_ids, start=start * self.track.length, direction=direction)
        self._obs = self._observe()
        return self._obs

    def _reset_idx(
        self, env_ids: Tensor, first: bool = False, start: Tensor | None = None, direction: Tensor | None = None
    ) -> None:
        """Start new episodes for `env_ids` (long `(M,)`); every other env keeps its state untouched."""
        cfg, rnd, dev = self.cfg, self.cfg.randomization, self.device
        m = env_ids.numel()
        world = sample_world(rnd, m, cfg.dt_physics, self.generator, dev, cfg.max_speed_percent)
        assign_world(self.world, world, env_ids)
        visuals = sample_visuals(rnd, m, self.generator, dev)
        for name in ("asphalt", "line", "ground", "wall", "sky", "brightness"):
            getattr(self.visuals, name)[env_ids] = getattr(visuals, name)
        if direction is None:
            direction = sample_directions(rnd, self.direction[env_ids], self.generator, first=first)
        self.direction[env_ids] = direction.to(self.direction.dtype)
        direction = self.direction[env_ids]

        random_start = rnd.random_start and start is None
        if start is not None:
            s0 = start.to(dev, torch.float32)
        elif rnd.random_start:
            s0 = uniform(0.0, self.track.length, m, self.generator, dev)
        else:
            fractions = torch.tensor(cfg.start_points, device=dev)[self.start_index[env_ids]]
            s0 = fractions * self.track.length
        xy, tangent, half_width = self.track.interpolate(s0)
        heading = tangent + torch.where(direction < 0, math.pi, 0.0)
        if random_start:
            lateral = uniform(-1.0, 1.0, m, self.generator, dev) * rnd.start_offset_frac * half_width
            heading = heading + uniform(-1.0, 1.0, m, self.generator, dev) * math.radians(rnd.start_heading_deg)
            normal = torch.stack([-torch.sin(tangent), torch.cos(tangent)], -1)
            xy = xy + lateral[:, None] * normal
        heading = wrap_angle(heading)
        self.physics.reset(env_ids, xy[:, 0], xy[:, 1], heading, torch.zeros(m, device=dev))
        self.physics.set_params(self.world.params, env_ids)
        if self.effects is not None:
            self.effects.reset(env_ids, self.generator)

        seg0 = (torch.remainder(s0, self.track.length) / self.track.ds).long().clamp(0, self.track.num_points - 1)
        proj = self.track.project(xy, heading, hint=seg0, window=2)
        if first:
            self._proj = proj
        else:
            for name in ("segment", "s", "offset", "heading_error", "half_width"):
                getattr(self._proj, name)[env_ids] = getattr(proj, name)
        self.segment[env_ids] = proj.segment
        self.s[env_ids] = proj.s
        for buf in (self.travel, self.stuck_mark):
            buf[env_ids] = 0.0
        for buf in (self.laps, self.lap_start_step, self.stuck_steps, self.episode_length_buf):
            buf[env_ids] = 0
        self.prev_vel[env_ids] = 0.0
        self.last_lap_time[env_ids] = float("nan")
        self.prev_action[env_ids] = 0.0
        self.episode_count[env_ids] += 1
        pose = torch.stack([xy[:, 0], xy[:, 1], heading], dim=-1)
        self.pose_delay.fill(pose, env_ids)
        self.action_delay.fill(torch.zeros(m, 2, device=dev), env_ids)

    # --------------------------------------------------------------------------------------------------- step
    def commands(self, actions: Tensor) -> tuple[Tensor, Tensor]:
        """Policy actions -> calibrated (steering rad, speed m/s), before noise and latency."""
        steer, speed = self.action_space.to_commands(actions.to(self.device), self._action_table)
        return self.calibration.apply(steer, speed)

    @torch.no_grad()
    def step(self, actions: Tensor) -> tuple[TensorDict, Tensor, Tensor, dict]:
        cfg, dev = self.cfg, self.device
        steer, speed = self.commands(actions)
        steer_cmd, speed_cmd = steer, speed
        action_obs = self.action_space.normalized(steer, speed, cfg.car.max_steering)
        # The car's speed setting (fixed or drawn per env) scales the command at the car, after the policy: the
        # previous-action input (`action_obs`) keeps the command the policy chose, as the deployment runtime's does.
        speed = speed * (self.world.max_speed_percent / 100.0)
        if cfg.randomization.action_noise:
            steer, speed = action_noise(steer, speed, self.world.action_noise, cfg.car.max_steering, self.generator)
        latency = self.world.action_latency
        if self.effects is not None:
            steer, speed = self.effects.command(steer, speed)
            self.world.battery.copy_(self.effects.battery_gain())
            latency = self.effects.latency(latency, self.generator)
        speed = speed * self.world.battery
        command = torch.stack([steer, speed], dim=-1)
        for _ in range(cfg.substeps):
            self.action_delay.push(command)
            delayed = self.action_delay.read(latency)
            steer_now = delayed[:, 0] if self.effects is None else self.effects.servo(delayed[:, 0])
            self.physics.advance(steer_now, delayed[:, 1])
            self.pose_delay.push(self.physics.pose())  # the camera sees the pose of `camera_latency` substeps ago

        state = self.physics.state
        proj = self._project_all(torch.stack([state.x, state.y], -1), state.yaw, hint=self.segment)
        self._proj = proj
        half_len = 0.5 * self.track.length
        delta = torch.remainder(proj.s - self.s + half_len, self.track.length) - half_len
        delta = delta * self.direction
        self.segment, self.s = proj.segment, proj.s
        self.travel += delta
        self.episode_length_buf += 1

        laps_now = torch.floor(self.travel / self.track.length).long().clamp(min=0)
        new_lap = laps_now > self.laps
        lap_time = (self.episode_length_buf - self.lap_start_step).float() * cfg.dt
        self.last_lap_time = torch.where(new_lap, lap_time, self.last_lap_time)
        self.lap_start_step = torch.where(new_lap, self.episode_length_buf, self.lap_start_step)
        self.laps = torch.maximum(self.laps, laps_now)

        offset = proj.offset * self.direction
        offtrack = is_offtrack(offset, proj.half_width, 0.5 * cfg.car.track_width)
        stuck = self._update_stuck()
        finished = (self.laps >= cfg.termination.laps) & (cfg.termination.laps > 0)
        timeout = self.episode_length_buf >= self.max_episode_length
        terminated = offtrack | stuck
        truncated = timeout & ~terminated & ~finished
        dones = terminated | truncated | finished

        rewards = total_reward(
            cfg.reward, delta, offset, proj.half_width, state.speed, offtrack,
            action_obs[:, 0], self.prev_action[:, 0], self.max_speed, cfg.dt,
        )  # fmt: skip
        if self._user_reward is not None:
            params = self._deepracer_params.build(
                state.x, state.y, state.yaw, proj.s, offset, proj.half_width, self.travel, self.direction,
                steer_cmd, speed_cmd, self.episode_length_buf, 0.5 * cfg.car.track_width,
            )  # fmt: skip
            rewards = evaluate_reward_function(self._user_reward, params).to(dev)
        self.prev_action = action_obs
        # Body-frame specific force for the IMU: d(v)/dt plus the centripetal term.
        vel = torch.stack([state.vx, state.vy], -1)
        dv = (vel - self.prev_vel) / cfg.dt
        self._accel = torch.stack([dv[:, 0] - state.vy * state.yaw_rate, dv[:, 1] + state.vx * state.yaw_rate], -1)
        self.prev_vel = vel

        extras = {"time_outs": truncated, "log": self._episode_log(dones, offtrack, new_lap, lap_time)}
        extras["terminated"], extras["offtrack"], extras["new_lap"] = terminated, offtrack, new_lap
        extras["lap_time"] = lap_time
        extras["laps_done"], extras["episode_travel"] = self.laps.clone(), self.travel.clone()  # before auto-reset
        done_ids = dones.nonzero(as_tuple=True)[0]
        if done_ids.numel() > 0:
            self._reset_idx(done_ids)
        if self._redraw_steps > 0:
            due = (self.episode_length_buf > 0) & (self.episode_length_buf % self._redraw_steps == 0)
            redraw_ids = due.nonzero(as_tuple=True)[0]
            if redraw_ids.numel() > 0:
                self._redraw_dynamics(redraw_ids)
        self._obs = self._observe()
        return self._obs, rewards, dones, extras

    def _redraw_dynamics(self, env_ids: Tensor) -> None:
        """A new draw of the car's parameters and both latencies for `env_ids`, mid-episode (`redraw_seconds`); the
        travel direction, visuals, action noise, battery and speed setting stay those of the episode."""
        world = sample_world(self.cfg.randomization, env_ids.numel(), self.cfg.dt_physics, self.generator, self.device)
        for name in CarParams.__dataclass_fields__:
            getattr(self.world.params, name)[env_ids] = getattr(world.params, name)
        self.world.action_latency[env_ids] = world.action_latency
        self.world.camera_latency[env_ids] = world.camera_latency
        self.physics.set_params(self.world.params, env_ids)

    def _update_stuck(self) -> Tensor:
        term = self.cfg.termination
        window = int(round(term.stuck_seconds * self.cfg.control_hz))
        self.stuck_steps += 1
        moved = (self.travel - self.stuck_mark) > term.stuck_distance
        check = self.stuck_steps >= window
        stuck = check & ~moved
        self.stuck_mark = torch.where(check, self.travel, self.stuck_mark)
        self.stuck_steps = torch.where(check, torch.zeros_like(self.stuck_steps), self.stuck_steps)
        return stuck

    def _episode_log(self, dones: Tensor, offtrack: Tensor, new_lap: Tensor, lap_time: Tensor) -> dict[str, Tensor]:
        log: dict[str, Tensor] = {}
        if bool(new_lap.any()):
            t = lap_time[new_lap]
            log["Episode/lap_time"] = t
            log["Episode/lap_time_ratio"] = t / self.optimal_lap_time
        if bool(dones.any()):
            log["Episode/progress"] = self.travel[dones] / self.track.length
            log["Episode/laps"] = self.laps[dones].float()
            log["Episode/offtrack_rate"] = offtrack[dones].float()
        return log

    # --------------------------------------------------------------------------------------------- observations
    def get_observations(self) -> TensorDict:
        assert self._obs is not None
        return self._obs

    def _observe(self) -> TensorDict:
        cfg, state = self.cfg, self.physics.state
        offset, heading_err, half_width = self.travel_frame()
        groups = {
            "teacher": self._teacher_obs(
                self.track, state, self.s, self.direction, offset, heading_err, half_width, self.prev_action,
                cfg.obs, cfg.car, self.max_speed,
            ),
            "env_factors": env_factors(self.world, cfg.dt_physics),
            "proprio": self._proprio(state),
        }  # fmt: skip
        if self.camera is not None:
            pose = self.camera_pose()
            frames = self.camera.render(pose[:, 0], pose[:, 1], pose[:, 2], self.visuals)
            groups["camera"] = frames if self.sensor is None else self.sensor.apply(frames, self.generator)
        return TensorDict(groups, batch_size=[self.num_envs], device=self.device)

    def camera_pose(self) -> Tensor:
        """The pose `(N, 3)` (x, y, yaw of the centre of gravity) the latest frame was taken from: `camera_latency`
        substeps ago. Kept with or without a camera, so a camera-free env knows what its frames would show."""
        return self.pose_delay.read(self.world.camera_latency)

    def travel_frame(self) -> tuple[Tensor, Tensor, Tensor]:
        """Lateral offset (+ left of travel), heading error to the travel direction, half width: each `(N,)`."""
        proj = self._proj
        reverse = self.direction < 0
        heading_err = torch.where(reverse, wrap_angle(proj.heading_error + math.pi), proj.heading_error)
        return proj.offset * self.direction, heading_err, proj.half_width

    def _proprio(self, state: CarState) -> Tensor:
        if not self.cfg.obs.proprio_imu:
            return self.prev_action.clone()
        accel = getattr(self, "_accel", torch.zeros(self.num_envs, 2, device=self.device))
        imu = imu_reading(state, accel, self.cfg.obs.imu_noise, self.generator)
        return torch.cat([self.prev_action, imu], dim=-1)

    # ---------------------------------------------------------------------------------------------- utilities
    def shift_world(self, env_ids: Tensor, **values: Tensor | float) -> None:
        """Change world factors mid-episode (friction, latency, ... shifts) for `env_ids`.

        Keys are CarParams fields (friction, mass_scale, motor_gain, steering_gain, steering_offset) or
        action_latency / camera_latency (substeps), action_noise, battery, max_speed_percent (the speed setting, %).
        """
        for name, value in values.items():
            if name in CarParams.__dataclass_fields__:
                target = getattr(self.world.params, name)
            elif name in WORLD_TENSORS:
                target = getattr(self.world, name)
            else:
                raise ConfigError(f"shift_world: unknown factor {name!r}")
            target[env_ids] = torch.as_tensor(value, device=self.device).to(target.dtype)
        self.physics.set_params(self.world.params, env_ids)

    # ------------------------------------------------------------------------------------------ save / restore
    def state_dict(self) -> dict[str, Tensor | int]:
        """Every piece of mutable env state (tensors and ints only), so a resumed run continues bit-exactly."""
        out: dict[str, Tensor | int] = {f"buf.{k}": getattr(self, k).clone() for k in BUFFERS}
        for prefix, obj in (("world_params", self.world.params), ("visuals", self.visuals), ("proj", self._proj)):
            out.update(dataclass_state(prefix, obj))
        for name, line in (("action_delay", self.action_delay), ("pose_delay", self.pose_delay)):
            out[f"{name}.buffer"], out[f"{name}.head"] = line.buffer.clone(), int(line.head)
        out.update({f"world.{name}": getattr(self.world, name).clone() for name in WORLD_TENSORS})
        if self.effects is not None:
            out.update({f"effects.{k}": v for k, v in self.effects.state_dict().items()})
        out["accel"] = getattr(self, "_accel", torch.zeros(self.num_envs, 2, device=self.device)).clone()
        out["generator"] = self.generator.get_state()
        out.update({f"obs.{key}": value.clone() for key, value in self.get_observations().items()})
        out.update({f"physics.{key}": value for key, value in self.physics.state_dict().items()})
        return out

    def load_state_dict(self, state: dict[str, Tensor | int]) -> None:
        """Restore `state_dict()` output (same config and env count); a missing or misshapen entry is refused by name
        before anything changes. A state saved before the speed setting was held per env restores the fixed one."""
        key = "world.max_speed_percent"
        if key not in state and not self.cfg.randomization.max_speed_percent:
            state = {**state, key: torch.full_like(self.world.max_speed_percent, self.cfg.max_speed_percent)}
        check_state(self.state_dict(), state)
        for k in BUFFERS:
            getattr(self, k).copy_(state[f"buf.{k}"])
        for prefix, obj in (("world_params", self.world.params), ("visuals", self.visuals), ("proj", self._proj)):
            load_dataclass_state(prefix, obj, state)
        for name, line in (("action_delay", self.action_delay), ("pose_delay", self.pose_delay)):
            line.buffer.copy_(state[f"{name}.buffer"])
            line.head = int(state[f"{name}.head"])
        for name in WORLD_TENSORS:
            getattr(self.world, name).copy_(state[f"world.{name}"])
        if self.effects is not None:
            self.effects.load_state_dict(substate("effects", state))
        self._accel = state["accel"].clone()
        self.generator.set_state(state["generator"])
        self.physics.load_state_dict(substate("physics", state))
        obs = {k: v.clone() for k, v in substate("obs", state).items()}
        self._obs = TensorDict(obs, batch_size=[self.num_envs], device=self.device)

    def close(self) -> None:
        if hasattr(self.physics, "close"):
            self.physics.close()
