"""Throughput benchmark: env-steps/s of the state-only env, frames/s of the camera env, peak RSS.

    python -m experiments.benchmark default            # writes outputs/benchmark.json
    python -m experiments.benchmark smoke --out /tmp/b.json

Every measurement runs in a fresh subprocess so its peak RSS is its own. Figures depend on the machine (noted in the
JSON: CPU count, torch threads, versions); compare ratios between runs on the same machine.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from rich.table import Table

from envs.console import make_console
from envs.genesis_import import GenesisConfig, import_genesis
from envs.machine import machine
from envs.racing.config import EnvConfig
from envs.racing.env import RacingEnv
from envs.racing.pure_pursuit import PurePursuitDriver
from experiments.cli import current_task, run

Driver = Literal["random", "pure-pursuit"]


@dataclass(frozen=True)
class BenchmarkConfig:
    """What to measure."""

    state_envs: tuple[int, ...] = (256, 1024, 4096)
    """env counts for the state-only (bicycle, no camera) env"""
    camera_envs: tuple[int, ...] = (16, 64, 256)
    """env counts for the camera (projective) env"""
    genesis_envs: tuple[int, ...] = ()
    """env counts for the Genesis state-only env (e.g. 16 64 256; empty = skip)"""
    genesis_camera_envs: tuple[int, ...] = ()
    """env counts for the Genesis-rendered camera (e.g. 1 16 64; empty = skip)"""
    steps: int = 200
    """timed control steps per measurement (camera: a quarter of this)"""
    warmup: int = 20
    """untimed steps first (compilation, caches)"""
    compile: bool = True
    """torch.compile the env's hot kernels (as training does)"""
    track: str = "reinvent2018"
    """track"""
    threads: int = 0
    """torch threads (0 = torch's default)"""
    genesis_performance_mode: bool = False
    """Genesis static-array kernels (faster steps, slower warm builds; see env.genesis.performance_mode)"""
    drivers: tuple[Driver, ...] = ("random",)
    """who picks the actions of the state-only envs (bicycle and Genesis): `random` (uniform discrete actions: cars
    leave the track within about a second, so nearly every step resets some envs) and/or `pure-pursuit` (the scripted
    driver laps the track: the workload of evaluation, few resets); one measurement per driver"""
    out: str = "outputs/benchmark.json"
    """JSON output path"""
    single: str = ""
    """internal: run one measurement `kind:num_envs[:driver]` in this process and print its JSON"""


