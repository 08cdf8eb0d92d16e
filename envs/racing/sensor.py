"""Image-sensor effects applied after rendering: vignetting, read noise and shot noise.

The training sim renders clean frames (augmentations are the student's business); the reality proxy passes its
frames through a sensor model the training never sees.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from envs.errors import check_range


@dataclass(frozen=True)
class SensorConfig:
    """A cheap camera module's defects, on the 0-255 luma scale. All zero = a perfect sensor."""

    vignetting: float = 0.0
    """fraction of the luma lost at the image corners (falls off with the squared radius)"""
    read_noise: float = 0.0
    """signal-independent Gaussian noise standard deviation (luma levels)"""
    shot_noise: float = 0.0
    """signal-dependent noise: standard deviation sqrt(x * luma) (luma levels)"""

    def __post_init__(self) -> None:
        check_range("sensor.vignetting", self.vignetting, 0.0, 0.9)
        check_range("sensor.read_noise", self.read_noise, 0.0, 50.0)
        check_range("sensor.shot_noise", self.shot_noise, 0.0, 10.0)

    @property
    def active(self) -> bool:
        return self != SensorConfig()


def vignette_gain(height: int, width: int, strength: float, device: torch.device | str = "cpu") -> Tensor:
    """`(H, W)` gain: 1 at the image centre, 1 - strength at the corners, quadratic in the radius."""
    ys = (torch.arange(height, device=device) + 0.5) / height * 2.0 - 1.0
    xs = (torch.arange(width, device=device) + 0.5) / width * 2.0 - 1.0
    aspect = height / width
    r2 = (xs[None, :] ** 2 + (ys[:, None] * aspect) ** 2) / (1.0 + aspect**2)
    return 1.0 - strength * r2


class SensorModel:
    """Applies `SensorConfig` to uint8 frames `(N, C, H, W)`."""

    def __init__(self, cfg: SensorConfig, height: int, width: int, device: torch.device | str = "cpu") -> None:
        self.cfg = cfg
        self.gain = vignette_gain(height, width, cfg.vignetting, device)

    def apply(self, frames: Tensor, generator: torch.Generator) -> Tensor:
        x = frames.float() * self.gain
        std2 = self.cfg.read_noise**2 + self.cfg.shot_noise * x.clamp(min=0.0)
        if self.cfg.read_noise > 0 or self.cfg.shot_noise > 0:
            noise = torch.randn(x.shape, generator=generator, device=x.device)
            x = x + noise * std2.sqrt()
        return x.round_().clamp_(0, 255).to(torch.uint8)
