"""Student networks: the DeepRacer shallow CNN image encoder, the policy head and the privileged-observation head.

The encoder takes raw camera frames (uint8 0-255 or float) and scales them inside the model, as the car feeds raw
pixels. Its head is a flatten + linear layer (default) or a spatial softmax — never global average pooling, which
throws away where the track is in the image.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from envs.errors import check_range
from teacher.networks import mlp


@dataclass(frozen=True)
class EncoderConfig:
    """Image encoder."""

    channels: tuple[int, int, int] = (32, 64, 64)
    """DeepRacer's shallow CNN: conv k8 s4, conv k4 s2, conv k3 s1"""
    head: Literal["flatten", "spatial_softmax"] = "flatten"
    """flatten + linear, or spatial-softmax keypoints"""
    embed_dim: int = 128
    """image embedding size"""
    dropout: float = 0.0
    """dropout on the embedding"""
    motion: bool = False
    """also feed the difference to the previous frame as a second input channel, so a single embedding carries the
    car's motion (speed, slip, yaw rate: what reveals friction and motor gain); zero at an episode's first frame"""

    def __post_init__(self) -> None:
        check_range("encoder.embed_dim", self.embed_dim, 4, 4096)
        check_range("encoder.dropout", self.dropout, 0.0, 0.9)


class SpatialSoftmax(nn.Module):
    """Expected (x, y) image position of each channel's activation: `(N, C, H, W)` -> `(N, 2C)`."""

    def forward(self, x: Tensor) -> Tensor:
        n, c, h, w = x.shape
        attn = torch.softmax(x.reshape(n, c, h * w), dim=-1).reshape(n, c, h, w)
        ys = torch.linspace(-1.0, 1.0, h, device=x.device)
        xs = torch.linspace(-1.0, 1.0, w, device=x.device)
        ex = (attn.sum(dim=2) * xs).sum(-1)
        ey = (attn.sum(dim=3) * ys).sum(-1)
        return torch.cat([ex, ey], dim=-1)


def scale_frames(frames: Tensor) -> Tensor:
    """Raw uint8 frames -> float 0-1; float frames are taken as already scaled."""
    return frames.float() * (1.0 / 255.0) if frames.dtype == torch.uint8 else frames


class ImageEncoder(nn.Module):
    """Frames `(N, 1, H, W)` (raw 0-255) -> embedding `(N, embed_dim)`; with `motion`, also the previous frames."""

    def __init__(self, cfg: EncoderConfig, image_hw: tuple[int, int] = (120, 160)) -> None:
        super().__init__()
        c1, c2, c3 = cfg.channels
        self.conv = nn.Sequential(
            nn.Conv2d(2 if cfg.motion else 1, c1, 8, stride=4), nn.ReLU(),
            nn.Conv2d(c1, c2, 4, stride=2), nn.ReLU(),
            nn.Conv2d(c2, c3, 3, stride=1), nn.ReLU(),
        )  # fmt: skip
        with torch.no_grad():
            feat = self.conv(torch.zeros(1, 2 if cfg.motion else 1, *image_hw))
        if cfg.head == "flatten":
            self.head = nn.Sequential(nn.Flatten(), nn.Linear(feat.numel(), cfg.embed_dim), nn.ReLU())
        else:
            self.head = nn.Sequential(SpatialSoftmax(), nn.Linear(2 * c3, cfg.embed_dim), nn.ReLU())
        self.dropout = nn.Dropout(cfg.dropout) if cfg.dropout > 0 else nn.Identity()
        self.embed_dim, self.motion = cfg.embed_dim, cfg.motion
        self.conv.to(memory_format=torch.channels_last)  # faster convolutions on CPUs (oneDNN)

    def forward(self, frames: Tensor, previous: Tensor | None = None) -> Tensor:
        """`previous`: the frames one step earlier (same shape; motion encoders only, required there)."""
        x = scale_frames(frames)
        if self.motion:
            if previous is None:
                raise ValueError("a motion encoder needs the previous frames")
            x = torch.cat([x, x - scale_frames(previous)], dim=1)
        x = self.conv(x.contiguous(memory_format=torch.channels_last))
        return self.dropout(self.head(x.contiguous()))


class PolicyHead(nn.Module):
    """[image embedding, history features, previous action] -> action logits (or continuous action means)."""

    def __init__(self, in_dim: int, out_dim: int, hidden: Sequence[int] = (256, 128), dropout: float = 0.0):
        super().__init__()
        self.net = mlp(in_dim, out_dim, hidden, "elu", dropout, dropout_layers=1)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class PrivilegedHead(nn.Module):
    """[image embedding, history features, previous action] -> the teacher's privileged observation, normalized as
    the teacher's own network reads it: `(obs - centre) / scale` (buffers, set from the teacher and saved with the
    student). A training signal only (Learning by Cheating's privileged state as an auxiliary target): no action, no
    export and no deployment reads it."""

    def __init__(self, in_dim: int, out_dim: int, hidden: Sequence[int] = (128,)) -> None:
        super().__init__()
        self.net = mlp(in_dim, out_dim, hidden, "elu")
        self.register_buffer("centre", torch.zeros(out_dim))
        self.register_buffer("scale", torch.ones(out_dim))

    def set_normalization(self, centre: Tensor, scale: Tensor) -> None:
        if centre.shape != self.centre.shape or scale.shape != self.scale.shape:
            raise ValueError(
                f"privileged normalization: shapes {tuple(centre.shape)} and {tuple(scale.shape)}, expected "
                f"{tuple(self.centre.shape)}"
            )
        if not bool((scale > 0).all()):
            raise ValueError("privileged normalization: every scale must be positive")
        self.centre.copy_(centre)
        self.scale.copy_(scale)

    def normalize(self, privileged: Tensor) -> Tensor:
        """Raw privileged observations `(..., D)` -> the head's regression targets `(..., D)`."""
        return (privileged - self.centre) / self.scale

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)
