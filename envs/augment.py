"""Batched image augmentations applied when training the student (the DeepRacer team's transfer list).

Random color (tone curve / contrast / brightness: their most effective), translation, shadows, sharpening or blur,
and salt-and-pepper noise; each switchable with its own probability. Input: raw frames `(B, T, 1, H, W)` (uint8
0-255, or float in [0, 1]); output: float in [0, 1], same shape. Parameters are drawn once per window (B) so a
history sees one consistent camera; the noise pixels change every frame. Deterministic under the passed generator.

The photometric part (color, shadow, sharpen) is one fused pure function (`photometric`) that takes neutral
parameters for windows not selected, so it can be compiled into a single pass over the pixels.

A lighting group (`envs/augment_lighting.py`: long cast shadows of a low sun, specular glare, lens flare, motion
blur, auto-exposure steps within a window) runs after the photometric pass and before the noise. It is off by
default; `lighting_p` turns all five on at one probability, and each has its own probability that overrides it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from envs.augment_lighting import LIGHTING, draw_lighting, lighting_
from envs.errors import ConfigError, check_interval, check_range
from envs.jit import maybe_compile

BASIC = ("color", "translate", "shadow", "sharpen", "noise")
"""the augmentations on by default"""


@dataclass(frozen=True)
class AugmentConfig:
    """Which augmentations run, how often, how strong."""

    enabled: bool = True
    """master switch"""
    color_p: float = 0.8
    """probability of a random tone curve / contrast / brightness change"""
    brightness: float = 0.25
    """brightness shift range ± (fraction of full scale)"""
    contrast: tuple[float, float] = (0.6, 1.4)
    """contrast gain range"""
    tone: float = 0.6
    """tone-curve strength range ±: y = x + a x (1 - x) (a > 0 brightens mid-tones like gamma < 1)"""
    translate_p: float = 0.3
    """probability of a random shift"""
    translate_px: int = 4
    """largest shift (pixels); large shifts contradict the steering labels (the track seems to move sideways)"""
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
    lighting_p: float = 0.0
    """probability of each lighting augmentation (cast_shadow, glare, flare, motion_blur, exposure) whose own
    probability is left unset; 0 keeps the group off"""
    cast_shadow_p: float | None = None
    """probability of long hard-edged cast shadows of a low sun (up to 3 bands fanning out from a vanishing point
    on the horizon, below it); unset: lighting_p"""
    cast_shadow_strength: tuple[float, float] = (0.35, 0.7)
    """luma multiplier inside a cast shadow (skylight only)"""
    cast_shadow_width_px: tuple[float, float] = (5.0, 45.0)
    """band width at the image's bottom row (px), narrowing toward the horizon: poles and people to barriers"""
    cast_shadow_drift: float = 0.004
    """largest turn of the bands about the vanishing point per frame (rad), the car moving sideways to them"""
    glare_p: float | None = None
    """probability of specular glare: up to 3 soft elliptical patches on the floor, saturating in the core;
    unset: lighting_p"""
    glare_size_px: tuple[float, float] = (4.0, 24.0)
    """semi-axis range of a glare patch (px)"""
    glare_gain: tuple[float, float] = (0.5, 1.5)
    """peak luma a glare patch adds before the clip at white (on a floor of luma 0.3, above 0.7 saturates)"""
    flare_p: float | None = None
    """probability of a lens flare from a source near the horizon or above the frame: glow, streak, a chain of 4
    ghost discs through the image centre, and a veil; unset: lighting_p"""
    flare_gain: tuple[float, float] = (0.4, 1.0)
    """peak luma the flare's glow adds (the ghosts add 5-25 % of it, the veil 1-6 %)"""
    motion_blur_p: float | None = None
    """probability of a short directional blur; unset: lighting_p"""
    motion_blur_px: float = 5.0
    """longest blur (px; each window draws from 1 to this)"""
    motion_blur_tilt_deg: float = 20.0
    """largest tilt of the blur from horizontal (degrees): yaw dominates the camera's motion"""
    exposure_p: float | None = None
    """probability of an auto-exposure change at a random frame inside the window; unset: lighting_p"""
    exposure_stops: float = 1.0
    """largest exposure change (stops, either sign; each draw is at least a quarter of it)"""
    exposure_ramp_frames: int = 4
    """longest settling of the exposure change (frames; 1 = always a step)"""
    horizon: float = 0.4
    """image-row fraction of the horizon (the default mount, 15 degrees down with a 120-degree pinhole, puts it at
    0.40): cast shadows and glare stay below it, flare sources at or above it"""

    def __post_init__(self) -> None:
        for name in (*BASIC, "lighting"):
            check_range(f"augment.{name}_p", getattr(self, f"{name}_p"), 0.0, 1.0)
        for name in LIGHTING:
            if getattr(self, f"{name}_p") is not None:
                check_range(f"augment.{name}_p", getattr(self, f"{name}_p"), 0.0, 1.0)
        check_range("augment.translate_px", self.translate_px, 0, 60)
        check_range("augment.noise_density", self.noise_density, 0.0, 0.5)
        check_range("augment.brightness", self.brightness, 0.0, 1.0)
        check_range("augment.tone", self.tone, 0.0, 1.0)
        check_interval("augment.cast_shadow_strength", self.cast_shadow_strength, 0.0, 1.0)
        check_interval("augment.cast_shadow_width_px", self.cast_shadow_width_px, 0.5, 200.0)
        check_range("augment.cast_shadow_drift", self.cast_shadow_drift, 0.0, 0.1)
        check_interval("augment.glare_size_px", self.glare_size_px, 1.0, 200.0)
        check_interval("augment.glare_gain", self.glare_gain, 0.0, 4.0)
        check_interval("augment.flare_gain", self.flare_gain, 0.0, 4.0)
        check_range("augment.motion_blur_px", self.motion_blur_px, 1.0, 21.0)
        check_range("augment.motion_blur_tilt_deg", self.motion_blur_tilt_deg, 0.0, 90.0)
        check_range("augment.exposure_stops", self.exposure_stops, 0.0, 4.0)
        check_range("augment.exposure_ramp_frames", self.exposure_ramp_frames, 1, 60)
        check_range("augment.horizon", self.horizon, 0.0, 0.9)

    def probability(self, name: str) -> float:
        """The probability an augmentation runs on a window (a lighting one's own, else `lighting_p`)."""
        own = getattr(self, f"{name}_p")
        return self.lighting_p if own is None else own

    @property
    def lighting_on(self) -> bool:
        return any(self.probability(name) > 0.0 for name in LIGHTING)

    @classmethod
    def off(cls) -> AugmentConfig:
        return cls(enabled=False)

    @classmethod
    def only(cls, name: str) -> AugmentConfig:
        """One augmentation at probability 1, the others off (for ablations)."""
        if name not in (*BASIC, *LIGHTING):
            raise ConfigError(f"augmentation {name!r} is unknown; known: {', '.join((*BASIC, *LIGHTING))}")
        probs = {f"{k}_p": 0.0 for k in (*BASIC, *LIGHTING)}
        probs[f"{name}_p"] = 1.0
        return cls(**probs)


