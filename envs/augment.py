"""Batched image augmentations applied when training the student (the DeepRacer team's transfer list).

Random color (brightness / contrast / gamma: their most effective), translation, shadows, sharpening or blur, and
salt-and-pepper noise; each switchable with its own probability. Inputs are float images in [0, 1] shaped
`(B, T, 1, H, W)`: parameters are drawn once per window (B) so a history sees one consistent camera, except the
per-frame sensor noise. Deterministic under the passed generator; outputs keep dtype, shape and the [0, 1] range.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from envs.errors import check_range


@dataclass(frozen=True)
class AugmentConfig:
    """Which augmentations run, how often, how strong."""

    enabled: bool = True
    """master switch"""
    color_p: float = 0.8
    """probability of a random brightness / contrast / gamma change"""
    brightness: float = 0.25
    """brightness shift range ± (fraction of full scale)"""
    contrast: tuple[float, float] = (0.6, 1.4)
    """contrast gain range"""
    gamma: tuple[float, float] = (0.7, 1.5)
    """gamma range"""
    translate_p: float = 0.5
    """probability of a random shift"""
    translate_px: int = 8
    """largest shift (pixels)"""
    shadow_p: float = 0.3
    """probability of a straight-edged shadow over part of the image"""
    shadow_strength: tuple[float, float] = (0.4, 0.85)
    """luma multiplier inside the shadow"""
    sharpen_p: float = 0.3
    """probability of sharpening or blurring"""
    sharpen_amount: float = 1.0
    """unsharp-mask amount range ± (negative values blur)"""
    noise_p: float = 0.3
    """probability of salt-and-pepper noise"""
    noise_density: float = 0.02
    """largest fraction of pixels flipped to black or white"""

    def __post_init__(self) -> None:
        for name in ("color_p", "translate_p", "shadow_p", "sharpen_p", "noise_p"):
            check_range(f"augment.{name}", getattr(self, name), 0.0, 1.0)
        check_range("augment.translate_px", self.translate_px, 0, 60)
        check_range("augment.noise_density", self.noise_density, 0.0, 0.5)
        check_range("augment.brightness", self.brightness, 0.0, 1.0)

    @classmethod
    def off(cls) -> AugmentConfig:
        return cls(enabled=False)

    @classmethod
    def only(cls, name: str) -> AugmentConfig:
        """One augmentation at probability 1, the others off (for ablations)."""
        probs = {k: 0.0 for k in ("color_p", "translate_p", "shadow_p", "sharpen_p", "noise_p")}
        probs[f"{name}_p"] = 1.0
        return cls(**probs)


def _per_window(b: int, p: float, g: torch.Generator, device) -> Tensor:
    return torch.rand(b, generator=g, device=device) < p


def _uniform(b: int, lo: float, hi: float, g: torch.Generator, device) -> Tensor:
    return lo + (hi - lo) * torch.rand(b, generator=g, device=device)


def color(x: Tensor, on: Tensor, cfg: AugmentConfig, g: torch.Generator) -> Tensor:
    b, dev = x.shape[0], x.device
    shape = (b, 1, 1, 1, 1)
    gamma = torch.where(on, _uniform(b, *cfg.gamma, g, dev), 1.0).view(shape)
    gain = torch.where(on, _uniform(b, *cfg.contrast, g, dev), 1.0).view(shape)
    shift = torch.where(on, _uniform(b, -cfg.brightness, cfg.brightness, g, dev), 0.0).view(shape)
    x = x.clamp(min=1e-6).pow(gamma)
    mean = x.mean(dim=(2, 3, 4), keepdim=True)
    return ((x - mean) * gain + mean + shift).clamp(0.0, 1.0)


def translate(x: Tensor, on: Tensor, cfg: AugmentConfig, g: torch.Generator) -> Tensor:
    b, t, c, h, w = x.shape
    dev = x.device
    dx = torch.where(on, torch.randint(-cfg.translate_px, cfg.translate_px + 1, (b,), generator=g, device=dev), 0)
    dy = torch.where(on, torch.randint(-cfg.translate_px, cfg.translate_px + 1, (b,), generator=g, device=dev), 0)
    theta = torch.zeros(b, 2, 3, device=dev)
    theta[:, 0, 0] = 1.0
    theta[:, 1, 1] = 1.0
    theta[:, 0, 2] = -2.0 * dx.float() / w
    theta[:, 1, 2] = -2.0 * dy.float() / h
    theta = theta.repeat_interleave(t, dim=0)
    flat = x.reshape(b * t, c, h, w)
    grid = F.affine_grid(theta, list(flat.shape), align_corners=False)
    out = F.grid_sample(flat, grid, mode="nearest", padding_mode="border", align_corners=False)
    return out.reshape(x.shape)


def shadow(x: Tensor, on: Tensor, cfg: AugmentConfig, g: torch.Generator) -> Tensor:
    b, _, _, h, w = x.shape
    dev = x.device
    angle = _uniform(b, 0.0, 2 * torch.pi, g, dev)
    offset = _uniform(b, -0.6, 0.6, g, dev)
    strength = torch.where(on, _uniform(b, *cfg.shadow_strength, g, dev), 1.0)
    ys = torch.linspace(-1, 1, h, device=dev).view(1, h, 1)
    xs = torch.linspace(-1, 1, w, device=dev).view(1, 1, w)
    side = torch.cos(angle).view(b, 1, 1) * xs + torch.sin(angle).view(b, 1, 1) * ys > offset.view(b, 1, 1)
    factor = torch.where(side, strength.view(b, 1, 1), 1.0)  # (B, H, W)
    return x * factor[:, None, None]


def sharpen(x: Tensor, on: Tensor, cfg: AugmentConfig, g: torch.Generator) -> Tensor:
    b, t, c, h, w = x.shape
    amount = torch.where(on, _uniform(b, -cfg.sharpen_amount, cfg.sharpen_amount, g, x.device), 0.0)
    flat = x.reshape(b * t, c, h, w)
    kernel = torch.full((1, 1, 3, 3), 1.0 / 9.0, device=x.device)
    blur = F.conv2d(F.pad(flat, (1, 1, 1, 1), mode="replicate"), kernel).reshape(x.shape)
    # amount > 0 sharpens (unsharp mask); amount < 0 blends toward the blurred image.
    out = torch.where(
        (amount >= 0).view(b, 1, 1, 1, 1),
        x + amount.view(b, 1, 1, 1, 1) * (x - blur),
        x + (-amount).view(b, 1, 1, 1, 1) * (blur - x),
    )
    return out.clamp(0.0, 1.0)


def salt_pepper(x: Tensor, on: Tensor, cfg: AugmentConfig, g: torch.Generator) -> Tensor:
    b = x.shape[0]
    density = torch.where(on, _uniform(b, 0.0, cfg.noise_density, g, x.device), 0.0).view(b, 1, 1, 1, 1)
    u = torch.rand(x.shape, generator=g, device=x.device)
    x = torch.where(u < density / 2, 0.0, x)
    return torch.where(u > 1.0 - density / 2, 1.0, x)


def augment(x: Tensor, cfg: AugmentConfig, generator: torch.Generator) -> Tensor:
    """Augment float images `(B, T, 1, H, W)` in [0, 1]."""
    if not cfg.enabled:
        return x
    b, dev = x.shape[0], x.device
    steps = (
        ("color", cfg.color_p, color),
        ("translate", cfg.translate_p, translate),
        ("shadow", cfg.shadow_p, shadow),
        ("sharpen", cfg.sharpen_p, sharpen),
        ("noise", cfg.noise_p, salt_pepper),
    )
    for _, p, fn in steps:
        on = _per_window(b, p, generator, dev)  # drawn even when p == 0, so the stream never depends on the mix
        if p > 0 and bool(on.any()):
            x = fn(x, on, cfg, generator)
    return x
