"""Fit a student's factor estimator on a run's recorded episodes.

During DAgger the estimator trains on the same few windows per gradient step as the policy, far less than it needs:
its inputs are five numbers per step, so once the history encoder is trained, the estimator can be fitted to every
recorded episode at little cost. `episode_inputs` runs the (frozen) student over each recorded episode from its
start, exactly as it runs on the car, and keeps the estimator's inputs and the true factors; `fit_estimator` trains
the estimator alone on random windows of them, holding out every `holdout_every`-th episode to report what it does
on episodes it never saw.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from adaptation.factor_estimator import FACTORS, FactorEstimator
from adaptation.losses import ESTIMATE_SCALE, TARGET_COLUMNS, expected_class, latency_class, r2_score
from datasets.rollouts import read_shards


@dataclass
class EpisodeInputs:
    """Flat rows of all recorded episodes (each episode's rows contiguous, in step order)."""

    inputs: Tensor  # (M, 5) the estimator's inputs
    targets: Tensor  # (M, len(TARGET_COLUMNS))
    episode: Tensor  # (M,) episode id
    step: Tensor  # (M,) step within the episode


@dataclass
class ReplayBatch:
    """Recorded episodes of one shard run through the student together, left-padded to a common length."""

    cols: dict[str, np.ndarray]  # the shard's fields
    spans: list[tuple[int, int]]  # each episode's rows [a, b) in `cols`; row i of the batch is episode i
    prev_action: Tensor  # (B, T, 2), zero where padded
    mask: Tensor  # (B, T) True on the episode's steps
    heads: dict[str, Tensor]  # the student's heads (float32)

    def unpad(self, x: Tensor) -> list[Tensor]:
        """Per episode, the rows of `x` (B, T, ...) that hold its steps, in step order."""
        t = x.shape[1]
        return [x[row, t - (b - a) :] for row, (a, b) in enumerate(self.spans)]


@torch.no_grad()
def replay_episodes(
    model, data_dir: str | Path, fields: tuple[str, ...] = (), batch_frames: int = 4096, bf16: bool = False
) -> Iterator[ReplayBatch]:
    """Run the (frozen, eval-mode) student over every episode of the run's finished shards from its start, exactly as
    it runs on the car, one shard in memory at a time.

    Episodes of a shard are padded to a common length on the left (padding is masked, as at an episode start) and run
    through `model.forward_window` in batches of about `batch_frames` frames; `bf16` runs it under bfloat16 autocast,
    as DAgger trains (about 1.6x faster here; outputs within a few thousandths of the float32 pass). `fields` are read
    besides the camera, previous actions and episode ids."""
    was_training = model.training
    model.eval()
    try:
        for cols in read_shards(data_dir, tuple(dict.fromkeys(("camera", "prev_action", "episode", *fields)))):
            n = len(cols["episode"])
            if n == 0:
                continue
            starts = np.flatnonzero(np.r_[True, cols["episode"][1:] != cols["episode"][:-1]])
            ends = np.r_[starts[1:], n]
            order = np.argsort(ends - starts)  # similar lengths batch together: little padding
            i = 0
            while i < len(order):
                longest = int(max(ends[order[i]] - starts[order[i]], 1))
                j = i + max(1, batch_frames // longest)
                group = order[i:j]
                longest = int((ends[group] - starts[group]).max())
                spans = [(int(starts[e]), int(ends[e])) for e in group]
                # raw uint8 frames, scaled inside the encoder as on the car (a quarter of the memory traffic)
                cam = torch.zeros(len(group), longest, 1, *cols["camera"].shape[-2:], dtype=torch.uint8)
                prev = torch.zeros(len(group), longest, 2)
                mask = torch.zeros(len(group), longest, dtype=torch.bool)
                for row, (a, b) in enumerate(spans):
                    cam[row, longest - (b - a) :] = torch.from_numpy(cols["camera"][a:b])
                    prev[row, longest - (b - a) :] = torch.from_numpy(cols["prev_action"][a:b])
                    mask[row, longest - (b - a) :] = True
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    _, heads = model.forward_window(cam, prev, mask)
                yield ReplayBatch(cols, spans, prev, mask, {k: v.float() for k, v in heads.items()})
                i = j
    finally:
        model.train(was_training)


def episode_inputs(model, data_dir: str | Path, batch_frames: int = 4096, bf16: bool = False) -> EpisodeInputs:
    """The estimator's inputs over every episode in the run's finished shards (`replay_episodes`), with the true
    targets, episode ids and steps."""
    out: dict[str, list[Tensor]] = {"inputs": [], "targets": [], "episode": [], "step": []}
    for batch in replay_episodes(model, data_dir, ("targets", "step"), batch_frames, bf16):
        x = FactorEstimator.inputs(batch.prev_action, batch.heads["estimates"])
        out["inputs"].extend(v.float() for v in batch.unpad(x))
        for a, b in batch.spans:
            for k in ("targets", "episode", "step"):
                out[k].append(torch.from_numpy(np.asarray(batch.cols[k][a:b])))
    if not out["inputs"]:
        raise ValueError(f"{data_dir}: no recorded episodes in the finished shards")
    return EpisodeInputs(*(torch.cat(out[k]) for k in ("inputs", "targets", "episode", "step")))


def _windows(data: EpisodeInputs, ends: Tensor, length: int) -> tuple[Tensor, Tensor, Tensor]:
    """Windows of `length` rows ending at `ends`; rows of another episode are masked (and zeroed)."""
    idx = ends[:, None] - torch.arange(length - 1, -1, -1)[None, :]
    valid = idx >= 0
    idx = idx.clamp(min=0)
    mask = valid & (data.episode[idx] == data.episode[ends][:, None])
    x = data.inputs[idx] * mask.unsqueeze(-1)
    return x, data.targets[idx], mask


def _losses(heads: dict[str, Tensor], targets: Tensor, weights: Tensor, dt_physics: float) -> Tensor:
    denom = weights.sum().clamp(min=1.0)

    def ce(logits: Tensor, column: int) -> Tensor:
        cls = latency_class(targets[..., column], dt_physics, logits.shape[-1])
        return (F.cross_entropy(logits.flatten(0, 1), cls.flatten(), reduction="none") * weights.flatten()).sum()

    factors = torch.stack(
        [(targets[..., TARGET_COLUMNS.index(n)] - ESTIMATE_SCALE[n][0]) / ESTIMATE_SCALE[n][1] for n in FACTORS], -1
    )
    mse = ((heads["factors"] - factors).square().mean(-1) * weights).sum()
    return (ce(heads["action_latency_logits"], 0) + ce(heads["camera_latency_logits"], 1) + mse) / denom


SCORES = ("action_latency_r2", "loop_latency_r2", *(f"{name}_r2" for name in FACTORS))


@torch.no_grad()
def score(estimator: FactorEstimator, data: EpisodeInputs, rows: Tensor, dt_physics: float) -> dict[str, float]:
    """R^2 of the expected action and loop latency (in substeps) and of friction and motor gain, on `rows`, each
    output taken once its episode has run the estimator's receptive field."""
    ctx = estimator.cfg.receptive_field
    ends = rows[data.step[rows] >= ctx - 1]
    if len(ends) == 0:  # no episode that long
        return {k: float("nan") for k in SCORES}
    preds = []
    for chunk in torch.split(ends, 8192):
        x, _, mask = _windows(data, chunk, ctx)
        heads = estimator(x, mask)
        preds.append({k: v[:, -1] for k, v in heads.items()})
    heads = {k: torch.cat([p[k] for p in preds]) for k in preds[0]}
    t = data.targets[ends]
    act = latency_class(t[:, 0], dt_physics, heads["action_latency_logits"].shape[-1]).float()
    cam = latency_class(t[:, 1], dt_physics, heads["camera_latency_logits"].shape[-1]).float()
    e_act, e_cam = expected_class(heads["action_latency_logits"]), expected_class(heads["camera_latency_logits"])
    out = {"action_latency_r2": r2_score(e_act, act), "loop_latency_r2": r2_score(e_act + e_cam, act + cam)}
    for i, name in enumerate(FACTORS):
        centre, scale = ESTIMATE_SCALE[name]
        out[f"{name}_r2"] = r2_score(heads["factors"][:, i] * scale + centre, t[:, TARGET_COLUMNS.index(name)])
    return out


def fit_estimator(
    estimator: FactorEstimator,
    data: EpisodeInputs,
    dt_physics: float,
    steps: int = 4000,
    batch: int = 32,
    window: int = 64,
    learning_rate: float = 3e-3,
    holdout_every: int = 10,
    seed: int = 0,
) -> dict[str, float]:
    """Train `estimator` (only) on random windows of the recorded episodes; every `holdout_every`-th episode is held
    out. Returns the scores on the training and held-out episodes (`train/…`, `heldout/…`)."""
    gen = torch.Generator().manual_seed(seed)
    held = (data.episode % holdout_every) == 0
    train_rows = torch.nonzero(~held)[:, 0]
    if len(train_rows) == 0:
        raise ValueError("no episodes left to fit the factor estimator on")
    ctx = estimator.cfg.receptive_field - 1
    opt = torch.optim.Adam(estimator.parameters(), lr=learning_rate)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps, eta_min=0.1 * learning_rate)
    was_training = estimator.training
    estimator.train()
    pos = torch.arange(window)[None, :]
    for _ in range(steps):
        ends = train_rows[torch.randint(0, len(train_rows), (batch,), generator=gen)]
        x, targets, mask = _windows(data, ends, window)
        # a position carries a loss once its receptive field lies inside the window, or from its episode start on
        weights = (mask & ((pos >= ctx) | ~mask[:, :1])).float()
        loss = _losses(estimator(x, mask), targets, weights, dt_physics)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
    estimator.train(was_training)
    out = {f"train/{k}": v for k, v in score(estimator, data, train_rows, dt_physics).items()}
    held_rows = torch.nonzero(held)[:, 0]
    out.update({f"heldout/{k}": v for k, v in score(estimator, data, held_rows, dt_physics).items()})
    out["episodes"] = float(len(torch.unique(data.episode)))
    return out
