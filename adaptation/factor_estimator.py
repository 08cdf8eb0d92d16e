"""Second-stage estimator of the per-episode factors (latencies, friction, motor gain) from the student's own commands
and its own estimates of the car's motion.

Why a second stage: the factors show in how the car answers its commands (latency as the delay between a steering
command and the yaw rate it produces, motor gain as the speed a throttle command reaches, friction as the slip at a
given speed and steering). A history encoder that regresses them from image embeddings directly has one label per
episode and a few hundred episodes per run: it memorizes episodes and scores no better than a constant guess on new
ones. This estimator reads a narrow signal instead, per step the previous action and the history encoder's estimates
of speed, lateral speed and yaw rate (dense per-frame targets it learns well), through a small causal TCN. Its
inputs are detached: its losses train it alone, and the motion estimates stay what their own targets make them.

Window pass and one-step pass compute the same thing (`tcn_window` / `tcn_step`), so deployment state is the last
`receptive_field - 1` inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from adaptation.history_encoder import ESTIMATES, causal_blocks, tcn_step, tcn_window
from adaptation.losses import FACTOR_ESTIMATES
from envs.errors import check_range

MOTION = ("speed", "lateral_speed", "yaw_rate")
"""the history encoder's estimates this estimator reads (normalized, as the encoder outputs them)"""
FACTORS = FACTOR_ESTIMATES
"""the regressed factors this estimator provides (in place of the history encoder's own heads for them)"""
INPUT_DIM = 2 + len(MOTION)


@dataclass(frozen=True)
class EstimatorConfig:
    """Second-stage factor estimator (over commands and the student's motion estimates)."""

    kind: Literal["tcn", "none"] = "tcn"
    """causal TCN, or none (the history encoder's own heads estimate the factors)"""
    channels: int = 32
    """feature width"""
    kernel: int = 3
    """TCN kernel size"""
    dilations: tuple[int, ...] = (1, 2, 4, 8)
    """TCN dilations; receptive field = 1 + (kernel - 1) * sum(dilations) steps (default 31 steps: 2 s at 15 Hz)"""

    def __post_init__(self) -> None:
        check_range("estimator.channels", self.channels, 4, 1024)
        check_range("estimator.kernel", self.kernel, 2, 15)
        if not self.dilations or min(self.dilations) < 1:
            raise ValueError(f"estimator.dilations={self.dilations}: give one or more dilations >= 1")

    @property
    def receptive_field(self) -> int:
        return 1 + (self.kernel - 1) * sum(self.dilations) if self.kind == "tcn" else 1


class FactorEstimator(nn.Module):
    """`(B, T, 5)` inputs (previous action, normalized motion estimates) -> latency logits and factor estimates."""

    def __init__(self, cfg: EstimatorConfig, act_latency_classes: int, cam_latency_classes: int) -> None:
        super().__init__()
        self.cfg = cfg
        c = cfg.channels
        self.inp = nn.Conv1d(INPUT_DIM, c, 1)
        self.blocks = causal_blocks(c, cfg.kernel, cfg.dilations)
        self.act_latency_head = nn.Linear(c, act_latency_classes)
        self.cam_latency_head = nn.Linear(c, cam_latency_classes)
        self.factor_head = nn.Linear(c, len(FACTORS))

    @staticmethod
    def inputs(prev_action: Tensor, estimates: Tensor) -> Tensor:
        """Per-step inputs from the previous actions `(..., 2)` and the encoder's estimates `(..., len(ESTIMATES))`
        (detached: no gradient flows back into the history encoder)."""
        motion = estimates.detach()[..., [ESTIMATES.index(n) for n in MOTION]]
        return torch.cat([prev_action, motion], -1)

    def _heads(self, h: Tensor) -> dict[str, Tensor]:
        return {
            "action_latency_logits": self.act_latency_head(h),
            "camera_latency_logits": self.cam_latency_head(h),
            "factors": self.factor_head(h),
        }

    def forward(self, x: Tensor, mask: Tensor) -> dict[str, Tensor]:
        """Window pass; padded steps (mask False) are zeroed, as a reset deployment state holds zeros."""
        x = x * mask.unsqueeze(-1)
        return self._heads(tcn_window(x, self.inp, self.blocks, self.cfg.receptive_field - 1))

    def init_state(self, n: int, device: torch.device | str = "cpu") -> Tensor:
        return torch.zeros(n, self.cfg.receptive_field - 1, INPUT_DIM, device=device)

    def step(self, x: Tensor, state: Tensor) -> tuple[dict[str, Tensor], Tensor]:
        h, state = tcn_step(x, state, self.inp, self.blocks)
        return self._heads(h), state

    @staticmethod
    def merge(heads: dict[str, Tensor], ours: dict[str, Tensor]) -> dict[str, Tensor]:
        """The history encoder's heads with the latencies, friction and motor gain replaced by this estimator's."""
        cols = [
            ours["factors"][..., FACTORS.index(name)] if name in FACTORS else heads["estimates"][..., i]
            for i, name in enumerate(ESTIMATES)
        ]
        est = torch.stack(cols, -1)
        return {
            **heads,
            "action_latency_logits": ours["action_latency_logits"],
            "camera_latency_logits": ours["camera_latency_logits"],
            "estimates": est,
        }