def measure(cfg: BenchmarkConfig, kind: str, num_envs: int, driver: Driver = "random") -> dict:
    """Time env.step with the driver's actions; returns steps/s, env-steps/s (= frames/s with a camera) and peak
    RSS. The pure-pursuit driver's own time (a few small tensor ops per step) is inside the timed loop."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    camera = {"camera": "projective", "genesis_camera": "genesis"}.get(kind, "none")
    physics = "genesis" if kind == "genesis" else "bicycle"
    env_cfg = EnvConfig(
        num_envs=num_envs, track=cfg.track, camera=camera, physics=physics, compile=cfg.compile,
        genesis=GenesisConfig(performance_mode=cfg.genesis_performance_mode),
    )  # fmt: skip
    start = time.perf_counter()
    if "genesis" in (physics, camera):
        # Timed apart from the build: importing Genesis takes seconds, and its engine modules (imported lazily by
        # the first scene of a process) another one or two; both are paid once per process, not per env.
        import_genesis()
        import genesis.engine.simulator  # noqa: F401
    imported = time.perf_counter()
    env = RacingEnv(env_cfg)
    build = time.perf_counter() - imported
    gen = torch.Generator().manual_seed(0)
    steps = {"state": cfg.steps, "genesis": max(10, cfg.steps // 2)}.get(kind, max(10, cfg.steps // 4))
    actions = [torch.randint(0, env.action_space.num_choices, (num_envs, 1), generator=gen).float() for _ in range(8)]
    act = lambda i, obs: actions[i % 8]  # noqa: E731
    if driver == "pure-pursuit":
        obs_cfg = env_cfg.obs
        pursuit = PurePursuitDriver(env.action_space, env_cfg.car, obs_cfg.lookahead_points, obs_cfg.lookahead_spacing)
        act = lambda i, obs: pursuit.act(obs)  # noqa: E731
    obs = env.get_observations()
    dones = 0
    for i in range(cfg.warmup):
        obs = env.step(act(i, obs))[0]
    t0 = time.perf_counter()
    for i in range(steps):
        obs, _, done, _ = env.step(act(i, obs))
        dones += int(done.sum())
    elapsed = time.perf_counter() - t0
    result = {
        "kind": kind,
        "driver": driver,
        "resets_per_step": dones / steps,
        "num_envs": num_envs,
        "steps": steps,
        "seconds": elapsed,
        "env_steps_per_s": num_envs * steps / elapsed,
        "build_seconds": build,
        "physics_startup_seconds": env.startup_seconds["physics"],
        "camera_startup_seconds": env.startup_seconds["camera"],
        "import_seconds": imported - start,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
    }
    if kind == "genesis":
        result["physics_steps_per_s"] = result["env_steps_per_s"] * env_cfg.substeps
    if kind in ("genesis", "genesis_camera"):
        import os as _os

        result["qd_num_threads"] = _os.environ.get("QD_NUM_THREADS", "default (1)")
        result["genesis_performance_mode"] = cfg.genesis_performance_mode
    if kind in ("camera", "genesis_camera"):
        result["frames_per_s"] = result["env_steps_per_s"]
        state = env.physics.state
        t0 = time.perf_counter()
        reps = max(4, steps // 2)
        for _ in range(reps):
            env.camera.render(state.x, state.y, state.yaw, env.visuals)
        result["render_only_frames_per_s"] = num_envs * reps / (time.perf_counter() - t0)
    return result


def main(cfg: BenchmarkConfig) -> dict:
    if cfg.single:
        kind, n, driver = [*cfg.single.split(":"), "random"][:3]
        print(json.dumps(measure(cfg, kind, int(n), driver)))  # type: ignore[arg-type]
        return {}
    console = make_console()
    host = machine()  # before the measurements load the machine themselves
    results = []
    plan = [("state", n, d) for n in cfg.state_envs for d in cfg.drivers]
    plan += [("camera", n, "random") for n in cfg.camera_envs]
    plan += [("genesis", n, d) for n in cfg.genesis_envs for d in cfg.drivers]
    plan += [("genesis_camera", n, "random") for n in cfg.genesis_camera_envs]
    base = [sys.executable, "-m", "experiments.benchmark", "default", "--task", current_task()]
    flags = [
        "--steps",
        str(cfg.steps),
        "--warmup",
        str(cfg.warmup),
        "--track",
        cfg.track,
        "--threads",
        str(cfg.threads),
    ]
    flags += ["--compile" if cfg.compile else "--no-compile"]
    flags += ["--genesis-performance-mode" if cfg.genesis_performance_mode else "--no-genesis-performance-mode"]
    flags += [
        "--genesis-envs",
        *map(str, cfg.genesis_envs),
        "--genesis-camera-envs",
        *map(str, cfg.genesis_camera_envs),
    ]
    for kind, n, driver in plan:
        console.print(f"measuring {kind} env at {n} envs ({driver} actions) ...")
        proc = subprocess.run(
            [*base, *flags, "--single", f"{kind}:{n}:{driver}"], capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            raise RuntimeError(f"benchmark {kind}:{n}:{driver} failed:\n{proc.stderr[-2000:]}")
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    table = Table(title="env throughput (build: env construction incl. gs.init and scene builds, after the import)")
    columns = ("env", "actions", "envs", "resets/step", "env-steps/s", "render-only frames/s", "peak RSS (MiB)",
               "build (s)")  # fmt: skip
    for col in columns:
        table.add_column(col)
    for r in results:
        table.add_row(
            r["kind"], r["driver"], str(r["num_envs"]), f"{r['resets_per_step']:.1f}", f"{r['env_steps_per_s']:,.0f}",
            f"{r.get('render_only_frames_per_s', float('nan')):,.0f}", f"{r['peak_rss_mib']:.0f}",
            f"{r['build_seconds']:.1f}",
        )  # fmt: skip
    console.print(table)
    report = {"machine": host, "config": {**cfg.__dict__}, "results": results}
    out = Path(cfg.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=2))
    tmp.replace(out)
    console.print(f"wrote {out.resolve()}")
    return report


PRESETS = {
    "default": ("state {256, 1024, 4096} and camera {16, 64, 256}", BenchmarkConfig()),
    "smoke": (
        "a few steps at small sizes (checks the script, not the machine)",
        BenchmarkConfig(
            state_envs=(64,), camera_envs=(4,), drivers=("random", "pure-pursuit"), steps=8, warmup=2, compile=False
        ),
    ),
    "genesis": (
        "Genesis state-only {16, 64, 256} and Genesis camera {1, 16, 64} (build times included)",
        BenchmarkConfig(
            state_envs=(),
            camera_envs=(),
            genesis_envs=(16, 64, 256),
            genesis_camera_envs=(1, 16, 64),
            drivers=("random", "pure-pursuit"),
            steps=200,
            warmup=20,
            out="outputs/benchmark_genesis.json",
        ),
    ),
}

if __name__ == "__main__":
    run(main, {"racing": PRESETS}, description=__doc__)
