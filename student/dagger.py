"""DAgger: the camera student drives (β-mixed with the teacher), the teacher labels every visited state.

Each round: reset the collection envs, drive `steps_per_round` steps choosing per env and step between the
teacher's and the student's action (β schedule, optional gating), stage whole episodes per env and append them to
this round's HDF5 shard; then train on windows sampled from all rounds' shards (aggregation), evaluate, checkpoint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from adaptation.losses import adaptation_losses
from envs.errors import ConfigError, check_range
from student.model import StudentModel


@dataclass(frozen=True)
class DaggerConfig:
    """Schedule and sizes of a DAgger run."""

    rounds: int = 14
    """collection + training rounds"""
    beta: Literal["lbc", "exponential", "zero"] = "lbc"
    """probability that the teacher drives: lbc 0.5 * decay^round (student 0.5 + 0.5 (1 - decay^round)),
    exponential decay^round, zero = the student always drives"""
    beta_decay: float = 0.95
    """decay of the beta schedule"""
    gating: bool = False
    """execute the student's action whenever the teacher gives it at least `gate_threshold` probability"""
    gate_threshold: float = 0.2
    """teacher probability above which the student's action is accepted (gating)"""
    envs: int = 32
    """collection envs"""
    steps_per_round: int = 150
    """control steps collected per env and round (episodes are reset at every round start)"""
    train_steps: int = 200
    """gradient steps per round"""
    batch_windows: int = 12
    """windows per gradient step"""
    labels_per_window: int = 36
    """supervised steps at the end of each window (the window adds the history encoder's context before them)"""
    cnn_grad_stride: int = 2
    """the image encoder gets gradients through every this-many-th supervised frame of a window (the others are
    encoded without; the history encoder and the policy head train on all): consecutive 15 Hz frames are nearly the
    same image, and the encoder's backward pass is most of a training step. 1 = every frame"""
    learning_rate: float = 5e-4
    """Adam learning rate of round 0; it follows a cosine down to 10% by the last round"""
    z_weight: float = 1.0
    """lambda of the z-hat regression loss"""
    latency_weight: float = 0.2
    """weight of the two latency classification losses"""
    estimate_weight: float = 0.5
    """weight of the friction / motor-gain / speed regression loss"""
    speed_weight: float = 1.0
    """weight of the speed estimate's term inside that loss (the others 1): once the car is under way its speed
    varies little (standard deviation about a sixth of its normalization scale, where the yaw rate's exceeds its
    scale), so unweighted its error hardly counts"""
    privileged_weight: float = 0.0
    """weight of the auxiliary loss that predicts the teacher's privileged observation (the task's `teacher` group:
    racing's lookahead points in the car frame, lateral offset, heading error, speed, yaw rate, steering, previous
    action), normalized as the teacher's network reads it, from the features the policy head reads (Learning by
    Cheating's privileged state made a training signal); logged as `loss/privileged` and `train/privileged_r2`.
    0 = no privileged head: the student, its initial weights and its training are those without one. A student with
    `--student.head frozen-teacher` needs it above 0: there the estimate is what the teacher's frozen trunk reads (its
    previous-action columns are the known action, exact in the loss and the R^2)"""
    redraw_seconds: float = 0.0
    """re-draw the car's dynamics and latencies every this many seconds of a collection episode
    (`randomization.redraw_seconds` of the DAgger env only; 0 keeps the teacher world's setting): several worlds
    per episode for the estimates to learn from, and changes to follow mid-episode"""
    low_grip_share: float = 0.0
    """share of collection episodes whose friction is drawn from the lowest third of the teacher world's range
    (`randomization.friction_low_share` of the DAgger env only; evaluations keep the teacher's world): more data
    where students fail most"""
    estimator_fit_steps: int = 4000
    """after the last round's training, fit the factor estimator alone on every recorded episode for this many
    gradient steps (its inputs are five numbers per step: cheap); 0 = only its training alongside the policy"""
    cache_mb: int = 1024
    """in-memory block cache of the dataset reader"""
    max_minutes: float = 0.0
    """stop after this much wall time (0 = none); the round in progress finishes first"""
    ema_decay: float = 0.0
    """with a value above 0, the student that drives, is evaluated, saved (`model`) and exported is the exponential
    moving average of the trained weights, updated after every gradient step with this decay (0.999: an average
    over about the last 1,000 steps); it smooths out the step-to-step noise of small-batch training, which a policy
    that must place a gripper to a centimetre feels. 0 = the trained weights themselves"""
    bf16: Literal["auto", "on", "off"] = "auto"
    """bfloat16 autocast for training (auto: on CPUs with native bf16, where it is faster; weights stay float32)"""
    seed: int = 0
    """seed of the global RNG (student init, mixing, augmentation, window sampling)"""

    def __post_init__(self) -> None:
        check_range("dagger.rounds", self.rounds, 1, 100_000)
        check_range("dagger.beta_decay", self.beta_decay, 0.0, 1.0)
        check_range("dagger.gate_threshold", self.gate_threshold, 0.0, 1.0)
        check_range("dagger.envs", self.envs, 1, 100_000)
        check_range("dagger.redraw_seconds", self.redraw_seconds, 0.0, 3600.0)
        check_range("dagger.low_grip_share", self.low_grip_share, 0.0, 1.0)
        check_range("dagger.estimator_fit_steps", self.estimator_fit_steps, 0, 10_000_000)
        check_range("dagger.steps_per_round", self.steps_per_round, 1, 1_000_000)
        check_range("dagger.batch_windows", self.batch_windows, 1, 100_000)
        check_range("dagger.labels_per_window", self.labels_per_window, 1, 10_000)
        check_range("dagger.cnn_grad_stride", self.cnn_grad_stride, 1, 10_000)
        check_range("dagger.speed_weight", self.speed_weight, 0.0, 1000.0)
        check_range("dagger.privileged_weight", self.privileged_weight, 0.0, 100.0)
        check_range("dagger.ema_decay", self.ema_decay, 0.0, 0.99999)


