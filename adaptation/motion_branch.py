"""A motion branch that never sees the commands: how well the car's motion can be measured from two camera frames.

The history encoder reads the frames *and* the previous actions, and its speed and lateral-speed estimates follow the
commands more than the car (`adaptation.estimator_fit.estimate_sources`): it predicts what a command should do, so a
slippery or weak car looks nominal and the slow factors cannot show. `cross_fit_motion` trains a fresh CNN on pairs of
consecutive recorded frames (the frame, the one before, their difference; zeros before an episode's first frame) to
regress the true body velocities, with no access to the commands, cross-fitted over episode folds so that every
row's estimate comes from a network that never saw its episode. Its estimates can then replace the student's in the
factor estimator's inputs (`experiments.research.probe_motion`): the estimator compares what the car did with what
it was told.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from adaptation.estimator_fit import EpisodeInputs, normalized_motion
from adaptation.factor_estimator import MOTION
from adaptation.losses import r2_score
from datasets.rollouts import read_shards

FIELDS = ("camera", "prev_action", "targets", "episode", "step")


@dataclass
class RecordedFrames:
    """Every row of a run's finished shards, in order: raw frames `(N, 1, H, W)` uint8 and what goes with them."""

    camera: Tensor
    prev_action: Tensor  # (N, 2)
    targets: Tensor  # (N, len(TARGET_COLUMNS))
    episode: Tensor  # (N,)
    step: Tensor  # (N,) steps since the episode's start

    def episode_inputs(self, motion: Tensor) -> EpisodeInputs:
        """Factor-estimator inputs with `motion` `(N, 3)` (normalized) as the motion estimates."""
        return EpisodeInputs(torch.cat([self.prev_action, motion], -1), self.targets, self.episode, self.step)


def load_frames(data_dir: str | Path) -> RecordedFrames:
    """All rows of the run's finished shards (about 19 kB per frame in memory)."""
    cols: dict[str, list[np.ndarray]] = {k: [] for k in FIELDS}
    for shard in read_shards(data_dir, FIELDS):
        for k in FIELDS:
            cols[k].append(shard[k])
    if not cols["episode"] or sum(len(e) for e in cols["episode"]) == 0:
        raise ValueError(f"{data_dir}: no recorded rows in the finished shards")
    d = {k: torch.from_numpy(np.concatenate(v)) for k, v in cols.items()}
    return RecordedFrames(
        d["camera"], d["prev_action"].float(), d["targets"].float(), d["episode"].long(), d["step"].long()
    )


class TwoFrameNet(nn.Module):
    """`(B, 3, H, W)` (frame, frame before, difference; 0-1) -> `(B, 3)` normalized speed, lateral speed, yaw rate.
    DeepRacer's shallow CNN trunk (conv 32 k8 s4, 64 k4 s2, 64 k3 s1), flatten, one hidden layer."""

    def __init__(self, channels: tuple[int, int, int] = (32, 64, 64), hidden: int = 256) -> None:
        super().__init__()
        c1, c2, c3 = channels
        self.trunk = nn.Sequential(
            nn.Conv2d(3, c1, 8, 4), nn.ReLU(), nn.Conv2d(c1, c2, 4, 2), nn.ReLU(), nn.Conv2d(c2, c3, 3, 1), nn.ReLU(),
            nn.Flatten(),
        )  # fmt: skip
        self.head = nn.Sequential(nn.LazyLinear(hidden), nn.ReLU(), nn.Linear(hidden, 3))

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.trunk(x))


def frame_pairs(frames: RecordedFrames, rows: Tensor) -> Tensor:
    """The network input of `rows`: each frame, the one before it in its episode (zeros at the episode's first
    step), and their difference, scaled to 0-1."""
    now = frames.camera[rows].float() / 255.0
    before_rows = (rows - 1).clamp(min=0)
    same = (rows > 0) & (frames.episode[before_rows] == frames.episode[rows]) & (frames.step[rows] > 0)
    before = frames.camera[before_rows].float() / 255.0 * same.float()[:, None, None, None]
    return torch.cat([now, before, now - before], 1)


def cross_fit_motion(
    frames: RecordedFrames,
    folds: int = 2,
    steps: int = 2500,
    batch: int = 64,
    learning_rate: float = 1e-3,
    seed: int = 0,
    after_steps: int = 30,
) -> tuple[Tensor, dict[str, float]]:
    """Normalized body-velocity estimates `(N, 3)` of every row, each from a `TwoFrameNet` trained on the other folds'
    episodes (episode id modulo `folds`), and their R^2 per velocity on the steps from `after_steps` on
    (`speed`, `lateral_speed`, `yaw_rate`)."""
    if folds < 2:
        raise ValueError(f"folds={folds}: cross-fitting needs at least 2")
    gen = torch.Generator().manual_seed(seed)
    target = normalized_motion(frames.targets)
    fold = frames.episode % folds
    pred = torch.zeros_like(target)
    for f in range(folds):
        train_rows = torch.nonzero(fold != f)[:, 0]
        test_rows = torch.nonzero(fold == f)[:, 0]
        if len(train_rows) == 0 or len(test_rows) == 0:
            raise ValueError(f"fold {f} of {folds} is empty: too few episodes to cross-fit")
        torch.manual_seed(seed + f)
        net = TwoFrameNet()
        net(frame_pairs(frames, train_rows[:1]))  # shapes the lazy layer
        opt = torch.optim.Adam(net.parameters(), lr=learning_rate)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
        for _ in range(steps):
            rows = train_rows[torch.randint(len(train_rows), (batch,), generator=gen)]
            loss = (net(frame_pairs(frames, rows)) - target[rows]).square().mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
        net.eval()
        with torch.no_grad():
            for i in range(0, len(test_rows), 1024):
                rows = test_rows[i : i + 1024]
                pred[rows] = net(frame_pairs(frames, rows))
    late = frames.step >= after_steps
    scores = {n: r2_score(pred[late, k], target[late, k]) if bool(late.any()) else float("nan") for k, n in
              enumerate(MOTION)}  # fmt: skip
    return pred, scores
