"""Adaptation losses and estimate metrics: z-hat regression, latency classification, scalar estimates."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from envs.task import EstimateSpec


def latency_class(seconds: Tensor, dt_physics: float, classes: int) -> Tensor:
    """Latency in seconds -> class index (physics substeps), clamped to the class range."""
    return torch.round(seconds / dt_physics).long().clamp(0, classes - 1)


def adaptation_losses(
    heads: dict[str, Tensor],
    z: Tensor,
    targets: Tensor,
    mask: Tensor,
    dt_physics: float,
    spec: EstimateSpec,
    factor_mask: Tensor | None = None,
    estimate_weights: dict[str, float] | None = None,
) -> dict[str, Tensor]:
    """Masked mean losses over `(B, T)` positions: z-hat MSE, a cross-entropy per latency of `spec`, estimate MSE.

    `factor_mask` (default `mask`) selects the positions for the latencies, friction and motor gain: a factor
    estimator reads further back than the history encoder, so fewer positions of a window hold its full context.
    `estimate_weights` scales named estimates' squared errors inside the estimate loss (others 1; the mean's
    denominator is unchanged, so a weight of w counts that estimate w times)."""
    w = mask.float()
    fw = w if factor_mask is None else factor_mask.float()
    denom, fdenom = w.sum().clamp(min=1.0), fw.sum().clamp(min=1.0)
    z_loss = ((heads["z_hat"] - z).square().mean(-1) * w).sum() / denom
    ce = lambda logits, cls: F.cross_entropy(logits.flatten(0, 1), cls.flatten(), reduction="none")  # noqa: E731
    losses = {"z": z_loss}
    for name in spec.latencies:
        logits = heads[f"{name}_logits"]
        cls = latency_class(targets[..., spec.column(name)], dt_physics, logits.shape[-1])
        losses[name] = (ce(logits, cls) * fw.flatten()).sum() / fdenom
    if not spec.regressions:
        return losses
    sq = (heads["estimates"] - spec.normalize(targets)).square()
    factor_col = torch.tensor([name in spec.factors for name in spec.regressions], device=sq.device)
    col_w = torch.where(factor_col, fw.unsqueeze(-1), w.unsqueeze(-1))
    names = estimate_weights or {}
    unknown = set(names) - set(spec.regressions)
    if unknown:
        raise ValueError(f"estimate_weights: unknown estimates {sorted(unknown)}; known: {spec.regressions}")
    scale = sq.new_tensor([float(names.get(name, 1.0)) for name in spec.regressions])
    losses["estimates"] = (sq * col_w * scale).sum() / col_w.sum().clamp(min=1.0)
    return losses


def r2_score(pred: Tensor, target: Tensor) -> float:
    """Coefficient of determination (1 - SSE / SST)."""
    pred, target = pred.double().flatten(), target.double().flatten()
    sst = (target - target.mean()).square().sum()
    if sst <= 0:
        return float("nan")
    return float(1.0 - (pred - target).square().sum() / sst)


def expected_class(logits: Tensor) -> Tensor:
    """The expected class index under the softmax of `logits` `(..., C)` (for latencies: substeps)."""
    return (logits.float().softmax(-1) * torch.arange(logits.shape[-1], dtype=torch.float32)).sum(-1)


def estimate_metrics(
    heads: dict[str, Tensor], targets: Tensor, dt_physics: float, frame_substeps: int, spec: EstimateSpec
) -> dict[str, float]:
    """Quality of the explicit estimates on flat `(M, ...)` tensors.

    Each latency of `spec`: exact-class accuracy, accuracy within one control frame (`frame_substeps`) and what always
    guessing the mean class would score there, and the R^2 of the expected latency under the predicted class
    distribution (0 = no better than a constant guess). With an action and a camera latency, the same for the loop
    latency (their sum, what the student can see: the delay from a command to the frame that shows its effect).
    Within one frame is a weak test when the latency range spans little more than a frame: then the constant guess
    scores close to 100% and only the R^2 and the error against the constant guess say whether latency is estimated.
    Each regression: R^2 and mean absolute error in physical units.
    """
    out: dict[str, float] = {}
    cls, pred, expected = {}, {}, {}
    for name in spec.latencies:
        logits = heads[f"{name}_logits"]
        cls[name] = latency_class(targets[:, spec.column(name)], dt_physics, logits.shape[-1])
        pred[name], expected[name] = logits.argmax(-1), expected_class(logits)
        constant = torch.round(cls[name].float().mean()).long()
        out[f"{name}_r2"] = r2_score(expected[name], cls[name].float())
        out[f"{name}_acc"] = float((pred[name] == cls[name]).float().mean())
        out[f"{name}_within_frame"] = float(((pred[name] - cls[name]).abs() <= frame_substeps).float().mean())
        out[f"{name}_within_frame_constant_guess"] = float(
            ((constant - cls[name]).abs() <= frame_substeps).float().mean()
        )
    if {"action_latency", "camera_latency"} <= set(spec.latencies):
        loop = cls["action_latency"] + cls["camera_latency"]
        total_err = (pred["action_latency"] + pred["camera_latency"] - loop).abs()
        total_constant = torch.round(loop.float().mean()).long()
        out["loop_latency_r2"] = r2_score(expected["action_latency"] + expected["camera_latency"], loop.float())
        out["loop_latency_within_frame"] = float((total_err <= frame_substeps).float().mean())
        out["loop_latency_mae_ms"] = float(total_err.float().mean() * dt_physics * 1000.0)
        out["loop_latency_mae_ms_constant_guess"] = float(
            (total_constant - loop).abs().float().mean() * dt_physics * 1000.0
        )
    if spec.regressions:
        est = spec.denormalize(heads["estimates"])
        for name in spec.regressions:
            col = targets[:, spec.column(name)]
            out[f"{name}_r2"] = r2_score(est[name], col)
            out[f"{name}_mae"] = float((est[name] - col).abs().mean())
    return out