def _uniform(b: int, lo: float, hi: float, g: torch.Generator, device) -> Tensor:
    return lo + (hi - lo) * torch.rand(b, generator=g, device=device)


def _color(x: Tensor, tone: Tensor, gain: Tensor, shift: Tensor) -> Tensor:
    """Tone curve, contrast and brightness per window; uint8 frames are scaled to [0, 1] first."""
    if x.dtype == torch.uint8:
        x = x.float() * (1.0 / 255.0)
    v = (x.shape[0], 1, 1, 1, 1)
    y = torch.addcmul(x, tone.view(v) * x, 1.0 - x)
    return (y - 0.5) * gain.view(v) + (0.5 + shift.view(v))


def _shadow(y: Tensor, shadow: Tensor) -> Tensor:
    """Scale the luma on one side of each window's straight edge by its strength."""
    h, w = y.shape[-2:]
    v = (y.shape[0], 1, 1, 1, 1)
    ys = torch.linspace(-1.0, 1.0, h, device=y.device).view(1, 1, 1, h, 1)
    xs = torch.linspace(-1.0, 1.0, w, device=y.device).view(1, 1, 1, 1, w)
    inside = shadow[:, 0].view(v) * xs + shadow[:, 1].view(v) * ys > shadow[:, 2].view(v)
    return torch.where(inside, y * shadow[:, 3].view(v), y)


def _sharpen(y: Tensor, sharp: Tensor) -> Tensor:
    """Unsharp mask (negative amounts blur) with a 3x3 box blur."""
    b, t, c, h, w = y.shape
    blur = F.avg_pool2d(y.reshape(b * t, c, h, w), 3, stride=1, padding=1, count_include_pad=False).view(y.shape)
    return torch.addcmul(y, sharp.view(b, 1, 1, 1, 1), y - blur)


def photometric(x: Tensor, tone: Tensor, gain: Tensor, shift: Tensor, shadow: Tensor, sharp: Tensor) -> Tensor:
    """Color, shadow and sharpen in one pass. x `(B, T, 1, H, W)` in [0, 1] (or uint8); per-window parameters
    `(B,)`: tone, contrast gain, brightness shift, shadow `(B, 4)` = (cos, sin, offset, strength), sharpen amount."""
    return _sharpen(_shadow(_color(x, tone, gain, shift), shadow), sharp).clamp(0.0, 1.0)