def collection_world(env_cfg, dagger: DaggerConfig):
    """`env_cfg` as the collection env draws its worlds: dynamics re-drawn every `dagger.redraw_seconds` of an
    episode and `dagger.low_grip_share` of the frictions from the range's lowest third (0 for either: unchanged; a
    task whose randomization has no such setting refuses them). Only the collection env gets it: the run's saved
    world, its evaluations and its checkpoints' world stay the teacher's."""
    settings = (("redraw_seconds", dagger.redraw_seconds), ("friction_low_share", dagger.low_grip_share))
    asked = {k: v for k, v in settings if v > 0}
    if not asked:
        return env_cfg
    rnd = getattr(env_cfg, "randomization", None)
    missing = [k for k in asked if not hasattr(rnd, k)]
    if missing:
        raise ConfigError(f"dagger: this task's randomization has no {missing}; leave those DAgger settings at 0")
    return replace(env_cfg, randomization=replace(rnd, **asked))


def teacher_probability(cfg: DaggerConfig, round_index: int) -> float:
    """β: the probability that the teacher's action is executed in a round."""
    if cfg.beta == "zero":
        return 0.0
    if cfg.beta == "exponential":
        return cfg.beta_decay**round_index
    return 0.5 * cfg.beta_decay**round_index  # LbC: the student drives with 0.5 + 0.5 (1 - decay^round)


def choose_actions(
    cfg: DaggerConfig,
    round_index: int,
    teacher_logits: Tensor,
    teacher_action: Tensor,
    student_action: Tensor,
    generator: torch.Generator,
) -> tuple[Tensor, Tensor]:
    """Executed actions `(N, 1)` and whether the student's was used `(N,)`."""
    beta = teacher_probability(cfg, round_index)
    use_student = (torch.rand(teacher_action.shape[0], generator=generator) >= beta).to(teacher_action.device)
    if cfg.gating and teacher_logits.shape[-1] > 1:
        probs = torch.softmax(teacher_logits, -1)
        p_student = probs.gather(-1, student_action.long()).squeeze(-1)
        use_student = use_student | (p_student >= cfg.gate_threshold)
    executed = torch.where(use_student[:, None], student_action, teacher_action)
    return executed, use_student


def distillation_loss(outputs: Tensor, teacher_outputs: Tensor, mask: Tensor, kind: str) -> Tensor:
    """Masked mean of KL(teacher || student) for discrete actions (cross-entropy up to the teacher's entropy),
    MSE to the teacher's (clamped) mean for continuous actions."""
    w = mask.float()
    if kind == "discrete":
        p = torch.softmax(teacher_outputs, -1)
        per_step = (p * (torch.log_softmax(teacher_outputs, -1) - torch.log_softmax(outputs, -1))).sum(-1)
    else:
        per_step = (outputs - teacher_outputs.clamp(-1.0, 1.0)).square().mean(-1)
    return (per_step * w).sum() / w.sum().clamp(min=1.0)


