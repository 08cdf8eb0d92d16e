"""The student model: camera frame + previous action + history -> action, z-hat and the explicit estimates.

`forward_window` trains on windows `(B, T, ...)`; `step` runs one frame at a time with explicit recurrent state
(the history encoder's buffer or hidden state), exactly what the car runs. `StudentPolicy` wraps a model for
batched envs: it owns the per-env state and resets it on `done`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from tensordict import TensorDict
from torch import Tensor, nn

from adaptation.history_encoder import HistoryConfig, HistoryEncoder
from envs.errors import check_range
from student.networks import EncoderConfig, ImageEncoder, PolicyHead


@dataclass(frozen=True)
class StudentConfig:
    """Student architecture."""

    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    """image encoder"""
    history: HistoryConfig = field(default_factory=HistoryConfig)
    """history encoder (kind none = memoryless student)"""
    head_hidden: tuple[int, ...] = (256, 128)
    """policy head widths"""
    head_dropout: float = 0.0
    """dropout before the policy head's output layer"""
    burn_in: int = 16
    """GRU only: steps of a training window that only build up the hidden state"""

    def __post_init__(self) -> None:
        check_range("student.head_dropout", self.head_dropout, 0.0, 0.9)
        check_range("student.burn_in", self.burn_in, 1, 1000)

    @property
    def context(self) -> int:
        """Steps before a training position that its output depends on (its loss needs them in the window)."""
        if self.history.kind == "tcn":
            return self.history.receptive_field - 1
        if self.history.kind == "gru":
            return self.burn_in
        return 0


@dataclass(frozen=True)
class OutputSpec:
    """What the student predicts, fixed by the teacher and env it is distilled from."""

    kind: str  # discrete | continuous
    num_outputs: int  # logits (discrete) or action means (continuous)
    latent_dim: int
    action_latency_classes: int
    camera_latency_classes: int


class StudentModel(nn.Module):
    def __init__(self, cfg: StudentConfig, spec: OutputSpec) -> None:
        super().__init__()
        self.cfg, self.spec = cfg, spec
        self.encoder = ImageEncoder(cfg.encoder)
        e = cfg.encoder.embed_dim
        if cfg.history.kind == "none":
            self.history = None
            head_in = e + 2
        else:
            self.history = HistoryEncoder(
                cfg.history, e, spec.latent_dim, spec.action_latency_classes, spec.camera_latency_classes
            )
            head_in = e + self.history.out_dim + 2
        self.head = PolicyHead(head_in, spec.num_outputs, cfg.head_hidden, cfg.head_dropout)

    def forward_window(
        self, camera: Tensor, prev_action: Tensor, mask: Tensor, context_no_grad: int = 0
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """camera `(B, T, 1, H, W)`, prev_action `(B, T, 2)`, mask `(B, T)` -> outputs `(B, T, A)`, heads.

        The first `context_no_grad` frames of each window are encoded without gradients (they only feed the
        history of later steps), which saves two thirds of their cost in training."""
        b, t = camera.shape[:2]
        c = min(context_no_grad, t)
        if c > 0:
            with torch.no_grad():
                ctx = self.encoder(camera[:, :c].flatten(0, 1)).view(b, c, -1)
            rest = self.encoder(camera[:, c:].flatten(0, 1)).view(b, t - c, -1)
            emb = torch.cat([ctx, rest], dim=1)
        else:
            emb = self.encoder(camera.flatten(0, 1)).view(b, t, -1)
        prev_action = prev_action * mask.unsqueeze(-1)
        if self.history is None:
            return self.head(torch.cat([emb, prev_action], -1)), {}
        h = self.history(torch.cat([emb, prev_action], -1), mask)
        return self.head(torch.cat([emb, h, prev_action], -1)), self.history.heads(h)

    def init_state(self, n: int, device: torch.device | str = "cpu") -> Tensor:
        if self.history is None:
            return torch.zeros(n, 1, 1, device=device)
        return self.history.init_state(n, device)

    def step(self, camera: Tensor, prev_action: Tensor, state: Tensor) -> tuple[Tensor, dict[str, Tensor], Tensor]:
        """One frame: camera `(N, 1, H, W)`, prev_action `(N, 2)`, state -> outputs `(N, A)`, heads, new state."""
        emb = self.encoder(camera)
        if self.history is None:
            return self.head(torch.cat([emb, prev_action], -1)), {}, state
        h, state = self.history.step(torch.cat([emb, prev_action], -1), state)
        return self.head(torch.cat([emb, h, prev_action], -1)), self.history.heads(h), state

    def actions(self, outputs: Tensor) -> Tensor:
        """Deterministic actions: the most likely index `(…, 1)` or the clamped mean `(…, 2)`."""
        if self.spec.kind == "discrete":
            return outputs.argmax(-1, keepdim=True).float()
        return outputs.clamp(-1.0, 1.0)


class StudentPolicy:
    """A student driving batched envs: owns the per-env recurrent state (reset on done)."""

    def __init__(self, model: StudentModel, num_envs: int, device: torch.device | str = "cpu") -> None:
        self.model, self.device = model, torch.device(device)
        self.state = model.init_state(num_envs, self.device)
        self.last_heads: dict[str, Tensor] = {}
        self.last_outputs: Tensor | None = None

    @torch.no_grad()
    def act(self, obs: TensorDict) -> Tensor:
        was_training = self.model.training
        self.model.eval()
        outputs, heads, self.state = self.model.step(obs["camera"], obs["proprio"][:, :2], self.state)
        self.model.train(was_training)
        self.last_outputs, self.last_heads = outputs, heads
        return self.model.actions(outputs)

    def reset(self, dones: Tensor) -> None:
        """Clear the history of envs whose episode ended (their next frame starts a new episode)."""
        if bool(dones.any()):
            self.state[dones.to(self.state.device)] = 0.0

    def resize(self, num_envs: int) -> None:
        self.state = self.model.init_state(num_envs, self.device)
