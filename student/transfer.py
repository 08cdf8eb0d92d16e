"""Transfer evaluation shared by `evaluate`, `select_checkpoint` and `ablate`: robust / fixed-lap / proxy scoring,
checkpoint-selection rules, rank correlation, and the perception / dynamics split of the sim-to-real gap.

A checkpoint's **score** on a set of episodes is its mean progress, one lap capped at 1.0: it equals the lap
completion rate when runs either finish or fail early, and still ranks two policies that both fail by how far they
get. Lap times are reported next to it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from envs.racing.config import EnvConfig
from envs.racing.env import RacingEnv
from envs.racing.evaluation import EvalConfig, evaluate, evaluation_env_config
from envs.racing.randomization import RandomizationConfig
from envs.racing.reality import RealityConfig, reality_env_config

NOMINAL = RandomizationConfig(
    friction=False, mass=False, motor_gain=False, steering_gain=False, steering_offset=False, action_latency=False,
    camera_latency=False, action_noise=False, visual=False, random_start=False,
)  # fmt: skip

ROBUST_EVAL = EvalConfig(start_points=8, repeats=4, laps=1, max_seconds=40.0, seed=2024)
"""robust evaluation: 8 starting points x both directions x 4 randomization draws = 64 episodes (a few seconds per
checkpoint in the bicycle sim)"""
FIXED_LAP_EVAL = EvalConfig(start_points=1, directions=("forward",), laps=1, max_seconds=40.0, seed=2024)
"""the console-style evaluation: one lap from the start line, forward, nominal world"""
PROXY_EVAL = EvalConfig(start_points=10, laps=1, max_seconds=40.0, seed=7)
"""reality-proxy evaluation: 10 starting points x both directions = 20 laps"""
SELECT_PROXY_EVAL = replace(PROXY_EVAL, repeats=4)
"""the proxy score of checkpoint selection: 80 laps. With 20, a lap-completion rate near 90% carries about +-13
points of binomial noise, as much as the differences between the checkpoints of a run's plateau, and the rank
correlation measures mostly that noise (docs/results.md#checkpoint-selection)"""


def robust_env_config(env_cfg: EnvConfig, action_noise: float = 0.1) -> EnvConfig:
    """The training world (its randomization) with action noise up to `action_noise`, eager kernels."""
    rnd = replace(env_cfg.randomization, action_noise=action_noise > 0, action_noise_max=action_noise)
    return replace(env_cfg, randomization=rnd, compile=False)


def sim2sim_env_config(env_cfg: EnvConfig, action_noise: float = 0.1) -> EnvConfig:
    """Robust evaluation on the second physics engine: the contact-wheel Genesis car at the training physics step,
    with the training camera, randomization and action noise (a sim-to-sim check). The reality proxy still differs
    from it: a finer step, the unmodeled actuation effects, a fixed car and floor, its own camera, lens and scene."""
    cfg = robust_env_config(env_cfg, action_noise)
    return replace(cfg, physics="genesis", randomization=replace(cfg.randomization, rear_grip=False))


def fixed_lap_env_config(env_cfg: EnvConfig) -> EnvConfig:
    """The training sim with every randomization off."""
    return replace(env_cfg, randomization=replace(NOMINAL, direction="forward"), compile=False)


def score(metrics: dict[str, float]) -> float:
    return float(metrics["progress"])


def episode_scores(records: list) -> list[float]:
    """The per-episode terms whose mean is `score`: each episode's progress, one lap capped at 1.0."""
    return [min(r.progress, 1.0) for r in records]


class Evaluator:
    """One evaluation env, built once and reused for every policy (Genesis scenes are slow to build)."""

    def __init__(self, env_cfg: EnvConfig, eval_cfg: EvalConfig) -> None:
        self.eval_cfg = eval_cfg
        self.env = RacingEnv(evaluation_env_config(env_cfg, eval_cfg))

    def __call__(self, policy) -> tuple[dict[str, float], list]:
        policy.check_env(self.env)
        metrics, records, _ = evaluate(
            policy.act, self.env.cfg, self.eval_cfg, reset=getattr(policy, "reset", None), env=self.env
        )
        metrics["score"] = score(metrics)
        metrics["optimal_lap_time"] = self.env.optimal_lap_time
        return metrics, records

    def close(self) -> None:
        self.env.close()


def evaluate_one(policy, env_cfg: EnvConfig, eval_cfg: EvalConfig):
    """Metrics (with the score), episode records and the env (for plots; the caller closes it)."""
    evaluator = Evaluator(env_cfg, eval_cfg)
    try:
        metrics, records = evaluator(policy)
    except BaseException:
        evaluator.close()
        raise
    return metrics, records, evaluator.env


# ------------------------------------------------------------------------------------------------ statistics
def rank(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n with ties sharing their average rank."""
    values = np.asarray(values, dtype=np.float64)
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(len(values))
    sorted_vals = values[order]
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and sorted_vals[j + 1] == sorted_vals[i]:
            j += 1
        ranks[order[i : j + 1]] = 0.5 * (i + j) + 1.0
        i = j + 1
    return ranks


def spearman(x, y) -> float:
    """Spearman rank correlation (Pearson correlation of average ranks); nan when either side is constant."""
    rx, ry = rank(np.asarray(x)), rank(np.asarray(y))
    if len(rx) < 2 or rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def spearman_interval(
    x_episodes: list, y_episodes: list, level: float = 0.95, samples: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """Bootstrap interval of `spearman` between per-checkpoint mean scores: every resample draws each checkpoint's
    episodes with replacement on both sides (the evaluation noise), then correlates the means. `x_episodes[i]` holds
    checkpoint i's per-episode scores. With few episodes per checkpoint the interval is wide: it says how far the
    measured correlation can be trusted. Resamples with a constant side (undefined correlation) are left out."""
    if len(x_episodes) != len(y_episodes):
        raise ValueError(f"{len(x_episodes)} vs {len(y_episodes)} checkpoints")
    rng = np.random.default_rng(seed)

    def resampled_means(episodes: list) -> np.ndarray:  # (samples, checkpoints)
        out = np.empty((samples, len(episodes)))
        for i, eps in enumerate(episodes):
            eps = np.asarray(eps, dtype=np.float64)
            out[:, i] = eps[rng.integers(0, len(eps), (samples, len(eps)))].mean(1)
        return out

    xs, ys = resampled_means(x_episodes), resampled_means(y_episodes)
    rho = np.array([spearman(a, b) for a, b in zip(xs, ys)])
    rho = rho[~np.isnan(rho)]
    if len(rho) == 0:
        return (float("nan"), float("nan"))
    tail = 100.0 * (1.0 - level) / 2.0
    return (float(np.percentile(rho, tail)), float(np.percentile(rho, 100.0 - tail)))


def split_half_reliability(episodes: list, splits: int = 500, seed: int = 0) -> dict[str, float]:
    """How reproducible the ranking of checkpoints by a score is, from its own per-episode terms.

    `episodes[i]` holds checkpoint i's per-episode scores, the same episode plan for every checkpoint. Each split
    cuts the plan's episodes into two random halves (the same cut for every checkpoint) and correlates the
    checkpoints' means on one half with those on the other (Spearman); `split_half` is the mean over splits, and
    `full_length` its Spearman-Brown step-up to the whole plan, r' = 2r / (1 + r): the correlation two independent
    evaluations of this length would have with each other. A score cannot rank the checkpoints more reproducibly than
    that, so the correlation between two scores is bounded by about sqrt(rel_x * rel_y) (classical attenuation)."""
    lengths = {len(e) for e in episodes}
    if len(lengths) != 1:
        raise ValueError(f"every checkpoint needs the same episode plan; got lengths {sorted(lengths)}")
    n = lengths.pop()
    if n < 2 or len(episodes) < 3:
        return {"split_half": float("nan"), "full_length": float("nan")}
    table = np.asarray(episodes, dtype=np.float64)  # (checkpoints, episodes)
    rng = np.random.default_rng(seed)
    rhos = []
    for _ in range(splits):
        order = rng.permutation(n)
        a, b = order[: n // 2], order[n // 2 : 2 * (n // 2)]
        rho = spearman(table[:, a].mean(1), table[:, b].mean(1))
        if not np.isnan(rho):
            rhos.append(rho)
    if not rhos:
        return {"split_half": float("nan"), "full_length": float("nan")}
    r = float(np.mean(rhos))
    full = 2.0 * r / (1.0 + r) if r > -1.0 else float("nan")
    return {"split_half": r, "full_length": float(full)}


def _worst_direction(key: str):
    def summary(m: dict) -> float:
        sides = [m[f"{d}/{key}"] for d in ("forward", "reverse") if f"{d}/{key}" in m]
        return min(sides) if sides else m[key]

    return summary


ROBUST_SUMMARIES = {
    "progress (the robust score)": lambda m: m["progress"],
    "lap completion": lambda m: m["lap_completion"],
    "worst direction's progress": _worst_direction("progress"),
    "fewest off-tracks": lambda m: -m["offtrack_count"],
}
"""other summaries of the same robust episodes, each higher = better"""


def spearman_by_summary(robust: list[dict], proxy: list[float]) -> dict[str, float]:
    """Spearman against the proxy scores of each robust-evaluation summary in `ROBUST_SUMMARIES`, from the stored
    per-checkpoint metrics: which sim summary ranks a run's checkpoints like the proxy does (a diagnostic; the
    selection rules keep the robust score)."""
    return {name: spearman([f(m) for m in robust], proxy) for name, f in ROBUST_SUMMARIES.items()}


# ----------------------------------------------------------------------------------------- selection rules
@dataclass(frozen=True)
class Pick:
    rule: str
    index: int
    detail: str


def pick_consecutive_good(scores: list[float], margin: float = 0.05, min_run: int = 2) -> Pick:
    """DeepRacer's signal: a checkpoint is good when its score is within `margin` of the best; take the longest run
    of consecutive good checkpoints (the later one on a tie) and pick its middle. With no run of `min_run`, the best
    single checkpoint."""
    best = max(scores)
    good = [s >= best - margin for s in scores]
    runs, start = [], None
    for i, g in enumerate([*good, False]):
        if g and start is None:
            start = i
        elif not g and start is not None:
            runs.append((start, i - 1))
            start = None
    lo, hi = max(runs, key=lambda r: (r[1] - r[0], r[0]))
    if hi - lo + 1 < min_run:
        return Pick("consecutive-good", int(np.argmax(scores)), f"no run of {min_run} good checkpoints: best single")
    return Pick("consecutive-good", (lo + hi + 1) // 2, f"middle of the run {lo}..{hi} within {margin} of the best")


def pick_last(scores: list[float]) -> Pick:
    return Pick("last", len(scores) - 1, "the final checkpoint")


def pick_best(scores: list[float]) -> Pick:
    best = max(scores)
    index = max(i for i, s in enumerate(scores) if s == best)  # the latest of equal bests
    return Pick("best-single", index, "highest robust score")


# ------------------------------------------------------------------------------------------ gap decomposition
def decompose_gap(
    load, path: str, reality: RealityConfig, eval_cfg: EvalConfig = PROXY_EVAL, known: dict | None = None
) -> dict[str, dict[str, float]]:
    """Score one policy in the training sim at nominal values (`none`), with the proxy's dynamics only, with its
    perception only, and in the full proxy; the differences split the total gap into its two parts. `known` holds
    parts already scored with the same episodes (e.g. the full proxy), which are not run again."""
    out: dict[str, dict[str, float]] = dict(known or {})
    for part in ("none", "dynamics", "perception", "all"):
        if part in out:
            continue
        policy = load(path)
        evaluator = Evaluator(reality_env_config(policy.env_cfg, reality, part=part), eval_cfg)
        try:
            out[part], _ = evaluator(policy)
        finally:
            evaluator.close()
    base = out["none"]["score"]
    out["gap"] = {
        "total": base - out["all"]["score"],
        "dynamics": base - out["dynamics"]["score"],
        "perception": base - out["perception"]["score"],
    }
    return out


@torch.no_grad()
def action_agreement(
    load,
    path: str,
    reality: RealityConfig,
    eval_cfg: EvalConfig = PROXY_EVAL,
    env: RacingEnv | None = None,
    frames_out: str | None = None,
) -> dict:
    """Drive the proxy with the student; at every step a twin of the student (its own recurrent state) sees the
    training camera rendered at the very same camera pose. Returns how often the two choose the same action.
    `env` is a proxy env built for `eval_cfg` to reuse (it is left open); `frames_out` saves a strip of both cameras'
    frames of the first episode (training camera above, proxy below)."""
    from envs.racing.camera import make_camera
    from envs.racing.evaluation import episode_plan
    from envs.racing.randomization import sample_visuals
    from envs.racing.track_texture import TrackScene

    driver, twin = load(path), load(path)
    train_cfg = driver.env_cfg
    own = env is None
    if own:
        env = RacingEnv(evaluation_env_config(reality_env_config(train_cfg, reality, part="all"), eval_cfg))
    try:
        driver.check_env(env)
        camera = make_camera("projective", TrackScene(env.track, train_cfg.scene), train_cfg.optics, env.device)
        visuals = sample_visuals(NOMINAL, env.num_envs, env.generator, env.device)
        starts, dirs = episode_plan(eval_cfg)
        env.generator.manual_seed(eval_cfg.seed)
        dev = env.device
        ids = torch.arange(env.num_envs, device=dev)
        direction = torch.tensor([1.0 if d == "forward" else -1.0 for d in dirs], device=dev)
        obs = env.reset_to(ids, torch.tensor(starts, device=dev), direction)
        everyone = torch.ones(env.num_envs, dtype=torch.bool, device=dev)
        driver.reset(everyone)
        twin.reset(everyone)
        alive = everyone.clone()
        same, total = 0, 0
        strip: list = []
        for t in range(env.max_episode_length):
            pose = env.pose_delay.read(env.world.camera_latency)
            twin_obs = obs.clone()
            twin_obs["camera"] = camera.render(pose[:, 0], pose[:, 1], pose[:, 2], visuals)
            action, twin_action = driver.act(obs), twin.act(twin_obs)
            if t % 10 == 0 and len(strip) < 6 and bool(alive[0]):
                strip.append((twin_obs["camera"][0].cpu().numpy(), obs["camera"][0].cpu().numpy(), t))
            if action.dtype == torch.long:
                match = action == twin_action
            else:  # continuous: within 5% of the normalized range on every axis
                match = (action - twin_action).abs().amax(-1) < 0.05
            same += int(match[alive].sum())
            total += int(alive.sum())
            obs, _, dones, _ = env.step(action)
            alive &= ~dones
            if not bool(alive.any()):
                break
    finally:
        if own:
            env.close()
    if frames_out and strip:
        from envs.racing.visualize import save_frame_strip

        frames = np.stack([f[0] for f in strip] + [f[1] for f in strip])
        captions = [f"training camera t={f[2]}" for f in strip] + [f"proxy camera t={f[2]}" for f in strip]
        save_frame_strip(frames, frames_out, captions, cols=len(strip))
    return {"agreement": same / max(total, 1), "steps": total}
