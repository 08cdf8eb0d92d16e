"""Checkpoint selection that predicts reality, and the transfer report of a run.

Every saved checkpoint of a run is scored three ways: robust evaluation in the training sim (action noise, 8 starting
points, both directions, randomized worlds), the console-style fixed lap (one nominal lap from the start line), and
the held-out reality proxy (80 laps). Selection rules see only the sim scores: **consecutive-good** (the middle of
the longest run of checkpoints within a margin of the best robust score), **last**, and **best-single**; the report
then says how each rule's pick does in the proxy, how well each sim score ranks the checkpoints by their proxy score
(Spearman), and splits the pick's gap into its perception and dynamics parts.

    python -m experiments.select_checkpoint default --run-dir runs/student
    python -m experiments.select_checkpoint default --run-dir runs/student --reality.variant sunlight
    python -m experiments.select_checkpoint smoke --run-dir runs/demo/student

Writes transfer.json, transfer.md, transfer_scatter.png and transfer_by_checkpoint.png to --out-dir (default: the
run's `transfer/` folder), and the same to W&B.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Literal

from datasets.run_layout import ESTIMATOR_SUFFIX
from datasets.run_logger import RunLogger, WandbConfig, check_login
from envs.config_io import write_text_atomic
from envs.console import make_console
from envs.errors import ConfigError, check_range
from envs.racing.car import MAX_SPEED_PERCENT_RANGE
from envs.racing.evaluation import EvalConfig
from envs.racing.reality import RealityConfig, flatten, reality_env_config
from envs.racing.transfer import (
    FIXED_LAP_EVAL,
    ROBUST_EVAL,
    SELECT_PROXY_EVAL,
    action_agreement,
    fixed_lap_env_config,
    robust_env_config,
    sim2sim_env_config,
)
from experiments.cli import run
from student.policies import load_policy
from student.score_cache import ScoreCache
from student.transfer import (
    Evaluator,
    decompose_gap,
    pick_best,
    pick_consecutive_good,
    pick_last,
    spearman,
    spearman_by_summary,
    spearman_interval,
    split_half_reliability,
)
from student.transfer_report import write_report


@dataclass(frozen=True)
class SelectConfig:
    """Score a run's checkpoints in sim and in the reality proxy, pick one, and report the transfer."""

    run_dir: str = ""
    """run folder with a checkpoints/ subfolder (teacher or student run)"""
    checkpoints: tuple[str, ...] = ()
    """explicit checkpoint files instead of --run-dir"""
    every: int = 1
    """score every n-th checkpoint (the last one is always scored)"""
    action_noise: float = 0.1
    """robust evaluation: action noise up to this fraction (DeepRacer's 10%)"""
    robust: EvalConfig = ROBUST_EVAL
    """robust-evaluation episodes (64)"""
    fixed_lap: EvalConfig = FIXED_LAP_EVAL
    """fixed-lap (console-style) episodes"""
    proxy: EvalConfig = SELECT_PROXY_EVAL
    """reality-proxy episodes (80 laps by default; `--proxy.repeats 1` for 20)"""
    reality: RealityConfig = field(default_factory=RealityConfig)
    """the reality proxy"""
    good_margin: float = 0.05
    """consecutive-good rule: a checkpoint is good within this score margin of the best"""
    min_run: int = 2
    """consecutive-good rule: shortest run that counts"""
    max_speed_percent: float = 100.0
    """the car's maximum-speed setting (%) in every evaluation, as on the DeepRacer device console (speed commands are
    scaled by it at the car): select for the setting the car will race at"""
    sim2sim: bool = False
    """also score the robust episodes on the second physics engine (the Genesis car at the training step, training
    camera and randomization): a sim-to-sim check of each checkpoint, reported beside the robust score"""
    select_by: Literal["robust", "sim2sim", "both"] = "robust"
    """the sim score the selection rules read: robust (training sim), sim2sim, or both (the mean of the two; the
    last two need --sim2sim)"""
    decompose: bool = True
    """split the consecutive-good pick's gap into perception and dynamics parts, with action agreement"""
    out_dir: str = ""
    """where the report goes (empty: <run-dir>/transfer)"""
    reuse_scores: bool = True
    """reuse each checkpoint's evaluations already made with the same settings (<out-dir>/scores.json, written after
    every evaluation): a stopped selection continues where it stopped, and changing one evaluation's settings
    re-scores only that evaluation"""
    wandb: WandbConfig = field(default_factory=WandbConfig)

    def __post_init__(self) -> None:
        check_range("every", self.every, 1, 10_000)
        check_range("action_noise", self.action_noise, 0.0, 0.5)
        check_range("good_margin", self.good_margin, 0.0, 1.0)
        check_range("min_run", self.min_run, 1, 1000)
        check_range("max_speed_percent", self.max_speed_percent, *MAX_SPEED_PERCENT_RANGE)
        if self.select_by not in ("robust", "sim2sim", "both"):
            raise ConfigError(f"select_by={self.select_by!r}; use robust, sim2sim or both")
        if self.select_by != "robust" and not self.sim2sim:
            raise ConfigError(f"--select-by {self.select_by} reads the sim-to-sim score; add --sim2sim")


