"""Adaptation losses and estimate metrics: z-hat regression, latency classification, scalar estimates."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from adaptation.history_encoder import ESTIMATES

TARGET_COLUMNS = ("action_latency", "camera_latency", "friction", "motor_gain", "speed", "lateral_speed", "yaw_rate")
"""columns of the dataset's `targets` field (latencies in seconds, speeds in m/s, yaw rate in rad/s)"""
ESTIMATE_SCALE = {
    "friction": (1.0, 0.3),
    "motor_gain": (1.0, 0.15),
    "speed": (2.0, 1.5),
    "lateral_speed": (0.0, 0.08),
    "yaw_rate": (0.0, 1.5),
}
"""(centre, scale) used to normalize each regressed estimate"""


def latency_class(seconds: Tensor, dt_physics: float, classes: int) -> Tensor:
    """Latency in seconds -> class index (physics substeps), clamped to the class range."""
    return torch.round(seconds / dt_physics).long().clamp(0, classes - 1)


def normalized_targets(targets: Tensor) -> Tensor:
    """`(..., len(TARGET_COLUMNS))` dataset targets -> `(..., len(ESTIMATES))` normalized regression targets."""
    cols = []
    for name in ESTIMATES:
        centre, scale = ESTIMATE_SCALE[name]
        cols.append((targets[..., TARGET_COLUMNS.index(name)] - centre) / scale)
    return torch.stack(cols, dim=-1)


def denormalize_estimates(estimates: Tensor) -> dict[str, Tensor]:
    return {
        name: estimates[..., i] * ESTIMATE_SCALE[name][1] + ESTIMATE_SCALE[name][0] for i, name in enumerate(ESTIMATES)
    }


FACTOR_ESTIMATES = ("friction", "motor_gain")
"""the per-episode factors among `ESTIMATES` (the body velocities are per frame)"""


def adaptation_losses(
    heads: dict[str, Tensor],
    z: Tensor,
    targets: Tensor,
    mask: Tensor,
    dt_physics: float,
    factor_mask: Tensor | None = None,
    estimate_weights: dict[str, float] | None = None,
) -> dict[str, Tensor]:
    """Masked mean losses over `(B, T)` positions: z-hat MSE, latency cross-entropies, estimate MSE.

    `factor_mask` (default `mask`) selects the positions for the latencies, friction and motor gain: a factor
    estimator reads further back than the history encoder, so fewer positions of a window hold its full context.
    `estimate_weights` scales named estimates' squared errors inside the estimate loss (others 1; the mean's
    denominator is unchanged, so a weight of w counts that estimate w times)."""
    w = mask.float()
    fw = w if factor_mask is None else factor_mask.float()
    denom, fdenom = w.sum().clamp(min=1.0), fw.sum().clamp(min=1.0)
    z_loss = ((heads["z_hat"] - z).square().mean(-1) * w).sum() / denom
    act_cls = latency_class(targets[..., 0], dt_physics, heads["action_latency_logits"].shape[-1])
    cam_cls = latency_class(targets[..., 1], dt_physics, heads["camera_latency_logits"].shape[-1])
    ce = lambda logits, cls: F.cross_entropy(logits.flatten(0, 1), cls.flatten(), reduction="none")  # noqa: E731
    act_loss = (ce(heads["action_latency_logits"], act_cls) * fw.flatten()).sum() / fdenom
    cam_loss = (ce(heads["camera_latency_logits"], cam_cls) * fw.flatten()).sum() / fdenom
    sq = (heads["estimates"] - normalized_targets(targets)).square()
    factor_col = torch.tensor([name in FACTOR_ESTIMATES for name in ESTIMATES])
    col_w = torch.where(factor_col, fw.unsqueeze(-1), w.unsqueeze(-1))
    names = estimate_weights or {}
    unknown = set(names) - set(ESTIMATES)
    if unknown:
        raise ValueError(f"estimate_weights: unknown estimates {sorted(unknown)}; known: {ESTIMATES}")
    scale = sq.new_tensor([float(names.get(name, 1.0)) for name in ESTIMATES])
    est_loss = (sq * col_w * scale).sum() / col_w.sum().clamp(min=1.0)
    return {"z": z_loss, "action_latency": act_loss, "camera_latency": cam_loss, "estimates": est_loss}


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
    heads: dict[str, Tensor], targets: Tensor, dt_physics: float, frame_substeps: int
) -> dict[str, float]:
    """Quality of the explicit estimates on flat `(M, ...)` tensors.

    Latency: exact-class accuracy and accuracy within one control frame (`frame_substeps`), for action latency and
    for the total loop latency (action + camera), plus what always guessing the mean class would score; and the R^2
    of the expected action latency and of the expected loop latency under the predicted class distributions (0 = no
    better than a constant guess). The loop latency (action + camera) is what the student can see: the delay from a
    command to the frame that shows its effect.
    Within one frame is a weak test when the latency range spans little more than a frame: then the constant guess
    scores close to 100% and only the R^2 and the error against the constant guess say whether latency is estimated.
    """
    act_cls = latency_class(targets[:, 0], dt_physics, heads["action_latency_logits"].shape[-1])
    cam_cls = latency_class(targets[:, 1], dt_physics, heads["camera_latency_logits"].shape[-1])
    act_pred = heads["action_latency_logits"].argmax(-1)
    cam_pred = heads["camera_latency_logits"].argmax(-1)
    total_err = (act_pred + cam_pred - act_cls - cam_cls).abs()
    constant = torch.round(act_cls.float().mean()).long()
    total_constant = torch.round((act_cls + cam_cls).float().mean()).long()
    expected = expected_class(heads["action_latency_logits"])  # in substeps
    expected_loop = expected + expected_class(heads["camera_latency_logits"])
    est = denormalize_estimates(heads["estimates"])
    out = {
        "action_latency_r2": r2_score(expected, act_cls.float()),
        "loop_latency_r2": r2_score(expected_loop, (act_cls + cam_cls).float()),
        "action_latency_acc": float((act_pred == act_cls).float().mean()),
        "action_latency_within_frame": float(((act_pred - act_cls).abs() <= frame_substeps).float().mean()),
        "action_latency_within_frame_constant_guess": float(
            ((constant - act_cls).abs() <= frame_substeps).float().mean()
        ),
        "loop_latency_within_frame": float((total_err <= frame_substeps).float().mean()),
        "loop_latency_mae_ms": float(total_err.float().mean() * dt_physics * 1000.0),
        "loop_latency_mae_ms_constant_guess": float(
            (total_constant - act_cls - cam_cls).abs().float().mean() * dt_physics * 1000.0
        ),
        "camera_latency_acc": float((cam_pred == cam_cls).float().mean()),
    }
    for name in ESTIMATES:
        col = targets[:, TARGET_COLUMNS.index(name)]
        out[f"{name}_r2"] = r2_score(est[name], col)
        out[f"{name}_mae"] = float((est[name] - col).abs().mean())
    return out
