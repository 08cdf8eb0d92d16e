"""Observability bound of an online estimate: how well can a dynamics factor (friction, motor gain) be recovered from
a few seconds of the car's *true* state and commands, while a driver that does not know the factor drives?

The history encoder sees camera frames and its own actions, so nothing it learns can beat a regressor that is handed
the exact body velocities; this regressor's held-out R^2 is the ceiling for the student's estimate on the same
driving, and comparing feature sets shows which motion signals carry the factor. The driver is the teacher with the
factor's input held at its nominal value (`blind`): a teacher that sees the true value would encode it in its
commands, and the regressor would read it from them rather than from the car's response.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from adaptation.losses import r2_score
from datasets.rollouts import read_shards
from envs.task import task_of_config
from envs.vehicle import VEHICLE_ESTIMATES

FEATURES = ("steer_cmd", "speed_cmd", "speed", "lateral_speed", "yaw_rate", "steer", "lateral_accel")
"""per-step signals recorded while driving (commands after the action map; state after the control step)"""
FEATURE_SETS: dict[str, tuple[str, ...]] = {
    "commands": ("steer_cmd", "speed_cmd"),
    "commands+speed": ("steer_cmd", "speed_cmd", "speed"),
    "commands+speed+yaw_rate": ("steer_cmd", "speed_cmd", "speed", "yaw_rate"),
    "commands+body_velocities": ("steer_cmd", "speed_cmd", "speed", "lateral_speed", "yaw_rate"),
    "full_state": FEATURES,
}
"""named feature subsets: what the regressor is given (`commands+body_velocities` is what the student has when its
own estimates of speed, lateral speed and yaw rate are exact)"""
MOTION_FEATURES = ("speed", "lateral_speed", "yaw_rate")
"""the body velocities the student estimates from its camera (what `estimate_noise` blurs)"""
FACTORS = ("friction", "motor_gain", "action_latency")
"""factors the student's history encoder estimates (friction and motor gain nominal 1.0; action latency in seconds,
nominal one frame at 15 Hz)"""
NOMINAL = {"friction": 1.0, "motor_gain": 1.0, "action_latency": 1.0 / 30.0}
"""what a blind driver is told each factor is"""


@dataclass
class Recording:
    """`(N, T, F)` features, `(N, T)` factor value, steps since reset and episode id after each control step."""

    features: Tensor
    target: Tensor
    since_reset: Tensor
    episode: Tensor
    grip_use: Tensor  # |lateral acceleration| / (friction * g), (N, T)


def blind_factor(obs, factor: str, task, nominal: float | None = None):
    """The observation with `factor`'s column of `env_factors` set to its normalized nominal value (`task`: the
    env's task, which names and normalizes the factors)."""
    nominal = NOMINAL[factor] if nominal is None else nominal
    out = obs.clone()
    out["env_factors"][:, task.factor_names.index(factor)] = task.normalized_factor(factor, nominal)
    return out


def factor_value(env, factor: str) -> Tensor:
    """The factor's true value per env (action latency in seconds)."""
    if factor == "action_latency":
        return env.world.action_latency.float() * env.cfg.dt_physics
    return getattr(env.world.params, factor).clone()


@torch.no_grad()
def record(driver, env, factor: str, steps: int, blind: bool = True) -> Recording:
    """Drive `env` for `steps` control steps with `driver` (a teacher: `act(obs)`), recording `FEATURES`."""
    if factor not in FACTORS:
        raise ValueError(f"factor={factor!r}; use one of {FACTORS}")
    task = task_of_config(env.cfg)
    obs = env.get_observations()
    n = env.num_envs
    episode = torch.arange(n)
    next_episode = n
    feats, target, since, episodes, grip = [], [], [], [], []
    for _ in range(steps):
        action = driver.act(blind_factor(obs, factor, task) if blind else obs)
        steer_cmd, speed_cmd = env.commands(action)
        obs, _, dones, _ = env.step(action)
        s = env.physics.state
        lateral_accel = s.vx * s.yaw_rate
        feats.append(torch.stack([steer_cmd, speed_cmd, s.vx, s.vy, s.yaw_rate, s.steer, lateral_accel], -1))
        target.append(factor_value(env, factor))
        since.append(env.episode_length_buf.clone())
        episodes.append(episode.clone())
        grip.append(lateral_accel.abs() / (env.world.params.friction * 9.81))
        done = dones.bool().cpu()
        episode[done] = torch.arange(next_episode, next_episode + int(done.sum()))
        next_episode += int(done.sum())
    stack = lambda xs: torch.stack(xs, 1).cpu()  # noqa: E731
    return Recording(stack(feats), stack(target), stack(since), stack(episodes), stack(grip))


