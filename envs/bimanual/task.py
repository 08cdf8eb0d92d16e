"""The `bimanual-lift` task: two Franka arms lift a bar level, registered through the task contract.

The estimate targets are the action latency (classified in physics steps) and the per-episode bar mass, centre-of-mass
offset, friction and each arm's gain scale. The action spec is a box of 10 values (per arm: TCP position and yaw
changes, finger force). Evaluation runs one fixed-seed episode per env and ranks by success (the level lift held for
the success window), reported with its Wilson interval. The reality proxy is `envs/bimanual/reality.py`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from envs.bimanual.config import BimanualConfig, nominal
from envs.bimanual.env import FACTOR_BOUNDS, FACTOR_NAMES, BimanualEnv
from envs.bimanual.expert import ScriptedExpert
from envs.bimanual.reality import reality_env_config
from envs.errors import check_range
from envs.intervals import wilson_interval
from envs.task import BoxActionSpec, EstimateSpec, Task, register_task

ESTIMATES = EstimateSpec(
    latencies=("action_latency",),
    regressions=("object_mass", "com_shift", "friction", "gain_arm0", "gain_arm1"),
    scale={
        "object_mass": (0.2, 0.1),
        "com_shift": (0.0, 0.02),
        "friction": (0.8, 0.4),
        "gain_arm0": (1.0, 0.1),
        "gain_arm1": (1.0, 0.1),
    },
    factors=("object_mass", "com_shift", "friction", "gain_arm0", "gain_arm1"),
)
"""latency in seconds, mass in kg, offset in m; (centre, scale) normalize each regressed estimate"""


@dataclass(frozen=True)
class BimanualEvalConfig:
    """Fixed-seed evaluation episodes, one per env."""

    episodes: int = 32
    """episodes (envs of the evaluation env)"""
    seed: int = 1234
    """seed of the evaluation env (start poses, drawn world)"""
    randomize: bool = True
    """draw the world from the training ranges (False: every factor at its nominal value)"""

    def __post_init__(self) -> None:
        check_range("eval.episodes", self.episodes, 1, 100_000)


@dataclass(frozen=True)
class EpisodeRecord:
    """One evaluation episode."""

    success: bool
    steps: int
    """control steps until success or the episode's end"""
    error: bool
    """the simulation failed during the episode"""
    max_height: float
    """highest bar centre over the episode (m)"""


def estimate_targets(env: BimanualEnv) -> Tensor:
    """Per-env ground truth `(N, len(ESTIMATES.targets))` of the estimates, in `ESTIMATES.targets` order."""
    values = env.factor_values()
    values["action_latency"] = env.action_latency.float() * env.cfg.dt
    return torch.stack([values[name] for name in ESTIMATES.targets], -1)


def make_eval_env(env_cfg: BimanualConfig, eval_cfg: BimanualEvalConfig) -> BimanualEnv:
    cfg = replace(env_cfg, num_envs=eval_cfg.episodes, seed=eval_cfg.seed)
    return BimanualEnv(cfg if eval_cfg.randomize else nominal(cfg))


@torch.no_grad()
def run_episodes(act, env: BimanualEnv, cfg: BimanualEvalConfig, reset=None) -> list[EpisodeRecord]:
    """One episode per env from the env's fixed seed: whether the lift succeeded, when, and how high the bar rose."""
    env.generator.manual_seed(cfg.seed)
    obs, _ = env.reset()
    n = env.num_envs
    if reset is not None:
        reset(torch.ones(n, dtype=torch.bool))
    success, error, finished = (torch.zeros(n, dtype=torch.bool) for _ in range(3))
    steps = torch.full((n,), env.max_episode_length)
    height = torch.zeros(n)
    for t in range(env.max_episode_length):
        obs, _, dones, extras = env.step(act(obs))
        if reset is not None:
            reset(dones)
        live = ~finished
        height = torch.where(live, torch.maximum(height, extras["height"].cpu()), height)
        success |= extras["success"].cpu() & live
        error |= extras["error_envs"].cpu() & live
        steps = torch.where(live & dones.cpu(), t + 1, steps)
        finished |= dones.cpu()
        if bool(finished.all()):
            break
    return [
        EpisodeRecord(bool(s), int(k), bool(e), float(h))
        for s, k, e, h in zip(success.tolist(), steps.tolist(), error.tolist(), height.tolist())
    ]


def summarize(records: list[EpisodeRecord], env: BimanualEnv | None = None) -> dict[str, float]:
    """Success with its Wilson interval, control steps to success, failed simulations, the bar's highest point."""
    n = len(records)
    k = sum(r.success for r in records)
    lo, hi = wilson_interval(k, n)
    won = [r.steps for r in records if r.success]
    return {
        "success": k / n if n else float("nan"),
        "success_ci_low": lo,
        "success_ci_high": hi,
        "episodes": float(n),
        "steps_to_success": sum(won) / len(won) if won else float("nan"),
        "error_episodes": float(sum(r.error for r in records)),
        "max_height": sum(r.max_height for r in records) / n if n else float("nan"),
    }


def student_env_config(cfg: BimanualConfig, num_envs: int, max_steps: int | None) -> BimanualConfig:
    """The camera env a student drives in (the camera and the arms' own readings on); with `max_steps`, episodes of
    at most that many control steps."""
    cfg = replace(cfg, num_envs=num_envs, observations=replace(cfg.observations, proprio=True, camera=True))
    return cfg if max_steps is None else replace(cfg, episode_seconds=max_steps * cfg.control_dt)


def observation_groups(cfg: BimanualConfig) -> tuple[str, ...]:
    obs = cfg.observations
    return tuple(g for g in ("teacher", "env_factors", "proprio", "camera") if getattr(obs, g))


TASK = register_task(
    Task(
        name="bimanual-lift",
        config_cls=BimanualConfig,
        make_env=BimanualEnv,
        factor_names=FACTOR_NAMES,
        factor_bounds=FACTOR_BOUNDS,
        estimates=ESTIMATES,
        estimate_targets=estimate_targets,
        action_spec_from_dict=BoxActionSpec.from_dict,
        eval_config_cls=BimanualEvalConfig,
        make_eval_env=make_eval_env,
        run_episodes=run_episodes,
        summarize=summarize,
        primary_metric="success",
        selection_metric="success",
        episode_score=lambda record: float(record.success),
        previous_action_dim=10,
        teacher_previous_action=-11,  # the previous action, then the episode's elapsed share
        student_env_config=student_env_config,
        observation_groups=observation_groups,
        latency_classes=lambda cfg: {"action_latency": cfg.randomization.action_latency[1] + 1},
        dt_physics=lambda cfg: cfg.dt,
        reality_env_config=reality_env_config,
        expert=lambda env: ScriptedExpert(env),
        description="two Franka arms lift a 0.26-0.36 m bar level and hold it, from one 96x96 grayscale camera",
    )
)