def photometric_sparse(x: Tensor, tone: Tensor, gain: Tensor, shift: Tensor, shadow: Tensor, sharp: Tensor) -> Tensor:
    """`photometric` computed eagerly with the shadow and the sharpen passes only over the windows whose parameters
    are not neutral: the same result bit for bit (a neutral shadow multiplies by 1, a neutral sharpen adds 0), at
    a fraction of the memory traffic. The eager path, and the fallback when the fused pass cannot be compiled."""
    y = _color(x, tone, gain, shift)
    shaded = (shadow[:, 3] != 1.0).nonzero(as_tuple=True)[0]
    if len(shaded):
        y[shaded] = _shadow(y[shaded], shadow[shaded])
    sharpened = (sharp != 0.0).nonzero(as_tuple=True)[0]
    if len(sharpened):
        y[sharpened] = _sharpen(y[sharpened], sharp[sharpened])
    return y.clamp_(0.0, 1.0)


_compiled_photometric = maybe_compile(photometric, True, fallback=photometric_sparse)


def translate_(x: Tensor, dx: list[int], dy: list[int], windows: list[int]) -> None:
    """Shift the given windows in place by whole pixels; uncovered borders repeat the nearest edge."""
    h, w = x.shape[-2:]
    for i, sx, sy in zip(windows, dx, dy):
        src = x[i].clone()
        x[i, :, :, max(0, sy) : h - max(0, -sy), max(0, sx) : w - max(0, -sx)] = src[
            :, :, max(0, -sy) : h - max(0, sy), max(0, -sx) : w - max(0, sx)
        ]
        if sy > 0:
            x[i, :, :, :sy] = x[i, :, :, sy : sy + 1]
        elif sy < 0:
            x[i, :, :, h + sy :] = x[i, :, :, h + sy - 1 : h + sy]
        if sx > 0:
            x[i, :, :, :, :sx] = x[i, :, :, :, sx : sx + 1]
        elif sx < 0:
            x[i, :, :, :, w + sx :] = x[i, :, :, :, w + sx - 1 : w + sx]


def salt_pepper_(x: Tensor, density: list[float], windows: list[int], g: torch.Generator) -> None:
    """Set `density` of each given window's pixels to black or white, in place (new pixels every frame)."""
    per_window = x[0].numel()
    for i, d in zip(windows, density):
        k = int(d * per_window)
        if k == 0:
            continue
        where = torch.randint(0, per_window, (k,), generator=g, device=x.device)
        # Black or white by the pixel index's parity: a pixel drawn twice gets the same value whatever the write
        # order, so parallel writes stay deterministic.
        value = (where % 2).to(x.dtype)
        x[i].view(-1).index_put_((where,), value)


def augment(x: Tensor, cfg: AugmentConfig, generator: torch.Generator, compiled: bool = False) -> Tensor:
    """Augment raw frames `(B, T, 1, H, W)` (uint8 or float in [0, 1]) -> new float tensor in [0, 1].

    `compiled` runs the fused photometric pass through torch.compile (for fixed training batch shapes)."""
    if not cfg.enabled:
        return x.float() * (1.0 / 255.0) if x.dtype == torch.uint8 else x.clone()
    b, dev, g = x.shape[0], x.device, generator
    on = {name: torch.rand(b, generator=g, device=dev) < p for name, p in (
        ("color", cfg.color_p), ("translate", cfg.translate_p), ("shadow", cfg.shadow_p),
        ("sharpen", cfg.sharpen_p), ("noise", cfg.noise_p),
    )}  # fmt: skip
    # Parameters for every window (neutral where an augmentation is off), so the stream is independent of the mix.
    tone = torch.where(on["color"], _uniform(b, -cfg.tone, cfg.tone, g, dev), 0.0)
    gain = torch.where(on["color"], _uniform(b, *cfg.contrast, g, dev), 1.0)
    shift = torch.where(on["color"], _uniform(b, -cfg.brightness, cfg.brightness, g, dev), 0.0)
    angle = _uniform(b, 0.0, 2 * torch.pi, g, dev)
    shadow = torch.stack([
        torch.cos(angle), torch.sin(angle), _uniform(b, -0.6, 0.6, g, dev),
        torch.where(on["shadow"], _uniform(b, *cfg.shadow_strength, g, dev), 1.0),
    ], dim=1)  # fmt: skip
    sharp = torch.where(on["sharpen"], _uniform(b, -cfg.sharpen_amount, cfg.sharpen_amount, g, dev), 0.0)
    m = cfg.translate_px
    dx = torch.randint(-m, m + 1, (b,), generator=g, device=dev).tolist()
    dy = torch.randint(-m, m + 1, (b,), generator=g, device=dev).tolist()
    density = _uniform(b, 0.0, cfg.noise_density, g, dev).tolist()

    moved = on["translate"].nonzero(as_tuple=True)[0].tolist()
    if moved:
        x = x.clone()
        translate_(x, [dx[i] for i in moved], [dy[i] for i in moved], moved)
    fn = _compiled_photometric if compiled else photometric_sparse
    out = fn(x, tone, gain, shift, shadow, sharp)
    if cfg.lighting_on:  # drawn only then, so runs without the group keep their random stream
        lighting_(out, draw_lighting(cfg, out.shape, g, dev))
    noisy = on["noise"].nonzero(as_tuple=True)[0].tolist()
    if noisy:
        salt_pepper_(out, [density[i] for i in noisy], noisy, g)
    return out