def find_checkpoints(cfg: SelectConfig) -> list[Path]:
    if cfg.checkpoints:
        paths = [Path(p) for p in cfg.checkpoints]
    elif cfg.run_dir:
        # A refitted factor estimator (`experiments.fit_estimator`) drives with its checkpoint's policy: not a
        # checkpoint of its own, and a copy would count twice in the rank correlation.
        paths = sorted(
            p for p in (Path(cfg.run_dir) / "checkpoints").glob("*.pt") if not p.stem.endswith(ESTIMATOR_SUFFIX)
        )
    else:
        raise ConfigError("give --run-dir or --checkpoints")
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise ConfigError(f"checkpoint files not found: {missing[:3]}")
    if not paths:
        raise ConfigError(f"no checkpoints in {Path(cfg.run_dir) / 'checkpoints'}")
    chosen = paths[:: cfg.every]
    if chosen[-1] != paths[-1]:
        chosen.append(paths[-1])
    return chosen


def score_cache(path: Path, cfg: SelectConfig) -> ScoreCache:
    """The selection's evaluations already made with the same settings (read only with `--reuse-scores`)."""
    settings = {part: getattr(cfg, part) for part in ("action_noise", "robust", "fixed_lap", "proxy", "reality")}
    evaluations = ("robust", "fixed_lap", *(("sim2sim",) if cfg.sim2sim else ()), "proxy")
    return ScoreCache(path, settings, evaluations, cfg.max_speed_percent, cfg.reuse_scores)


class Evaluators:
    """The selection's evaluation envs by name, each built on first use (a Genesis proxy scene takes minutes to build
    for many laps; a selection whose scores all come from `scores.json` builds none)."""

    def __init__(self, configs: dict[str, tuple]) -> None:
        self.configs = configs
        self.built: dict[str, Evaluator] = {}

    def __iter__(self):
        return iter(self.configs)

    def __len__(self) -> int:
        return len(self.configs)

    def __getitem__(self, name: str) -> Evaluator:
        if name not in self.built:
            self.built[name] = Evaluator(*self.configs[name])
        return self.built[name]

    def close(self) -> None:
        for evaluator in self.built.values():
            evaluator.close()
        self.built.clear()


def selection_scores(rows: list[dict], select_by: str) -> list[float]:
    """Each checkpoint's sim score for the selection rules: robust, sim2sim, or both (their mean: the same episodes
    on the two physics engines)."""
    if select_by == "both":
        return [0.5 * (r["robust"]["score"] + r["sim2sim"]["score"]) for r in rows]
    return [r[select_by]["score"] for r in rows]


