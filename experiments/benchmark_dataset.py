"""Dataset reader throughput: windows of K camera frames per second from HDF5 shards (and writer rows/s).

    python -m experiments.benchmark_dataset default        # writes outputs/benchmark_dataset.json

Builds a synthetic dataset shaped like DAgger's (one shard per round, whole episodes), then times `WindowReader`
sampling with a cold and a warm block cache.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from datasets.rollouts import ShardWriter, WindowReader, add_shard, rollout_schema
from envs.config_io import write_text_atomic
from envs.console import make_console
from experiments.cli import run


@dataclass(frozen=True)
class DatasetBenchConfig:
    """Dataset size and sampling pattern."""

    rounds: int = 10
    """shards"""
    episodes_per_round: int = 32
    """episodes per shard"""
    episode_steps: int = 150
    """rows per episode"""
    window: int = 64
    """frames per window (K)"""
    batch: int = 12
    """windows per sample call"""
    calls: int = 400
    """timed sample calls"""
    cache_mb: int = 1024
    """reader block cache"""
    out: str = "outputs/benchmark_dataset.json"
    """JSON output"""
    root: str = ""
    """dataset directory (default: a temporary one, removed afterwards)"""


def build(root: Path, cfg: DatasetBenchConfig) -> float:
    schema = rollout_schema(num_outputs=10, latent_dim=8, num_factors=9, num_targets=7, privileged_dim=29)
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, size=(cfg.episode_steps, 1, 120, 160), dtype=np.uint8)
    t0, rows = time.perf_counter(), 0
    for r in range(cfg.rounds):
        path = root / f"round_{r:03d}.h5"
        w = ShardWriter(path, schema)
        for e in range(cfg.episodes_per_round):
            ep = {k: np.zeros((cfg.episode_steps, *f.shape), dtype=f.dtype) for k, f in schema.items()}
            ep["camera"][:] = frames
            ep["episode"][:] = r * cfg.episodes_per_round + e
            ep["step"][:] = np.arange(cfg.episode_steps)
            w.append(ep)
            rows += cfg.episode_steps
        w.close()
        add_shard(root, path, {"round": r, "rows": cfg.episodes_per_round * cfg.episode_steps})
    return rows / (time.perf_counter() - t0)


def main(cfg: DatasetBenchConfig) -> dict:
    console = make_console()
    tmp = None if cfg.root else tempfile.TemporaryDirectory(prefix="gapbridge-dataset-bench-")
    root = Path(cfg.root or tmp.name)  # type: ignore[union-attr]
    root.mkdir(parents=True, exist_ok=True)
    write_rate = build(root, cfg)
    fields = ("camera", "prev_action", "teacher_logits", "z", "targets")
    reader = WindowReader(root, fields, cfg.window, cache_bytes=cfg.cache_mb * 1024**2)
    rng = np.random.default_rng(1)
    result = {"rows": reader.total_rows, "write_rows_per_s": write_rate, "window": cfg.window, "batch": cfg.batch}
    for phase in ("cold", "warm"):
        t0 = time.perf_counter()
        for _ in range(cfg.calls):
            reader.sample(cfg.batch, rng)
        result[f"{phase}_windows_per_s"] = cfg.calls * cfg.batch / (time.perf_counter() - t0)
    result["frames_per_s_warm"] = result["warm_windows_per_s"] * cfg.window
    result["cache_mib"] = reader.cache.bytes / 1024**2
    result["dataset_mib"] = sum(f.stat().st_size for f in root.glob("*.h5")) / 1024**2
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result["machine"] = {"platform": platform.platform(), "cpu_count": os.cpu_count()}
    reader.close()
    if tmp is not None:
        tmp.cleanup()
    console.print(json.dumps(result, indent=2))
    write_text_atomic(cfg.out, json.dumps(result, indent=2))
    return result


PRESETS = {
    "default": ("10 rounds x 32 episodes x 150 steps (48k frames), K = 64", DatasetBenchConfig()),
    "smoke": (
        "a tiny dataset",
        DatasetBenchConfig(rounds=2, episodes_per_round=2, episode_steps=40, window=8, calls=5),
    ),
}

if __name__ == "__main__":
    run(main, {"racing": PRESETS}, description=__doc__)
