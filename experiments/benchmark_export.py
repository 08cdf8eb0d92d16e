"""Single-frame inference latency of the exported student on one CPU thread: torch, ONNX Runtime, OpenVINO.

    python -m experiments.benchmark_export default --checkpoint runs/student/checkpoints/round_014.pt \\
        --export outputs/export

Each runtime steps the recurrent graph on a stream of real camera frames from the sim; median and p99 over
`frames` calls after a warm-up. Writes `outputs/benchmark_export.json`.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from envs.config_io import write_text_atomic
from envs.console import make_console
from envs.errors import ConfigError
from envs.racing.env import RacingEnv
from experiments.cli import run
from student.deploy import StudentRuntime
from student.loaded import load_student


@dataclass(frozen=True)
class ExportBenchConfig:
    checkpoint: str = ""
    """student checkpoint (for the torch figure)"""
    export: str = "outputs/export"
    """export folder"""
    frames: int = 500
    """timed frames per runtime"""
    warmup: int = 50
    """untimed frames first"""
    out: str = "outputs/benchmark_export.json"
    """JSON output"""


def percentiles(samples: list[float]) -> dict[str, float]:
    a = np.asarray(samples) * 1000.0
    return {"median_ms": float(np.median(a)), "p99_ms": float(np.percentile(a, 99)), "mean_ms": float(a.mean())}


def main(cfg: ExportBenchConfig) -> dict:
    if not cfg.checkpoint:
        raise ConfigError("--checkpoint is required")
    torch.set_num_threads(1)
    student = load_student(cfg.checkpoint)
    env = RacingEnv(replace(student.env_cfg, num_envs=1, compile=False))
    frames, obs = [], env.get_observations()
    for _ in range(cfg.frames + cfg.warmup):
        frames.append((obs["camera"][:1].clone(), obs["proprio"][:1, :2].clone()))
        obs, *_ = env.step(torch.tensor([[4.0]]))
    result: dict = {"machine": {"platform": platform.platform(), "cpu_count": os.cpu_count()}, "threads": 1}
    model, state = student.model.eval(), student.model.init_state(1)
    times = []
    with torch.no_grad():
        for i, (cam, prev) in enumerate(frames):
            t0 = time.perf_counter()
            _, _, state = model.step(cam, prev, state)
            if i >= cfg.warmup:
                times.append(time.perf_counter() - t0)
    result["torch"] = percentiles(times)
    backends = ["onnx"] + (["openvino"] if (Path(cfg.export) / "student.xml").is_file() else [])
    for backend in backends:
        rt = StudentRuntime(cfg.export, backend=backend, threads=1)
        times = []
        for i, (cam, prev) in enumerate(frames):
            rt.prev_action = prev.numpy()
            t0 = time.perf_counter()
            rt.infer(cam.float().numpy())
            if i >= cfg.warmup:
                times.append(time.perf_counter() - t0)
        result[backend] = percentiles(times)
    make_console().print(json.dumps(result, indent=2))
    write_text_atomic(cfg.out, json.dumps(result, indent=2))
    return result


PRESETS = {"default": ("500 frames per runtime, 1 thread", ExportBenchConfig())}

if __name__ == "__main__":
    run(main, {"racing": PRESETS}, description=__doc__)
