"""Fixed-seed evaluation: every (start point, direction, repeat) runs exactly one episode; metrics with intervals.

A policy is any callable `obs TensorDict -> actions`. The env config is used as given (randomization included), so
the same runner does nominal evaluation, robust evaluation (noise, several starts, both directions) and, later,
reality-proxy evaluation. The one exception is the car's maximum-speed setting: an evaluation reports a policy at one
setting, the config's fixed `max_speed_percent`, even when training drew it per env (`randomization.max_speed_percent`),
since the setting is the operator's choice at the console, not a property of the world a policy meets.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from tensordict import TensorDict
from torch import Tensor

from envs.errors import ConfigError, check_range
from envs.intervals import wilson_interval
from envs.racing.config import EnvConfig
from envs.racing.env import RacingEnv
from envs.racing.randomization import FACTOR_NAMES, denormalize_factor

Policy = Callable[[TensorDict], Tensor]


@dataclass(frozen=True)
class EvalConfig:
    """Which episodes an evaluation runs."""

    start_points: int = 4
    """evenly spaced start points around the loop"""
    directions: tuple[str, ...] = ("forward", "reverse")
    """travel directions evaluated"""
    repeats: int = 1
    """episodes per (start, direction), each with its own randomization draw"""
    laps: int = 1
    """laps an episode must complete to count as a success"""
    max_seconds: float = 60.0
    """episode time limit"""
    seed: int = 1234
    """seed of the evaluation env (fixed, so every policy sees the same worlds)"""
    record_trajectories: bool = True
    """keep the (x, y) path of every episode for plots"""

    def __post_init__(self) -> None:
        check_range("eval.start_points", self.start_points, 1, 1000)
        check_range("eval.repeats", self.repeats, 1, 1000)
        check_range("eval.laps", self.laps, 1, 100)
        check_range("eval.max_seconds", self.max_seconds, 1.0, 3600.0)
        bad = set(self.directions) - {"forward", "reverse"}
        if bad or not self.directions:
            raise ConfigError(f"eval.directions={self.directions!r}; use forward and/or reverse")

    @property
    def num_episodes(self) -> int:
        return self.start_points * len(self.directions) * self.repeats


@dataclass
class EpisodeRecord:
    start: float
    direction: str
    success: bool
    lap_time: float  # first lap, from a standing start (nan if none)
    flying_lap_time: float  # mean of the laps after the first (nan if fewer than two laps)
    progress: float  # laps of progress (1.0 = one lap)
    offtrack: bool
    duration: float
    path: np.ndarray = field(repr=False)
    factors: dict[str, float] = field(default_factory=dict, repr=False)  # the episode's world (physical units, the
    # env factors and the speed setting `max_speed_percent`)

    @property
    def end_position(self) -> float:
        """Where on the lap the episode ended: the fraction of the centerline from the start line, in [0, 1)."""
        sign = 1.0 if self.direction == "forward" else -1.0
        return float((self.start + sign * self.progress) % 1.0)


def mean_interval(values: list[float], z: float = 1.96) -> tuple[float, float, float]:
    """Mean and a normal-approximation 95% interval."""
    if not values:
        return (float("nan"), float("nan"), float("nan"))
    a = np.asarray(values, dtype=np.float64)
    m = float(a.mean())
    half = z * float(a.std(ddof=1)) / math.sqrt(len(a)) if len(a) > 1 else 0.0
    return (m, m - half, m + half)


def summarize(records: list[EpisodeRecord], optimal_lap_time: float) -> dict[str, float]:
    """Lap completion (with Wilson CI), lap time and lap time / optimal (with CIs), progress, off-track count."""
    out: dict[str, float] = {"episodes": float(len(records))}
    groups = {"all": records}
    for d in ("forward", "reverse"):
        sub = [r for r in records if r.direction == d]
        if sub:
            groups[d] = sub
    for name, recs in groups.items():
        k = sum(r.success for r in recs)
        lo, hi = wilson_interval(k, len(recs))
        times = [r.lap_time for r in recs if r.success]
        mean_t, t_lo, t_hi = mean_interval(times)
        flying = [r.flying_lap_time for r in recs if r.success and not math.isnan(r.flying_lap_time)]
        mean_f, _, _ = mean_interval(flying)
        prefix = "" if name == "all" else f"{name}/"
        out.update(
            {
                f"{prefix}lap_completion": k / len(recs),
                f"{prefix}lap_completion_ci_low": lo,
                f"{prefix}lap_completion_ci_high": hi,
                f"{prefix}lap_time": mean_t,
                f"{prefix}lap_time_ci_low": t_lo,
                f"{prefix}lap_time_ci_high": t_hi,
                f"{prefix}lap_time_ratio": mean_t / optimal_lap_time,
                f"{prefix}flying_lap_time": mean_f,
                f"{prefix}flying_lap_time_ratio": mean_f / optimal_lap_time,
                f"{prefix}progress": float(np.mean([min(r.progress, 1.0) for r in recs])),
                f"{prefix}offtrack_count": float(sum(r.offtrack for r in recs)),
            }
        )
    return out


def episode_factors(env_factors: Tensor) -> list[dict[str, float]]:
    """Each env's randomized world in physical units (friction, gains, latencies in seconds, ...) from the
    normalized `env_factors` observation."""
    raw = torch.stack([denormalize_factor(k, env_factors[:, i]) for i, k in enumerate(FACTOR_NAMES)], -1)
    return [dict(zip(FACTOR_NAMES, row)) for row in raw.cpu().double().tolist()]


def completion_by_factor(records: list[EpisodeRecord], bins: int = 3) -> dict[str, list[dict[str, float]]]:
    """Lap completion by equal-count bins of each randomized factor (factors that do not vary are left out): which
    worlds a policy fails in. Per factor a list of {lo, hi, episodes, lap_completion, ci_low, ci_high}."""
    out: dict[str, list[dict[str, float]]] = {}
    if not records or not records[0].factors:
        return out
    success = np.array([r.success for r in records], dtype=float)
    for name in records[0].factors:
        x = np.array([r.factors[name] for r in records])
        if np.ptp(x) < 1e-9:
            continue
        order = np.argsort(x, kind="stable")
        rows = []
        for part in np.array_split(order, min(bins, len(x))):
            k, m = int(success[part].sum()), len(part)
            lo, hi = wilson_interval(k, m)
            rows.append({"lo": float(x[part].min()), "hi": float(x[part].max()), "episodes": float(m),
                         "lap_completion": k / m, "ci_low": lo, "ci_high": hi})  # fmt: skip
        out[name] = rows
    return out


def failures_by_section(records: list[EpisodeRecord], sections: int = 10) -> dict[str, list[int]]:
    """Per direction, how many failed episodes ended in each of `sections` equal stretches of the lap (from the
    start line along the centerline's own direction): where a policy leaves the track."""
    out: dict[str, list[int]] = {}
    for d in ("forward", "reverse"):
        sub = [r for r in records if r.direction == d]
        if sub:
            counts = [0] * sections
            for r in sub:
                if not r.success:
                    counts[min(int(r.end_position * sections), sections - 1)] += 1
            out[d] = counts
    return out


def evaluation_env_config(env_cfg: EnvConfig, cfg: EvalConfig) -> EnvConfig:
    """The env config an evaluation runs: one env per episode, lap-count termination, its own seed, the car at the
    fixed speed setting `env_cfg.max_speed_percent` (none drawn)."""
    term = replace(env_cfg.termination, episode_seconds=cfg.max_seconds, laps=cfg.laps)
    rnd = replace(env_cfg.randomization, max_speed_percent=False)
    # Evaluation envs are small and built often: eager kernels (no per-size compilation).
    return replace(
        env_cfg, num_envs=cfg.num_episodes, termination=term, randomization=rnd, seed=cfg.seed, compile=False
    )


def episode_plan(cfg: EvalConfig) -> tuple[list[float], list[str]]:
    starts, dirs = [], []
    for _ in range(cfg.repeats):
        for d in cfg.directions:
            for i in range(cfg.start_points):
                starts.append(i / cfg.start_points)
                dirs.append(d)
    return starts, dirs


@torch.no_grad()
def run_episodes(policy: Policy, env: RacingEnv, cfg: EvalConfig, reset: Callable[[Tensor], None] | None = None):
    """Run one episode per env of `env` (built from `evaluation_env_config`) and return EpisodeRecords.

    `reset(dones)` is called after every step so recurrent policies can clear their state.
    """
    n = env.num_envs
    if n != cfg.num_episodes:
        raise ConfigError(f"evaluation env has {n} envs but the plan has {cfg.num_episodes} episodes")
    starts, dirs = episode_plan(cfg)
    env.generator.manual_seed(cfg.seed)  # every evaluation sees the same worlds, however often it runs
    if env.effects is not None:
        env.effects.new_session()
    ids = torch.arange(n, device=env.device)
    direction = torch.tensor([1.0 if d == "forward" else -1.0 for d in dirs], device=env.device)
    obs = env.reset_to(ids, torch.tensor(starts, device=env.device), direction)
    world = episode_factors(obs["env_factors"]) if "env_factors" in obs.keys() else [{} for _ in range(n)]
    # The car's speed setting is no env factor, but part of the episode's world.
    for factors, setting in zip(world, env.world.max_speed_percent.cpu().double().tolist(), strict=True):
        factors["max_speed_percent"] = setting
    if reset is not None:
        reset(torch.ones(n, dtype=torch.bool, device=env.device))
    finished = torch.zeros(n, dtype=torch.bool, device=env.device)
    success = torch.zeros(n, dtype=torch.bool, device=env.device)
    offtrack = torch.zeros(n, dtype=torch.bool, device=env.device)
    lap_time = torch.full((n,), float("nan"), device=env.device)
    progress = torch.zeros(n, device=env.device)
    duration = torch.zeros(n, device=env.device)
    flying_sum = torch.zeros(n, device=env.device)
    flying_count = torch.zeros(n, dtype=torch.long, device=env.device)
    paths: list[np.ndarray] = []
    for _ in range(env.max_episode_length + 1):
        state = env.physics.state
        if cfg.record_trajectories:
            paths.append(torch.stack([state.x, state.y], -1).cpu().numpy())
        length = env.episode_length_buf.clone()
        obs, _, dones, extras = env.step(policy(obs))
        if reset is not None:
            reset(dones)
        first_lap = extras["new_lap"] & ~finished & torch.isnan(lap_time)
        later_lap = extras["new_lap"] & ~finished & ~first_lap
        lap_time = torch.where(first_lap, extras["lap_time"], lap_time)
        flying_sum += torch.where(later_lap, extras["lap_time"], 0.0)
        flying_count += later_lap.long()
        newly = dones & ~finished
        if bool(newly.any()):
            success |= newly & ~extras["terminated"] & (extras["laps_done"] >= cfg.laps)
            offtrack |= newly & extras["offtrack"]
            progress = torch.where(newly, extras["episode_travel"] / env.track.length, progress)
            duration = torch.where(newly, (length + 1).float() * env.cfg.dt, duration)
            finished |= newly
        if bool(finished.all()):
            break
    records = []
    path_arr = np.stack(paths, axis=1) if paths else np.zeros((n, 0, 2))
    steps_done = (duration / env.cfg.dt).round().long().cpu().numpy()
    flying = torch.where(flying_count > 0, flying_sum / flying_count.clamp(min=1), float("nan"))
    for i in range(n):
        records.append(
            EpisodeRecord(
                start=starts[i],
                direction=dirs[i],
                success=bool(success[i]),
                lap_time=float(lap_time[i]),
                flying_lap_time=float(flying[i]),
                progress=float(progress[i]),
                offtrack=bool(offtrack[i]),
                duration=float(duration[i]),
                path=path_arr[i, : max(1, int(steps_done[i]))],
                factors=world[i],
            )
        )
    return records


def evaluate(
    policy: Policy,
    env_cfg: EnvConfig,
    cfg: EvalConfig,
    reset: Callable[[Tensor], None] | None = None,
    env: RacingEnv | None = None,
) -> tuple[dict[str, float], list[EpisodeRecord], RacingEnv]:
    """Build the evaluation env (unless given), run the plan, and summarize."""
    env = env or RacingEnv(evaluation_env_config(env_cfg, cfg))
    records = run_episodes(policy, env, cfg, reset)
    return summarize(records, env.optimal_lap_time), records, env
