"""Transfer evaluation shared by `evaluate`, `select_checkpoint` and `ablate`, for any task: scoring a policy on a
set of fixed-seed episodes, checkpoint-selection rules, rank correlation and its reliability, and the perception /
dynamics split of the sim-to-real gap through the task's reality proxy.

A checkpoint's **score** on a set of episodes is the task's `selection_metric` (racing: mean progress, one lap capped
at 1.0, which equals the lap completion rate when runs either finish or fail early and still ranks two policies that
both fail by how far they get); each episode's share of it is the task's `episode_score`. A task's evaluation suites
(robust, nominal, proxy) are the task's own (racing: `envs.racing.transfer`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from envs.task import Task, task_of_config


def episode_scores(task: Task, records: list) -> list[float]:
    """The per-episode terms whose mean is the score."""
    return [task.episode_score(r) for r in records]


class Evaluator:
    """One evaluation env of the task whose config `env_cfg` is, built once and reused for every policy (Genesis
    scenes are slow to build)."""

    def __init__(self, env_cfg, eval_cfg) -> None:
        self.task, self.eval_cfg = task_of_config(env_cfg), eval_cfg
        self.env = self.task.make_eval_env(env_cfg, eval_cfg)

    def __call__(self, policy) -> tuple[dict[str, float], list]:
        policy.check_env(self.env)
        records = self.task.run_episodes(policy.act, self.env, self.eval_cfg, getattr(policy, "reset", None))
        metrics = self.task.summarize(records, self.env)
        metrics["score"] = float(metrics[self.task.selection_metric])
        return metrics, records

    def episode_scores(self, records: list) -> list[float]:
        return episode_scores(self.task, records)

    def close(self) -> None:
        if hasattr(self.env, "close"):
            self.env.close()


def evaluate_one(policy, env_cfg, eval_cfg):
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
def decompose_gap(load, path: str, reality, eval_cfg, known: dict | None = None) -> dict[str, dict[str, float]]:
    """Score one policy in the training sim at nominal values (`none`), with the proxy's dynamics only, with its
    perception only, and in the full proxy; the differences split the total gap into its two parts. `known` holds
    parts already scored with the same episodes (e.g. the full proxy), which are not run again."""
    out: dict[str, dict[str, float]] = dict(known or {})
    for part in ("none", "dynamics", "perception", "all"):
        if part in out:
            continue
        policy = load(path)
        if policy.task.reality_env_config is None:
            raise ValueError(f"task {policy.task.name!r} has no reality proxy")
        evaluator = Evaluator(policy.task.reality_env_config(policy.env_cfg, reality, part), eval_cfg)
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
