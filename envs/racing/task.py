"""The `racing` task: a 1/18-scale DeepRacer-class car on a track, registered through the task contract.

The estimate targets are the two latencies (classified in physics substeps), the per-episode friction and motor gain,
and the body velocities (speed, lateral speed, yaw rate: dense per-frame targets that teach the history encoder the
car's motion, which is what reveals friction and motor gain). The action spec is a DeepRacer action space; an export
writes its `model_metadata.json`. Evaluation runs fixed-seed episodes from fixed start points in both directions and
ranks by lap completion.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from envs.racing.car import ActionSpace
from envs.racing.config import EnvConfig
from envs.racing.deploy import command_mapper
from envs.racing.env import RacingEnv
from envs.racing.evaluation import EpisodeRecord, EvalConfig, evaluation_env_config, run_episodes, summarize
from envs.racing.randomization import FACTOR_BOUNDS, FACTOR_NAMES
from envs.racing.reality import reality_env_config
from envs.task import Task, register_task
from envs.vehicle import VEHICLE_ESTIMATES

ESTIMATES = VEHICLE_ESTIMATES


def estimate_targets(env: RacingEnv) -> Tensor:
    """Per-env ground truth `(N, len(ESTIMATES.targets))` of the estimates, in `ESTIMATES.targets` order."""
    cols = {
        "action_latency": env.world.action_latency.float() * env.cfg.dt_physics,
        "camera_latency": env.world.camera_latency.float() * env.cfg.dt_physics,
        "friction": env.world.params.friction,
        "motor_gain": env.world.params.motor_gain,
        "speed": env.physics.state.vx,
        "lateral_speed": env.physics.state.vy,
        "yaw_rate": env.physics.state.yaw_rate,
    }
    return torch.stack([cols[c] for c in ESTIMATES.targets], dim=-1)


def latency_classes(cfg: EnvConfig) -> dict[str, int]:
    """Classes of each latency estimate: physics substeps from 0 to the most the config's randomization draws."""
    rnd = cfg.randomization
    max_act = rnd.action_latency_ms[1] if rnd.action_latency else rnd.nominal_action_latency_ms
    max_cam = rnd.camera_latency_ms[1] if rnd.camera_latency else rnd.nominal_camera_latency_ms
    to_classes: Callable[[float], int] = lambda ms: int(round(ms / 1000.0 / cfg.dt_physics)) + 1  # noqa: E731
    return {"action_latency": to_classes(max_act), "camera_latency": to_classes(max_cam)}


def action_spec_from_dict(data: Mapping[str, Any]) -> ActionSpace:
    return ActionSpace.from_metadata(dict(data), source="saved action space")


def summarize_records(records: list[EpisodeRecord], env: RacingEnv) -> dict[str, float]:
    """Lap completion with its Wilson interval, lap time and lap time / optimal, progress, off-track count; both
    directions apart; the optimal lap time beside them."""
    metrics = summarize(records, env.optimal_lap_time)
    metrics["optimal_lap_time"] = env.optimal_lap_time
    return metrics


def student_env_config(cfg: EnvConfig, num_envs: int, max_steps: int | None) -> EnvConfig:
    """The camera env a student drives in (the projective camera unless one is configured); with `max_steps`, episodes
    that end after that many frames and never on a lap count."""
    camera = "projective" if cfg.camera == "none" else cfg.camera
    cfg = replace(cfg, num_envs=num_envs, camera=camera)
    if max_steps is None:
        return cfg
    term = replace(cfg.termination, episode_seconds=max_steps / cfg.control_hz, laps=0)
    return replace(cfg, termination=term)


def export_files(space: ActionSpace, cfg: EnvConfig) -> dict[str, str]:
    import json

    return {"model_metadata.json": json.dumps(space.to_metadata(), indent=2)}


TASK = register_task(
    Task(
        name="racing",
        config_cls=EnvConfig,
        make_env=RacingEnv,
        factor_names=tuple(FACTOR_NAMES),
        factor_bounds=FACTOR_BOUNDS,
        previous_action_dim=2,
        teacher_previous_action=-2,
        student_env_config=student_env_config,
        observation_groups=lambda cfg: (
            "teacher",
            "env_factors",
            "proprio",
            *(("camera",) if cfg.camera != "none" else ()),
        ),
        estimates=ESTIMATES,
        estimate_targets=estimate_targets,
        action_spec_from_dict=action_spec_from_dict,
        eval_config_cls=EvalConfig,
        make_eval_env=lambda env_cfg, eval_cfg: RacingEnv(evaluation_env_config(env_cfg, eval_cfg)),
        run_episodes=run_episodes,
        summarize=summarize_records,
        primary_metric="lap_completion",
        selection_metric="progress",
        episode_score=lambda record: min(record.progress, 1.0),
        latency_classes=latency_classes,
        dt_physics=lambda cfg: cfg.dt_physics,
        export_files=export_files,
        reality_env_config=reality_env_config,
        command_mapper=command_mapper,
        description="a 1/18-scale DeepRacer-class car on a track, from one 160x120 grayscale camera",
    )
)