def privileged_loss(prediction: Tensor, target: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Masked mean squared error over `(B, T)` positions of a `(B, T, D)` prediction of normalized targets, and the
    pooled R^2 there: 1 - (sum of squared errors) / (sum over components of the squared deviations from each
    component's mean over the masked positions). NaN when no component varies."""
    w = mask.float().unsqueeze(-1)  # (B, T, 1)
    count = w.sum().clamp(min=1.0)
    sq = (prediction - target).square() * w
    loss = sq.sum() / (count * target.shape[-1])
    with torch.no_grad():
        mean = (target * w).sum((0, 1)) / count  # (D,)
        sst = ((target - mean).square() * w).sum()
        r2 = 1.0 - sq.sum() / sst if sst > 0 else torch.tensor(float("nan"))
    return loss, r2


def loss_mask(mask: Tensor, context: int) -> Tensor:
    """Positions that carry a loss: real steps whose full context lies inside the window (or at an episode start,
    where the padding is what deployment sees too)."""
    t = mask.shape[1]
    pos = torch.arange(t, device=mask.device)
    starts_episode = ~mask[:, :1]  # left padding: the window begins at the episode start
    full_context = pos[None, :] >= context
    return mask & (full_context | starts_episode)


def train_step(
    model: StudentModel,
    optimizer: torch.optim.Optimizer,
    batch: dict[str, np.ndarray],
    cfg: DaggerConfig,
    dt_physics: float,
    augment_fn,
    sync_gradients=None,
) -> dict[str, float]:
    """One gradient step on a batch of windows, on the model's device (`augment_fn` gets the uint8 frames there);
    returns the loss terms and the action agreement. `sync_gradients` (data-parallel runs) averages the gradients over
    the ranks between the backward pass and the clip."""
    device = next(model.parameters()).device  # the batch goes where the model is
    tensor = lambda key: torch.from_numpy(batch[key]).to(device)  # noqa: E731
    mask = tensor("mask")
    camera = augment_fn(tensor("camera"))  # uint8 in, float [0, 1] out
    prev_action = tensor("prev_action")
    lmask = loss_mask(mask, model.cfg.context)
    # Frames before the first supervised position only feed the history: no gradient through the CNN there.
    first_label = int(lmask.float().argmax(dim=1).min()) if bool(lmask.any()) else 0
    aux = cfg.privileged_weight > 0
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16(cfg)):
        outputs, heads = model.forward_window(
            camera, prev_action, mask, context_no_grad=first_label, grad_stride=cfg.cnn_grad_stride, privileged=aux
        )
    outputs, heads = outputs.float(), {k: v.float() for k, v in heads.items()}
    teacher_logits = tensor("teacher_logits")
    loss_action = distillation_loss(outputs, teacher_logits, lmask, model.spec.kind)
    total = loss_action
    terms = {"action": loss_action}
    extra: dict[str, float] = {}
    if aux:
        target = model.privileged_head.normalize(tensor("privileged"))
        terms["privileged"], r2 = privileged_loss(heads.pop("privileged"), target, lmask)
        total = total + cfg.privileged_weight * terms["privileged"]
        extra["train/privileged_r2"] = float(r2)
    if heads:
        # The factor estimator's outputs train where its longer context lies in the window (they are fitted on
        # whole episodes after the last round).
        fmask = loss_mask(mask, model.cfg.estimates_context) if model.estimator is not None else None
        spec = model.spec.estimates
        weights = {"speed": cfg.speed_weight} if "speed" in spec.regressions else {}
        ad = adaptation_losses(
            heads, tensor("z"), tensor("targets"), lmask, dt_physics, spec,
            fmask, estimate_weights=weights,
        )  # fmt: skip
        total = total + cfg.z_weight * ad["z"] + cfg.latency_weight * sum(ad[name] for name in spec.latencies)
        if "estimates" in ad:
            total = total + cfg.estimate_weight * ad["estimates"]
        terms.update({f"{k}": v for k, v in ad.items()})
    optimizer.zero_grad(set_to_none=True)
    total.backward()
    if sync_gradients is not None:
        sync_gradients()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
    optimizer.step()
    with torch.no_grad():
        agree = (
            (model.actions(outputs) == model.actions(teacher_logits)).all(-1).float()
            if model.spec.kind == "discrete"
            else None
        )
        stats = {f"loss/{k}": float(v) for k, v in terms.items()}
        stats["loss/total"] = float(total)
        if agree is not None:
            stats["train/agreement"] = float((agree * lmask).sum() / lmask.sum().clamp(min=1))
    for key, value in stats.items():
        if not math.isfinite(value):
            raise FloatingPointError(f"non-finite {key} in a student update")
    return {**stats, **extra}  # an R^2 is NaN where its targets do not vary: not a failed update


def round_learning_rate(cfg: DaggerConfig, round_index: int) -> float:
    """Cosine decay over the rounds, from `learning_rate` to a tenth of it."""
    frac = round_index / max(cfg.rounds - 1, 1)
    return cfg.learning_rate * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * frac)))


def use_bf16(cfg: DaggerConfig) -> bool:
    return bf16_enabled(cfg.bf16)


def bf16_enabled(mode: str) -> bool:
    """`auto`: bfloat16 autocast where the CPU has native bf16; `on` / `off` as said."""
    if mode == "auto":
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return mode == "on"