def main(cfg: SelectConfig) -> dict:
    check_login(cfg.wandb)
    console = make_console()
    paths = find_checkpoints(cfg)
    out = Path(cfg.out_dir or Path(cfg.run_dir or paths[0].parent.parent) / "transfer")
    out.mkdir(parents=True, exist_ok=True)
    load = partial(load_policy, max_speed_percent=cfg.max_speed_percent)
    first = load(str(paths[0]))
    env_cfg = first.env_cfg
    t0 = time.time()
    evaluators = Evaluators({
        "robust": (robust_env_config(env_cfg, cfg.action_noise), cfg.robust),
        "fixed_lap": (fixed_lap_env_config(env_cfg), cfg.fixed_lap),
        **({"sim2sim": (sim2sim_env_config(env_cfg, cfg.action_noise), cfg.robust)} if cfg.sim2sim else {}),
        "proxy": (reality_env_config(env_cfg, cfg.reality), cfg.proxy),
    })  # fmt: skip
    rows = []
    cache = score_cache(out / "scores.json", cfg)
    try:
        for i, path in enumerate(paths):
            row = {"checkpoint": str(path), "name": path.stem, **cache.get(path)}
            missing = [name for name in evaluators if name not in row]
            policy = load(str(path)) if missing else None
            for name in missing:
                t = time.time()
                metrics, records = evaluators[name](policy)
                episodes = evaluators[name].episode_scores(records)
                parts = {name: metrics, f"{name}_episodes": episodes, f"{name}_seconds": time.time() - t}
                row.update(parts)
                cache.put(path, name, parts)
            rows.append(row)
            kept = len(evaluators) - len(missing)
            reuse_tag = "(scored before) " if not missing else f"(kept {kept} scores) " if kept else ""
            console.print(
                reuse_tag + f"[{i + 1}/{len(paths)}] {path.name}: robust {row['robust']['score']:.3f}, fixed lap "
                f"{row['fixed_lap']['score']:.3f}, "
                + (f"sim2sim {row['sim2sim']['score']:.3f}, " if "sim2sim" in row else "")
                + f"proxy {row['proxy']['score']:.3f} "
                f"(laps {row['proxy']['lap_completion']:.0%}, {row['proxy_seconds']:.0f} s)"
            )
    except BaseException:
        evaluators.close()
        raise
    robust = [r["robust"]["score"] for r in rows]
    fixed = [r["fixed_lap"]["score"] for r in rows]
    proxy = [r["proxy"]["score"] for r in rows]
    sim = selection_scores(rows, cfg.select_by)
    best_proxy = max(proxy)
    picks = {}
    for pick in (pick_consecutive_good(sim, cfg.good_margin, cfg.min_run), pick_last(sim), pick_best(sim)):
        picks[pick.rule] = {
            "index": pick.index, "checkpoint": rows[pick.index]["name"], "detail": pick.detail,
            "robust_score": robust[pick.index], "selection_score": sim[pick.index], "proxy_score": proxy[pick.index],
            "proxy_lap_completion": rows[pick.index]["proxy"]["lap_completion"],
            "proxy_vs_best": proxy[pick.index] / best_proxy if best_proxy > 0 else math.nan,
        }  # fmt: skip
    result: dict = {
        "run": cfg.run_dir, "checkpoints": rows, "picks": picks,
        "spearman_robust_vs_proxy": spearman(robust, proxy), "spearman_fixed_lap_vs_proxy": spearman(fixed, proxy),
        "spearman_robust_vs_proxy_ci": spearman_interval(
            [r["robust_episodes"] for r in rows], [r["proxy_episodes"] for r in rows]),
        "spearman_fixed_lap_vs_proxy_ci": spearman_interval(
            [r["fixed_lap_episodes"] for r in rows], [r["proxy_episodes"] for r in rows]),
        "spearman_by_robust_summary": spearman_by_summary([r["robust"] for r in rows], proxy),
        "select_by": cfg.select_by,
        "reliability": {name: split_half_reliability([r[f"{name}_episodes"] for r in rows])
                        for name in ("robust", "proxy", *(("sim2sim",) if cfg.sim2sim else ()))},
        "best_proxy": {"index": int(proxy.index(best_proxy)), "score": best_proxy},
        "reality": {k: str(v) for k, v in flatten(cfg.reality.resolved()).items()},
        "max_speed_percent": cfg.max_speed_percent,
        "scoring_seconds": time.time() - t0,
    }  # fmt: skip
    if cfg.sim2sim:
        sim2sim = [r["sim2sim"]["score"] for r in rows]
        both = selection_scores(rows, "both")
        result["spearman_sim2sim_vs_proxy"] = spearman(sim2sim, proxy)
        result["spearman_sim2sim_vs_proxy_ci"] = spearman_interval(
            [r["sim2sim_episodes"] for r in rows], [r["proxy_episodes"] for r in rows])  # fmt: skip
        result["spearman_both_vs_proxy"] = spearman(both, proxy)
        pooled = [[*r["robust_episodes"], *r["sim2sim_episodes"]] for r in rows]  # same count: mean of the two
        result["spearman_both_vs_proxy_ci"] = spearman_interval(pooled, [r["proxy_episodes"] for r in rows])
    try:
        if cfg.decompose:
            row = rows[picks["consecutive-good"]["index"]]
            chosen = row["checkpoint"]
            parts = decompose_gap(load, chosen, cfg.reality, cfg.proxy, known={"all": row["proxy"]})
            result["gap"] = {"checkpoint": chosen, **parts}
            if hasattr(first, "model"):
                proxy_env = evaluators["proxy"].env
                result["agreement"] = action_agreement(
                    load,
                    chosen,
                    cfg.reality,
                    cfg.proxy,
                    env=proxy_env,
                    frames_out=str(out / "transfer_frames.png"),
                )
    finally:
        evaluators.close()
    write_text_atomic(out / "transfer.json", json.dumps(result, indent=2, default=float))
    files = write_report(result, out)
    logger = RunLogger(replace(cfg.wandb, tags=(*cfg.wandb.tags, "transfer")), out, f"transfer-{out.parent.name}", cfg)
    logger.log(
        {"transfer/spearman_robust_vs_proxy": result["spearman_robust_vs_proxy"],
         "transfer/spearman_fixed_lap_vs_proxy": result["spearman_fixed_lap_vs_proxy"],
         **{f"transfer/{k}": result[k] for k in ("spearman_sim2sim_vs_proxy", "spearman_both_vs_proxy") if k in result},
         **{f"transfer/{rule}/proxy_score": p["proxy_score"] for rule, p in picks.items()}}, step=0,
    )  # fmt: skip
    logger.table(
        "transfer/checkpoints", ["checkpoint", "robust", "fixed_lap", "proxy", "proxy_laps"],
        [[r["name"], r["robust"]["score"], r["fixed_lap"]["score"], r["proxy"]["score"],
          r["proxy"]["lap_completion"]] for r in rows], step=0,
    )  # fmt: skip
    for path in files:
        if path.suffix == ".png":
            logger.image(f"transfer/{path.stem}", path, step=0)
    logger.finish()
    console.print((out / "transfer.md").read_text(), markup=False, highlight=False)
    console.print(f"transfer report in [bold]{out.resolve()}[/] (transfer.md, transfer.json, *.png)")
    return result


SMOKE_EVAL = EvalConfig(start_points=1, max_seconds=4.0, record_trajectories=False)
PRESETS = {
    "default": ("every checkpoint: 64 robust sim episodes, fixed lap and 80 proxy laps", SelectConfig()),
    "smoke": (
        "tiny: 2 short episodes per score, bicycle/projective proxy with every unmodeled effect on",
        SelectConfig(
            robust=SMOKE_EVAL,
            fixed_lap=replace(SMOKE_EVAL, directions=("forward",)),
            proxy=SMOKE_EVAL,
            reality=RealityConfig(physics="bicycle", camera="projective", substeps=4),
            wandb=WandbConfig(mode="disabled"),
        ),
    ),
}

if __name__ == "__main__":
    run(main, {"racing": PRESETS}, description=__doc__)
