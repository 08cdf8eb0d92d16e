"""History encoder: the last K steps of (image embedding, previous action) -> z-hat and explicit estimates.

RMA / HORA style: a causal temporal conv net (default) or a GRU over the per-step features. Outputs z-hat (regressed
onto the teacher's z = mu(e)), class logits of each latency the task names (in physics substeps) and its regressed
estimates (racing: friction, motor gain and the body velocities). Training runs over whole windows `(B, T, ...)`
with a mask (False = padding before the episode start); deployment runs one step at a time with explicit state
(`init_state` / `step`), which computes exactly what the window pass computes for the newest step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from torch import Tensor, nn

from envs.errors import check_range


@dataclass(frozen=True)
class HistoryConfig:
    """History encoder."""

    kind: Literal["tcn", "gru", "none"] = "tcn"
    """temporal conv net (RMA), GRU, or none (a memoryless student, for ablations)"""
    channels: int = 64
    """feature width"""
    kernel: int = 5
    """TCN kernel size"""
    dilations: tuple[int, ...] = (1, 2, 4)
    """TCN dilations; receptive field = 1 + (kernel - 1) * sum(dilations) steps"""
    input_dim: int = 32
    """per-step image features are projected to this size first"""

    def __post_init__(self) -> None:
        check_range("history.channels", self.channels, 4, 1024)
        check_range("history.kernel", self.kernel, 2, 15)
        check_range("history.input_dim", self.input_dim, 2, 1024)

    @property
    def receptive_field(self) -> int:
        if self.kind == "tcn":
            return 1 + (self.kernel - 1) * sum(self.dilations)
        return 1


class _CausalConv(nn.Module):
    def __init__(self, channels: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.pad = (kernel - 1) * dilation
        self.conv = nn.Conv1d(channels, channels, kernel, dilation=dilation)

    def forward(self, x: Tensor) -> Tensor:  # (B, C, T)
        return F.elu(self.conv(F.pad(x, (self.pad, 0)))) + x


def causal_blocks(channels: int, kernel: int, dilations: tuple[int, ...]) -> nn.ModuleList:
    return nn.ModuleList(_CausalConv(channels, kernel, d) for d in dilations)


def tcn_window(x: Tensor, inp: nn.Conv1d, blocks: nn.ModuleList, context: int) -> Tensor:
    """Causal TCN over `(B, T, D)` inputs (zero where padded) -> `(B, T, C)`. Zero inputs before the window, as in a
    freshly reset deployment state (`tcn_step` from zeros): every output then equals what `tcn_step` computes whenever
    the window holds the step's `context` or its episode start."""
    h = inp(rearrange(F.pad(x, (0, 0, context, 0)), "b t d -> b d t"))
    for block in blocks:
        h = block(h)
    return rearrange(h[:, :, context:], "b c t -> b t c")


def tcn_step(x: Tensor, state: Tensor, inp: Callable[[Tensor], Tensor], blocks: nn.ModuleList) -> tuple[Tensor, Tensor]:
    """One step `(N, D)` with the last `context` inputs `(N, context, D)` -> (features `(N, C)`, new state)."""
    window = torch.cat([state, rearrange(x, "n d -> n 1 d")], dim=1)
    h = inp(rearrange(window, "n t d -> n d t"))
    for block in blocks:
        h = block(h)
    return h[:, :, -1], window[:, 1:]


class HistoryEncoder(nn.Module):
    """Per-step features `(B, T, embed + proprio)` -> history features `(B, T, channels)` and estimate heads: `z_hat`,
    `{latency}_logits` for each entry of `latency_classes` (name -> classes), and `estimates` (`num_estimates`)."""

    def __init__(
        self,
        cfg: HistoryConfig,
        embed_dim: int,
        latent_dim: int,
        latency_classes: dict[str, int],
        num_estimates: int,
        proprio_dim: int = 2,
    ):
        super().__init__()
        self.cfg = cfg
        self.project = nn.Sequential(nn.Linear(embed_dim + proprio_dim, cfg.input_dim), nn.ELU())
        if cfg.kind == "tcn":
            self.inp = nn.Conv1d(cfg.input_dim, cfg.channels, 1)
            self.blocks = causal_blocks(cfg.channels, cfg.kernel, cfg.dilations)
        else:
            self.gru = nn.GRU(cfg.input_dim, cfg.channels, batch_first=True)
        c = cfg.channels
        self.z_head = nn.Linear(c, latent_dim)
        self.latency_heads = nn.ModuleDict({name: nn.Linear(c, k) for name, k in latency_classes.items()})
        self.estimate_head = nn.Linear(c, num_estimates)
        self.out_dim = c

    # ------------------------------------------------------------------------------------------- sequences
    def forward(self, steps: Tensor, mask: Tensor) -> Tensor:
        """Causal features for every step of `(B, T, D)` windows; padded steps are zeroed before encoding."""
        x = self.project(steps) * mask.unsqueeze(-1)
        if self.cfg.kind == "tcn":
            return tcn_window(x, self.inp, self.blocks, self.cfg.receptive_field - 1)
        # GRU: a window's padding is a prefix (the steps before its episode start). Running the GRU through it would
        # leave a non-zero hidden state at the episode start (a GRU with zero input drifts by its biases), while a
        # reset deployment state is zero; so each row is shifted left to start at its first real step, run from
        # zero, and shifted back. Outputs on padded steps are zero (they carry no loss).
        b, t, _ = x.shape
        pad = (~mask).sum(1, keepdim=True)  # (B, 1)
        pos = torch.arange(t, device=x.device)[None, :]
        src = (pos + pad).clamp(max=t - 1)  # shifted step i reads real step i + pad
        shifted = x.gather(1, repeat(src, "b t -> b t d", d=x.shape[-1])) * (pos + pad < t)[..., None]
        h0 = torch.zeros(1, b, self.cfg.channels, device=x.device)
        out, _ = self.gru(shifted, h0)
        back = (pos - pad).clamp(min=0)  # real step i is shifted step i - pad
        return out.gather(1, repeat(back, "b t -> b t c", c=out.shape[-1])) * mask[..., None]

    def heads(self, h: Tensor) -> dict[str, Tensor]:
        heads = {"z_hat": torch.tanh(self.z_head(h))}
        heads.update({f"{name}_logits": head(h) for name, head in self.latency_heads.items()})
        heads["estimates"] = self.estimate_head(h)
        return heads

    # -------------------------------------------------------------------------------------------- one step
    def init_state(self, n: int, device: torch.device | str = "cpu") -> Tensor:
        """Deployment state: the last (receptive field - 1) projected inputs (TCN) or the GRU hidden state."""
        if self.cfg.kind == "tcn":
            return torch.zeros(n, self.cfg.receptive_field - 1, self.cfg.input_dim, device=device)
        return torch.zeros(n, 1, self.cfg.channels, device=device)

    def step(self, step_input: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """One step `(N, D)` -> (features `(N, channels)`, new state)."""
        x = self.project(step_input)
        if self.cfg.kind == "tcn":
            return tcn_step(x, state, self.inp, self.blocks)
        out, hidden = self.gru(rearrange(x, "n d -> n 1 d"), rearrange(state, "n l c -> l n c").contiguous())
        return out[:, -1], rearrange(hidden, "l n c -> n l c")
