"""Linear probes of a student's features: is a quantity in what the student computes, or does its head fail to read it?

A student estimates the car's motion and the world's factors from its history features, which it computes from
per-frame image embeddings and its previous actions. When an estimate is poor there are two causes with different
cures: the features do not hold the quantity (the encoder must learn it: another input, target or loss), or they
hold it and the head does not read it out (a training problem: loss weights, more steps). A ridge regression from the
frozen features to the true value, fitted on some recorded episodes and scored on others, tells them apart: its R^2
is a lower bound on what the features hold linearly, the head's R^2 on the same held-out steps is what the student
delivers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from adaptation.estimator_fit import replay_episodes
from adaptation.losses import r2_score
from envs.vehicle import VEHICLE_ESTIMATES

ESTIMATES, TARGET_COLUMNS = VEHICLE_ESTIMATES.regressions, VEHICLE_ESTIMATES.targets

SOURCES = ("image", "image pair", "history", "image+history")
"""feature sets a probe reads: the image embedding of the step's frame, the embeddings of it and of the frame before
(zeros before an episode's first frame: what a branch that compares two frames, without the commands, could read),
the history encoder's output, both image and history"""


@torch.no_grad()
def collect_features(
    model, data_dir: str | Path, min_step: int = 0, batch_frames: int = 4096, bf16: bool = False
) -> dict[str, Tensor]:
    """Replay every recorded episode through the frozen student (`replay_episodes`) and keep, for each step at least
    `min_step` steps after its episode's start: the image embedding `image` (M, E), the previous step's `image_prev`
    (M, E; zeros at an episode's first step), the history features `history` (M, H; absent for a student without a
    history encoder), the student's estimates in physical units `estimates`
    (M, len(ESTIMATES)), the true `targets` (M, len(TARGET_COLUMNS)) and the `episode` ids (M,)."""
    captured: dict[str, Tensor] = {}
    hooks = [model.encoder.register_forward_hook(lambda m, i, o: captured.__setitem__("image", o))]
    if model.history is not None:
        hooks.append(model.history.register_forward_hook(lambda m, i, o: captured.__setitem__("history", o)))
    out: dict[str, list[Tensor]] = {"image": [], "image_prev": [], "history": [], "estimates": [], "targets": [],
                                    "episode": []}  # fmt: skip
    try:
        for batch in replay_episodes(model, data_dir, ("targets", "step"), batch_frames, bf16):
            b, t = batch.mask.shape
            image = captured["image"].float().view(b, t, -1)
            seen_before = torch.cat([torch.zeros_like(batch.mask[:, :1]), batch.mask[:, :-1]], 1)  # left padding
            prev = torch.cat([torch.zeros_like(image[:, :1]), image[:, :-1]], 1) * seen_before[..., None]
            parts = {"image": image, "image_prev": prev}
            if "history" in captured:
                parts["history"] = captured["history"].float()
            if "estimates" in batch.heads:
                est = VEHICLE_ESTIMATES.denormalize(batch.heads["estimates"])
                parts["estimates"] = torch.stack([est[name] for name in ESTIMATES], -1)
            keeps = [np.asarray(batch.cols["step"][a:b_]) >= min_step for a, b_ in batch.spans]
            for name, x in parts.items():
                out[name].extend(r[torch.from_numpy(k)] for r, k in zip(batch.unpad(x), keeps))
            for (a, b_), keep in zip(batch.spans, keeps):
                out["targets"].append(torch.from_numpy(np.asarray(batch.cols["targets"][a:b_])[keep]))
                out["episode"].append(torch.from_numpy(np.asarray(batch.cols["episode"][a:b_])[keep].astype(np.int64)))
    finally:
        for h in hooks:
            h.remove()
    if not out["episode"] or sum(len(e) for e in out["episode"]) == 0:
        raise ValueError(f"{data_dir}: no recorded step at least {min_step} steps after an episode start")
    return {k: torch.cat(v) for k, v in out.items() if v}


def ridge_r2(x: Tensor, y: Tensor, test: Tensor, ridge: float = 1e-2) -> float:
    """Held-out R^2 of a ridge regression `x[~test] -> y[~test]` (features standardized on the training rows, penalty
    `ridge` times the number of training rows), scored on `x[test]`."""
    if not bool((~test).any()) or not bool(test.any()):
        raise ValueError("ridge_r2 needs both training and held-out rows")
    x = x.double()
    mu, sd = x[~test].mean(0), x[~test].std(0) + 1e-6
    xn = torch.cat([(x - mu) / sd, torch.ones(len(x), 1, dtype=x.dtype)], 1)
    a = xn[~test]
    eye = torch.eye(a.shape[1], dtype=x.dtype)
    eye[-1, -1] = 0.0  # the intercept is not penalized
    w = torch.linalg.solve(a.T @ a + ridge * len(a) * eye, a.T @ y[~test].double())
    return r2_score(xn[test] @ w, y[test])


def probe(features: dict[str, Tensor], holdout_every: int = 5, ridge: float = 1e-2) -> dict[str, dict[str, float]]:
    """Per target: the held-out R^2 of a ridge probe from each feature source and of the student's own estimate (for
    the quantities it estimates), on the same steps of every `holdout_every`-th episode."""
    test = features["episode"] % holdout_every == 0
    sources = {"image": features["image"]}
    if "image_prev" in features:
        sources["image pair"] = torch.cat([features["image"], features["image_prev"]], -1)
    if "history" in features:
        sources["history"] = features["history"]
        sources["image+history"] = torch.cat([features["image"], features["history"]], -1)
    out: dict[str, dict[str, float]] = {}
    for i, name in enumerate(TARGET_COLUMNS):
        y = features["targets"][:, i].double()
        if float(y[test].std()) == 0.0:
            continue  # constant on the held-out steps (a factor not randomized): nothing to score
        row = {src: ridge_r2(x, y, test, ridge) for src, x in sources.items()}
        if name in ESTIMATES and "estimates" in features:
            row["head"] = r2_score(features["estimates"][test, ESTIMATES.index(name)], y[test])
        out[name] = row
    return out
