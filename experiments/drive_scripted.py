"""Drive every built-in track in both directions with the scripted pure-pursuit driver.

    python -m experiments.drive_scripted default
    python -m experiments.drive_scripted smoke --tracks oval --out-dir /tmp/scripted

Writes per-track top-down trajectory plots, a strip of camera frames, and `summary.json`; prints lap time against
the track's optimal lap time.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import numpy as np
from rich.table import Table

from envs.console import make_console
from envs.racing.config import EnvConfig
from envs.racing.env import RacingEnv
from envs.racing.evaluation import EvalConfig, evaluate
from envs.racing.pure_pursuit import PurePursuitConfig, PurePursuitDriver
from envs.racing.randomization import RandomizationConfig
from envs.racing.visualize import plot_trajectories, save_frame_strip
from experiments.cli import run


@dataclass(frozen=True)
class DriveConfig:
    """Scripted driving on built-in tracks."""

    tracks: tuple[str, ...] = ("oval", "reinvent2018", "technical")
    """tracks to drive (built-in names or DeepRacer .npy paths)"""
    env: EnvConfig = field(default_factory=EnvConfig)
    """env settings (num_envs is set by the evaluation plan)"""
    eval: EvalConfig = field(default_factory=lambda: EvalConfig(start_points=4, laps=2))
    """episodes: start points, directions, laps"""
    driver: PurePursuitConfig = field(default_factory=PurePursuitConfig)
    """pure-pursuit gains"""
    camera_frames: int = 12
    """camera frames in the strip (0 = no strip)"""
    strip_camera: Literal["projective", "genesis"] = "projective"
    """camera of the strip: the ray-cast camera or the Genesis-rendered scene"""
    out_dir: str = "outputs/scripted"
    """where plots and summary.json go"""


def camera_strip(cfg: DriveConfig, track: str, driver_cfg: PurePursuitConfig, out: Path) -> Path | None:
    """Drive one car forward from the start line with the camera on and save every few frames."""
    if cfg.camera_frames <= 0:
        return None
    rnd = replace(cfg.env.randomization, random_start=False, direction="forward")
    env_cfg = replace(cfg.env, track=track, num_envs=1, camera=cfg.strip_camera, randomization=rnd, compile=False)
    env = RacingEnv(env_cfg)
    driver = PurePursuitDriver(
        env.action_space, env_cfg.car, env_cfg.obs.lookahead_points, env_cfg.obs.lookahead_spacing, driver_cfg
    )
    obs, frames, captions = env.get_observations(), [], []
    every = 6
    for t in range(cfg.camera_frames * every):
        if t % every == 0:
            frames.append(obs["camera"][0].cpu().numpy())
            captions.append(f"t={t * env_cfg.dt:.1f}s")
        obs, *_ = env.step(driver.act(obs))
    env.close()
    return save_frame_strip(np.stack(frames), out / f"{env.track.name}_{cfg.strip_camera}_camera.png", captions)


def main(cfg: DriveConfig) -> dict:
    console = make_console()
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = Table(title="Pure pursuit under the env's randomization (noise, latency, friction, gains)")
    cols = ("track", "direction", "laps done", "1st lap (s)", "flying lap (s)", "optimal (s)", "flying / opt", "off")
    for col in cols:
        table.add_column(col)
    summary: dict = {}
    for track in cfg.tracks:
        t0 = time.time()
        env_cfg = replace(cfg.env, track=track)
        env_for_space = RacingEnv(replace(env_cfg, num_envs=1))
        driver = PurePursuitDriver(
            env_for_space.action_space,
            env_cfg.car,
            env_cfg.obs.lookahead_points,
            env_cfg.obs.lookahead_spacing,
            cfg.driver,
        )
        metrics, records, env = evaluate(driver.act, env_cfg, cfg.eval)
        name = env.track.name  # a track file by its stem, not its path
        for d in cfg.eval.directions:
            table.add_row(
                name, d, f"{metrics[f'{d}/lap_completion']:.0%}", f"{metrics[f'{d}/lap_time']:.2f}",
                f"{metrics[f'{d}/flying_lap_time']:.2f}", f"{env.optimal_lap_time:.2f}",
                f"{metrics[f'{d}/flying_lap_time_ratio']:.2f}",
                f"{int(metrics[f'{d}/offtrack_count'])}",
            )  # fmt: skip
        plot = plot_trajectories(
            env.track, [r.path for r in records], out / f"{name}_trajectories.png",
            labels=[f"{r.direction} from {r.start:.2f}" for r in records],
            title=f"{name}: pure pursuit ({metrics['lap_completion']:.0%} laps completed)",
        )  # fmt: skip
        strip = camera_strip(cfg, track, cfg.driver, out)
        summary[track] = {
            "metrics": metrics,
            "optimal_lap_time": env.optimal_lap_time,
            "plot": str(plot),
            "camera_strip": str(strip) if strip else None,
            "seconds": time.time() - t0,
        }
    console.print(table)
    path = out / "summary.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(summary, indent=2))
    tmp.replace(path)
    console.print(f"results in [bold]{out.resolve()}[/] (summary.json, *_trajectories.png, *_camera.png)")
    return summary


PRESETS = {
    "default": ("all built-in tracks, 4 start points, both directions, 2 laps", DriveConfig()),
    "genesis": (
        "the contact-wheel Genesis car on every built-in track, both directions, with a Genesis-rendered strip",
        DriveConfig(
            env=EnvConfig(physics="genesis"),
            eval=EvalConfig(start_points=4, laps=2),
            strip_camera="genesis",
            out_dir="outputs/scripted_genesis",
        ),
    ),
    "smoke": (
        "one track, 2 start points, 1 lap, nominal physics",
        DriveConfig(
            tracks=("oval",),
            eval=EvalConfig(start_points=2, laps=1, max_seconds=20.0),
            env=EnvConfig(randomization=RandomizationConfig(action_noise=False)),
            camera_frames=4,
        ),
    ),
}

if __name__ == "__main__":
    run(main, {"racing": PRESETS}, description=__doc__)