def windows(rec: Recording, length: int, min_steps: int) -> tuple[Tensor, Tensor, Tensor]:
    """Every window of `length` consecutive steps inside one episode whose last step is at least `min_steps` after
    the reset: returns features `(M, length, F)`, the factor at the window's end `(M,)` and the env index `(M,)`."""
    n, t, _ = rec.features.shape
    xs, ys, envs = [], [], []
    for end in range(length - 1, t):
        ok = (rec.episode[:, end - length + 1] == rec.episode[:, end]) & (rec.since_reset[:, end] >= min_steps)
        if not bool(ok.any()):
            continue
        xs.append(rec.features[ok, end - length + 1 : end + 1])
        ys.append(rec.target[ok, end])
        envs.append(torch.nonzero(ok)[:, 0])
    if not xs:
        raise ValueError(f"no window of {length} steps at least {min_steps} steps after a reset; record longer")
    return torch.cat(xs), torch.cat(ys), torch.cat(envs)


def fit_r2(
    x: Tensor, y: Tensor, test: Tensor, iterations: int = 3000, hidden: int = 256, seed: int = 0
) -> dict[str, float]:
    """Fit an MLP on the flattened windows `x[~test]` -> `y[~test]` (Adam, batches of 512); R^2 on both parts."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    x = x.flatten(1).float()
    mu, sd = x[~test].mean(0), x[~test].std(0) + 1e-6
    x = (x - mu) / sd
    y_mu, y_sd = y[~test].mean(), y[~test].std() + 1e-9
    yn = (y - y_mu) / y_sd
    net = torch.nn.Sequential(
        torch.nn.Linear(x.shape[1], hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, 1),
    )  # fmt: skip
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    x_tr, y_tr = x[~test], yn[~test]
    for _ in range(iterations):
        idx = torch.randint(0, len(x_tr), (min(512, len(x_tr)),), generator=gen)
        loss = (net(x_tr[idx]).squeeze(-1) - y_tr[idx]).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        pred = net(x).squeeze(-1) * y_sd + y_mu
    return {"train_r2": r2_score(pred[~test], y[~test]), "test_r2": r2_score(pred[test], y[test])}


def estimate_noise(x: Tensor, columns: Sequence[int], r2: float, generator: torch.Generator) -> Tensor:
    """`x` (..., F) with independent Gaussian noise added to `columns`, scaled so that each noisy column scores
    R^2 = `r2` against the exact one (1 - SSE / SST, as the evaluation scores the student's estimates): noise standard
    deviation = the column's standard deviation * sqrt(1 - r2). White noise per step: an estimator may average it
    over its history, which errors correlated in time would not allow, so the resulting factor R^2 is optimistic."""
    if not 0.0 < r2 <= 1.0:
        raise ValueError(f"r2={r2}: an estimate's R^2 for the noise model must be in (0, 1]")
    out = x.clone()
    for c in columns:
        sd = float(x[..., c].double().std())
        noise = torch.randn(x[..., c].shape, generator=generator, dtype=torch.float64)
        out[..., c] = (x[..., c].double() + sd * (1.0 - r2) ** 0.5 * noise).to(x.dtype)
    return out


def noisy_set_name(r2: float) -> str:
    return f"commands+body_velocities (estimates at R² {r2:g})"


def observability(
    rec: Recording,
    lengths: Sequence[int],
    min_steps: int,
    feature_sets: dict[str, tuple[str, ...]] | None = None,
    iterations: int = 3000,
    holdout_every: int = 5,
    motion_r2: Sequence[float] = (),
    seed: int = 0,
) -> dict:
    """Held-out R^2 of the factor from each feature set and each history length in `lengths` (steps; every
    `holdout_every`-th env is held out: the test windows come from cars and episodes the regressor never saw), plus
    how much of its grip the car uses. The R^2 by length says how much driving the estimate needs. For each value in
    `motion_r2`, also from the commands and body velocities blurred by `estimate_noise` to that R^2: how good the
    student's motion estimates must be for its factor estimate to reach a given R^2."""  # fmt: skip
    sets = feature_sets or FEATURE_SETS
    for name, cols in sets.items():
        unknown = set(cols) - set(FEATURES)
        if unknown:
            raise ValueError(f"feature set {name!r}: unknown features {sorted(unknown)}; known: {FEATURES}")
    body = FEATURE_SETS["commands+body_velocities"]
    gen = torch.Generator().manual_seed(seed)
    names = [*sets, *(noisy_set_name(q) for q in motion_r2)]
    out: dict = {"factor_std": float(rec.target[rec.since_reset >= 0].std()), "history": [], "feature_sets": names}
    for length in lengths:
        x, y, env_index = windows(rec, length, min_steps)
        test = env_index % holdout_every == 0
        row: dict = {"steps": int(length), "windows": len(y), "test_windows": int(test.sum())}
        for name, cols in sets.items():
            row[name] = fit_r2(x[..., [FEATURES.index(c) for c in cols]], y, test, iterations)
        for q in motion_r2:
            xb = x[..., [FEATURES.index(c) for c in body]]
            noisy = estimate_noise(xb, [body.index(c) for c in MOTION_FEATURES], q, gen)
            row[noisy_set_name(q)] = fit_r2(noisy, y, test, iterations) | {"motion_r2": float(q)}
        out["history"].append(row)
    grip = rec.grip_use[rec.since_reset > 0].numpy()
    out["grip_use_percentiles"] = dict(zip(("p50", "p90", "p99"), np.percentile(grip, [50, 90, 99]).tolist()))
    return out


SHARD_FEATURES = ("steer_cmd", "speed_cmd", "speed", "lateral_speed", "yaw_rate", "lateral_accel")
"""what a DAgger run's shards record of `FEATURES` (the commands as normalized previous actions; no steering angle)"""


def shard_recording(data_dir: str | Path, factor: str) -> Recording:
    """A DAgger run's recorded driving as a `Recording`, one row per episode (padded with `since_reset` -1).

    Row t pairs the previous action (the command executed before t) with the body velocities at t, as `record` pairs
    a command with the state after it; features the shards do not hold (the steering angle) are NaN. Regressing the
    factor from this is the ceiling of what the student could learn from its own data if its motion estimates were
    exact: with few distinct worlds (one per episode) a regressor overfits, however well the factor shows."""
    if factor not in FACTORS:
        raise ValueError(f"factor={factor!r}; use one of {FACTORS}")
    cols: dict[str, list[np.ndarray]] = {"prev_action": [], "targets": [], "episode": [], "step": []}
    for shard in read_shards(data_dir, tuple(cols)):
        for k in cols:
            cols[k].append(shard[k])
    if not cols["episode"]:
        raise ValueError(f"{data_dir}: no finished shards in the manifest")
    prev, targets, episode, step = (np.concatenate(cols[k]) for k in ("prev_action", "targets", "episode", "step"))
    t = {name: targets[:, VEHICLE_ESTIMATES.column(name)] for name in VEHICLE_ESTIMATES.targets}
    rows = {"steer_cmd": prev[:, 0], "speed_cmd": prev[:, 1], "lateral_accel": t["speed"] * t["yaw_rate"]}
    rows.update({name: t[name] for name in ("speed", "lateral_speed", "yaw_rate")})
    flat = np.stack([rows.get(name, np.full(len(prev), np.nan, np.float32)) for name in FEATURES], -1)
    ids, first, length = np.unique(episode, return_index=True, return_counts=True)
    n_ep, width = len(ids), int(length.max())
    features = torch.full((n_ep, width, len(FEATURES)), float("nan"))
    target, since = torch.zeros(n_ep, width), torch.full((n_ep, width), -1, dtype=torch.long)
    friction = torch.ones(n_ep, width)
    for i, (a, m) in enumerate(zip(first, length)):  # rows of an episode are contiguous (whole episodes per append)
        features[i, :m] = torch.from_numpy(flat[a : a + m])
        target[i, :m] = torch.from_numpy(t[factor][a : a + m].astype(np.float32))  # per step: worlds may change
        friction[i, :m] = torch.from_numpy(t["friction"][a : a + m].astype(np.float32))
        since[i, :m] = torch.from_numpy(step[a : a + m].astype(np.int64))
    grip = features[..., FEATURES.index("lateral_accel")].abs() / (friction * 9.81)
    episode_ids = torch.arange(n_ep)[:, None].expand(n_ep, width).clone()
    return Recording(features, target, since, episode_ids, torch.nan_to_num(grip, nan=0.0))


def driving_env(env_cfg, num_envs: int):
    """The driver's training world without a camera (state only), `num_envs` wide."""
    return task_of_config(env_cfg).make_env(replace(env_cfg, num_envs=num_envs, camera="none", compile=False))
