"""Second-stage estimator of the per-episode factors (latencies, friction, motor gain) from the student's own commands
and its own estimates of the car's motion.

Why a second stage: the factors show in how the car answers its commands (latency as the delay between a steering
command and the yaw rate it produces, motor gain as the speed a throttle command reaches, friction as the slip at a
given speed and steering). A history encoder that regresses them from image embeddings directly has one label per
episode and a few hundred episodes per run: it memorizes episodes and scores no better than a constant guess on new
ones. This estimator reads a narrow signal instead, per step the previous action and the history encoder's estimates
of speed, lateral speed and yaw rate (dense per-frame targets it learns well), through a small causal TCN. Its
inputs are detached: its losses train it alone, and the motion estimates stay what their own targets make them.

Two products of those inputs join them (`features="physics"`): speed × yaw rate, the lateral acceleration that
friction bounds, and speed × steering command, what the tyres are asked for. A small TCN of ReLU-like units forms
sums of its inputs easily and products of them poorly; the friction shows where the lateral acceleration stops
following the steering, so the two products are handed to it (squared speeds add nothing beside them;
docs/results.md#why-the-default-estimator-misses-friction).

With `motion="odometry"` the three motion inputs are planar visual odometry of the frames instead
(`adaptation.odometry.OdometryTracker`, run beside the student; the estimator is then fitted on simulated worlds with
the odometry's errors, not in DAgger, whose training windows carry no odometry). That fit wants a wider estimator
than DAgger's (at 32 channels it underfits its simulated worlds) and thousands of worlds driven as it will read them
(the student through its camera): the `experiments.fit_estimator odometry` preset, whose figures are in
docs/results.md#odometry-fed-estimator.

Window pass and one-step pass compute the same thing (`tcn_window` / `tcn_step`), so deployment state is the last
`receptive_field - 1` inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from einops import rearrange
from torch import Tensor, nn

from adaptation.history_encoder import causal_blocks, tcn_step, tcn_window
from envs.errors import check_range
from envs.vehicle import MOTION, VEHICLE_ESTIMATES

ESTIMATES = VEHICLE_ESTIMATES.regressions
"""the history encoder's estimates of a vehicle task, in the order of its `estimates` head"""
ESTIMATE_SCALE = VEHICLE_ESTIMATES.scale
FACTORS = VEHICLE_ESTIMATES.factors
"""the regressed factors this estimator provides (in place of the history encoder's own heads for them)"""
INPUT_DIM = 2 + len(MOTION)
"""per-step inputs: the previous action and the motion estimates"""
PHYSICS_FEATURES = ("lateral_acceleration", "steering_speed")
"""products of the inputs added with `features="physics"`"""
LATERAL_ACCELERATION_SCALE = 6.0
"""m/s^2 per unit of the lateral-acceleration feature (the friction bound mu g is 7-12 m/s^2)"""
STEERING_SPEED_SCALE = 3.0
"""m/s per unit of the steering-command x speed feature"""


def normalize_velocities(velocities: Tensor) -> Tensor:
    """Body velocities `(..., 3)` in `MOTION` order (m/s, m/s, rad/s), normalized as the history encoder estimates
    them."""
    return torch.stack(
        [(velocities[..., k] - ESTIMATE_SCALE[n][0]) / ESTIMATE_SCALE[n][1] for k, n in enumerate(MOTION)], -1
    )


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
    features: Literal["raw", "physics"] = "physics"
    """per-step inputs: the five raw ones, or with the lateral acceleration and steering x speed (products of them)"""
    motion: Literal["encoder", "odometry"] = "encoder"
    """the motion it reads: the history encoder's estimates (trained with the student in DAgger), or planar visual
    odometry of the camera frames (`adaptation.odometry.OdometryTracker`, run beside the student; fitted afterwards on
    simulated worlds with the odometry's errors: `experiments.fit_estimator odometry`)"""

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
        self.input_dim = INPUT_DIM + (len(PHYSICS_FEATURES) if cfg.features == "physics" else 0)
        self.inp = nn.Conv1d(self.input_dim, c, 1)
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

    @property
    def reads_odometry(self) -> bool:
        return self.cfg.motion == "odometry"

    def expand(self, x: Tensor) -> Tensor:
        """`(..., INPUT_DIM)` inputs -> `(..., input_dim)`: with `features="physics"` the lateral acceleration (speed
        x yaw rate) and steering command x speed appended, each zero where the yaw rate or the steering is (a reset
        state's zeros stay zeros)."""
        if self.cfg.features == "raw":
            return x
        speed_c, speed_s = ESTIMATE_SCALE[MOTION[0]]
        yaw_c, yaw_s = ESTIMATE_SCALE[MOTION[2]]
        speed = x[..., 2] * speed_s + speed_c
        yaw_rate = x[..., 4] * yaw_s + yaw_c
        extra = [speed * yaw_rate / LATERAL_ACCELERATION_SCALE, speed * x[..., 0] / STEERING_SPEED_SCALE]
        return torch.cat([x, torch.stack(extra, -1)], -1)

    def _expanded_input(self, window: Tensor) -> Tensor:
        """The input convolution over `(N, INPUT_DIM, T)` raw inputs, their features added."""
        return self.inp(rearrange(self.expand(rearrange(window, "n d t -> n t d")), "n t f -> n f t"))

    def _heads(self, h: Tensor) -> dict[str, Tensor]:
        return {
            "action_latency_logits": self.act_latency_head(h),
            "camera_latency_logits": self.cam_latency_head(h),
            "factors": self.factor_head(h),
        }

    def forward(self, x: Tensor, mask: Tensor) -> dict[str, Tensor]:
        """Window pass; padded steps (mask False) are zeroed, as a reset deployment state holds zeros."""
        x = self.expand(x) * mask.unsqueeze(-1)
        return self._heads(tcn_window(x, self.inp, self.blocks, self.cfg.receptive_field - 1))

    def init_state(self, n: int, device: torch.device | str = "cpu") -> Tensor:
        return torch.zeros(n, self.cfg.receptive_field - 1, INPUT_DIM, device=device)

    def step(self, x: Tensor, state: Tensor) -> tuple[dict[str, Tensor], Tensor]:
        # the state keeps the raw inputs (the deployment state's layout does not depend on the features)
        h, state = tcn_step(x, state, self._expanded_input, self.blocks)
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
