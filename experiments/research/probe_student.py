"""Linear probes of a student's features on its run's recorded episodes: which quantities its features hold.

    python -m experiments.research.probe_student default --checkpoint runs/student/checkpoints/round_014.pt
    python -m experiments.research.probe_student default --checkpoint … --min-seconds 0   # include the starts from rest

The student is replayed over every recorded episode from its start, as on the car; for each true quantity (both
latencies, friction, motor gain, speed, lateral speed, yaw rate) a ridge regression from the frozen image embedding,
the embeddings of the frame and the one before (`image pair`: what a two-frame branch without the commands could read),
the history features and both is fitted on the steps of most episodes and scored (R^2) on every `--holdout-every`-th
episode, beside the student's own estimate on the same steps. A probe far above the head: the features hold the
quantity and the head fails to read it (loss weights, training). Probe and head both low: the features do not hold
it, and the encoder has to learn it. Steps earlier than `--min-seconds` after a start are left out (the start from
rest makes speed easy). Writes `probe.json`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from rich.table import Table

from adaptation.probe import SOURCES, collect_features, probe
from datasets.run_layout import recorded_data
from envs.config_io import write_text_atomic
from envs.console import make_console
from envs.errors import check_range
from experiments.cli import run
from student.dagger import bf16_enabled
from student.loaded import load_student


@dataclass(frozen=True)
class ProbeConfig:
    """Feature probes of one student."""

    checkpoint: str = ""
    """student checkpoint (required)"""
    data_dir: str = ""
    """the run's shard folder (default: `data` beside the checkpoint's `checkpoints` folder)"""
    min_seconds: float = 2.0
    """leave out steps earlier than this after an episode start"""
    holdout_every: int = 5
    """every this-many-th episode is held out for scoring"""
    ridge: float = 1e-2
    """ridge penalty (times the number of training steps) on the standardized features"""
    bf16: Literal["auto", "on", "off"] = "auto"
    """bfloat16 autocast for the replay (auto: on CPUs with native bf16, as DAgger trains)"""
    out_dir: str = ""
    """where probe.json goes (default: `probe` in the run directory)"""

    def __post_init__(self) -> None:
        check_range("min_seconds", self.min_seconds, 0.0, 3600.0)
        check_range("holdout_every", self.holdout_every, 2, 1000)
        check_range("ridge", self.ridge, 0.0, 1e6)


def main(cfg: ProbeConfig) -> dict:
    data_dir = recorded_data(cfg.checkpoint, cfg.data_dir)
    student = load_student(cfg.checkpoint)
    t0 = time.perf_counter()
    min_step = int(round(cfg.min_seconds * student.env_cfg.control_hz))
    features = collect_features(student.model, data_dir, min_step, bf16=bf16_enabled(cfg.bf16))
    result = {
        "checkpoint": cfg.checkpoint,
        "data_dir": str(data_dir),
        "min_seconds": cfg.min_seconds,
        "steps": int(len(features["episode"])),
        "episodes": int(len(torch.unique(features["episode"]))),
        "feature_dims": {k: int(features[k].shape[1]) for k in ("image", "history") if k in features},
        "r2": probe(features, cfg.holdout_every, cfg.ridge),
    }
    result["seconds"] = time.perf_counter() - t0
    console = make_console()
    title = (
        f"held-out R² ({result['steps']:,} steps of {result['episodes']} episodes, ≥ {cfg.min_seconds:g} s after a "
        f"start; 1 episode in {cfg.holdout_every} held out)"
    )
    table = Table(title=title)
    table.add_column("quantity")
    for col in ("head", *SOURCES):
        table.add_column(col if col == "head" else f"probe: {col}")
    for name, row in result["r2"].items():
        table.add_row(name, *(f"{row[c]:.3f}" if c in row else "—" for c in ("head", *SOURCES)))
    console.print(table)
    out = Path(cfg.out_dir) if cfg.out_dir else data_dir.parent / "probe"
    write_text_atomic(out / "probe.json", json.dumps(result, indent=2))
    console.print(f"results in [bold]{out.resolve()}[/]")
    return result


PRESETS = {"default": ("ridge probes of the image and history features on the run's episodes", ProbeConfig())}

if __name__ == "__main__":
    run(main, {"racing": PRESETS}, description=__doc__)
