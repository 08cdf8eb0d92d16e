"""The one W&B logger: explicit global step, config from the dataclass, images/videos/artifacts; offline by default.

`check_login` refuses `--wandb.mode online` without W&B credentials before a run builds anything (wandb itself would
fail only at `wandb.init`, with a traceback, after the envs are built).
"""

from __future__ import annotations

import netrc
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import numpy as np

from envs.config_io import to_dict
from envs.errors import GapbridgeError


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


class WandbLoginError(GapbridgeError):
    """`--wandb.mode online` without W&B credentials."""


def _netrc_files() -> list[Path]:
    """The netrc files wandb reads: $NETRC when set, else ~/.netrc and ~/_netrc."""
    if os.environ.get("NETRC"):
        return [Path(os.environ["NETRC"]).expanduser()]
    return [Path("~/.netrc").expanduser(), Path("~/_netrc").expanduser()]


def wandb_credentials() -> str:
    """Where wandb would find credentials without asking: the variable or netrc file that holds them ('' when none
    does). `wandb login` writes a netrc entry for the W&B host ($WANDB_BASE_URL, default api.wandb.ai)."""
    for var in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE"):
        if os.environ.get(var):
            return var
    host = urlsplit(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").netloc
    for path in _netrc_files():
        try:
            entry = netrc.netrc(str(path)).authenticators(host)
        except (OSError, netrc.NetrcParseError):
            continue
        if entry and entry[2]:
            return str(path)
    return ""


def check_login(cfg: WandbConfig) -> None:
    """Refuse `--wandb.mode online` without credentials, in one line that says how to log in."""
    if cfg.mode == "online" and not wandb_credentials():
        raise WandbLoginError(
            "--wandb.mode online needs a W&B login and none was found: run `wandb login` (or set WANDB_API_KEY), "
            "or use --wandb.mode offline (sync later with `wandb sync`)"
        )


def wandb_flags(cfg: WandbConfig) -> list[str]:
    """`cfg` as a script's `--wandb.*` flags, for a stage run in its own process."""
    flags = ["--wandb.mode", cfg.mode, "--wandb.project", cfg.project, "--wandb.entity", cfg.entity]
    return [*flags, "--wandb.group", cfg.group, "--wandb.tags", *cfg.tags]


class RunLogger:
    """Thin wrapper over a wandb run; every call is a no-op when disabled."""

    def __init__(self, cfg: WandbConfig, run_dir: str | Path, name: str, config: Any, run_id: str = "") -> None:
        self.cfg = cfg
        self.run = None
        if cfg.mode == "disabled":
            return
        check_login(cfg)
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
