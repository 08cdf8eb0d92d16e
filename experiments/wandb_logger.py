"""The one W&B logger: explicit global step, config from the dataclass, images/videos/artifacts; offline by default."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from envs.config_io import to_dict


@dataclass(frozen=True)
class WandbConfig:
    """Weights & Biases settings."""

    mode: Literal["online", "offline", "disabled"] = "offline"
    """online (needs a login), offline (sync later with `wandb sync`), or disabled"""
    project: str = "gapbridge"
    """W&B project"""
    entity: str = ""
    """W&B entity (team or user); empty = your default"""
    group: str = ""
    """run group (e.g. an ablation name)"""
    tags: tuple[str, ...] = ()
    """run tags"""


class RunLogger:
    """Thin wrapper over a wandb run; every call is a no-op when disabled."""

    def __init__(self, cfg: WandbConfig, run_dir: str | Path, name: str, config: Any, run_id: str = "") -> None:
        self.cfg = cfg
        self.run = None
        if cfg.mode == "disabled":
            return
        import wandb

        os.environ.setdefault("WANDB_SILENT", "true")
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=cfg.project,
            entity=cfg.entity or None,
            group=cfg.group or None,
            tags=list(cfg.tags) or None,
            name=name,
            dir=str(run_dir),
            mode=cfg.mode,
            config=to_dict(config),
            id=run_id or None,
            resume="allow" if run_id else None,
        )
        self.run.define_metric("*", step_metric="global_step")

    @property
    def run_id(self) -> str:
        return self.run.id if self.run is not None else ""

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self.run is not None:
            self.run.log({**metrics, "global_step": step})

    def image(self, key: str, path: str | Path, step: int) -> None:
        if self.run is not None:
            import wandb

            self.run.log({key: wandb.Image(str(path)), "global_step": step})

    def video(self, key: str, frames: np.ndarray, step: int, fps: int = 15) -> None:
        """`(T, 1, H, W)` uint8 frames."""
        if self.run is not None:
            import wandb

            frames = np.asarray(frames)
            if frames.shape[1] == 1:
                frames = np.repeat(frames, 3, axis=1)
            self.run.log({key: wandb.Video(frames, fps=fps, format="mp4"), "global_step": step})

    def table(self, key: str, columns: list[str], rows: list[list], step: int) -> None:
        if self.run is not None:
            import wandb

            self.run.log({key: wandb.Table(columns=columns, data=rows), "global_step": step})

    def artifact(self, path: str | Path, name: str, kind: str) -> None:
        if self.run is not None:
            import wandb

            art = wandb.Artifact(name, type=kind)
            art.add_file(str(path))
            self.run.log_artifact(art)

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()
