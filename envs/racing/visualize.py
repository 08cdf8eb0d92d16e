"""Plots: top-down trajectories over the track, and strips of camera frames."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from envs.racing.track import Track


def plot_trajectories(
    track: Track,
    paths: Sequence[np.ndarray],
    path: str | Path,
    labels: Sequence[str] | None = None,
    colors: Sequence[str] | None = None,
    title: str = "",
) -> Path:
    """Top-down plot: track borders, dashed centerline, and each `(T, 2)` path; written as PNG (atomically)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    left, right = track.borders()
    fig, ax = plt.subplots(figsize=(8, 6))
    for border in (left, right):
        closed = np.vstack([border, border[:1]])
        ax.plot(closed[:, 0], closed[:, 1], color="0.2", lw=1.2)
    center = np.vstack([track.dense_np, track.dense_np[:1]])
    ax.plot(center[:, 0], center[:, 1], ls="--", color="0.6", lw=0.8)
    ax.plot(*track.dense_np[0], marker="s", color="k", ms=6, label="s = 0")
    cmap = plt.get_cmap("tab10")
    for i, p in enumerate(paths):
        if len(p) == 0:
            continue
        color = colors[i] if colors else cmap(i % 10)
        label = labels[i] if labels else None
        ax.plot(p[:, 0], p[:, 1], color=color, lw=1.0, alpha=0.85, label=label)
        ax.plot(*p[0], marker="o", color=color, ms=4)
    ax.set_aspect("equal")
    ax.set_xlabel("x (m)")
    ax.set_ylabel("y (m)")
    ax.set_title(title or track.name)
    _, names = ax.get_legend_handles_labels()
    if names:
        ax.legend(loc="upper right", fontsize=7, ncol=2)
    fig.tight_layout()
    return _save(fig, path)


def save_frame_strip(
    frames: np.ndarray, path: str | Path, captions: Sequence[str] | None = None, cols: int = 6
) -> Path:
    """Grid of `(K, 1, H, W)` or `(K, H, W)` uint8 grayscale frames as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    frames = np.asarray(frames)
    if frames.ndim == 4:
        frames = frames[:, 0]
    k = len(frames)
    rows = max(1, int(np.ceil(k / cols)))
    fig, axes = plt.subplots(rows, cols, figsize=(2.2 * cols, 1.8 * rows), squeeze=False)
    for i, ax in enumerate(axes.flat):
        ax.axis("off")
        if i < k:
            ax.imshow(frames[i], cmap="gray", vmin=0, vmax=255)
            if captions:
                ax.set_title(captions[i], fontsize=7)
    fig.tight_layout()
    return _save(fig, path)


def _save(fig, path: str | Path) -> Path:
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".tmp" + path.suffix)
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
    return path
