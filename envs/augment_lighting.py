"""Lighting augmentations: what a low sun, a glossy floor and a small wide-angle lens do to the student's frames.

The training scene is lit evenly; under windows and outdoors the car's camera also sees

- long cast shadows: a low sun stretches the shadows of poles, people and barriers into long dark bands on the
  floor. Parallel on the ground (along the sun's azimuth), they fan out in the image from one vanishing point on
  the horizon and narrow toward it like any ground feature. The sun's half-degree disc makes a penumbra far
  narrower than a pixel at these ranges, so the edges are hard (anti-aliased over one pixel). Only skylight
  reaches the floor inside: the luma is multiplied by a strength below 1. The casting objects stand still in the
  world, so the car's sideways motion relative to the shadows turns the bands slowly about the vanishing point
  over a window (motion along them changes nothing);
- specular glare: the sun or a lamp mirrored by the glossy floor, a bright patch that saturates the sensor in its
  core and fades at its edge (an elliptical Gaussian added to the luma, clipped at white). A mirror image of a
  distant source moves with the camera, not with the floor, so a patch holds still over a window;
- lens flare: a bright source in or just above the frame leaves a glow and a thin streak through it, and a chain
  of ghost discs (reflections between lens surfaces) on the line from the source through the image centre, over
  a faint veil that lifts the blacks. Additive, clipped at white, constant over a window;
- motion blur: yaw while cornering smears the frame mostly sideways during the exposure: a line kernel a few
  pixels long, tilted a little from horizontal, one per window;
- exposure steps: the auto exposure jumps when the sun comes into view or leaves it. The gain steps, or ramps over
  a few frames as the exposure loop settles, from 1 to 2^stops at a random frame inside the window: the one effect
  that changes over a window's time.

White balance needs no effect of its own: on a gray camera a white-balance change only rescales the luma, which the
per-window brightness and contrast of the color augmentation already cover.

All parameters are drawn for every window, so the random stream does not depend on which effects run; the light
maps are computed only for the windows where an effect is on. Coordinates are pixels, origin at the top-left
corner, pixel centres at half-integers.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple, TypeVar

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

if TYPE_CHECKING:
    from envs.augment import AugmentConfig

LIGHTING = ("cast_shadow", "glare", "flare", "motion_blur", "exposure")
"""the lighting augmentations, in the order they are applied (scene, optics, motion, sensor)"""
SHADOW_BANDS = 3
"""most cast-shadow bands in a window: the first always, the others each with probability 1/2"""
GLARE_PATCHES = 3
"""most glare patches in a window: the first always, the others each with probability 1/2"""
FLARE_GHOSTS = 4
"""ghost discs of a lens flare"""


class CastShadows(NamedTuple):
    """Per window `(B,)`: vanishing point column `vp_x`, rotation `drift` (rad per frame), luma `strength` inside;
    per band `(B, K)`: a point on its axis (`foot_x`, `foot_y`: where the caster stands), its width at the bottom
    row (px), the side of the foot it runs to (+1 away from the vanishing point, -1 toward it), its presence."""

    vp_x: Tensor
    drift: Tensor
    strength: Tensor
    foot_x: Tensor
    foot_y: Tensor
    width: Tensor
    side: Tensor
    present: Tensor


class Glare(NamedTuple):
    """Per patch `(B, K)`: centre, semi-axes (px), orientation (rad), peak added luma, presence."""

    x: Tensor
    y: Tensor
    a: Tensor
    b: Tensor
    angle: Tensor
    gain: Tensor
    present: Tensor


class Flare(NamedTuple):
    """Per window `(B,)`: source position, glow radius (px), streak direction (rad) and decay length (px), peak
    added luma, veil; per ghost `(B, G)`: position on the source-centre line (0 centre, 1 source), radius, luma."""

    x: Tensor
    y: Tensor
    glow: Tensor
    streak_angle: Tensor
    streak_len: Tensor
    gain: Tensor
    veil: Tensor
    ghost_at: Tensor
    ghost_radius: Tensor
    ghost_gain: Tensor


class MotionBlur(NamedTuple):
    """Per window `(B,)`: blur length (px, 1 = none) and direction (rad from horizontal)."""

    length: Tensor
    angle: Tensor


class ExposureStep(NamedTuple):
    """Per window `(B,)`: first changed frame, frames the change takes (1: a step), final change in stops."""

    start: Tensor
    frames: Tensor
    stops: Tensor


class LightingDraw(NamedTuple):
    """Everything drawn for one batch of windows; `on (B, 5)` in `LIGHTING` order."""

    on: Tensor
    shadows: CastShadows
    glare: Glare
    flare: Flare
    blur: MotionBlur
    exposure: ExposureStep
    horizon: float
    """horizon row (px)"""
    blur_radius: tuple[int, int]
    """half-height and half-width of the blur kernel (px)"""


P = TypeVar("P", CastShadows, Glare, Flare, MotionBlur, ExposureStep)


def _take(p: P, idx: Tensor) -> P:
    return type(p)(*(v[idx] for v in p))


def _u(shape: int | tuple[int, ...], lo: float, hi: float, g: torch.Generator, dev: torch.device) -> Tensor:
    return lo + (hi - lo) * torch.rand(shape, generator=g, device=dev)


def _present(b: int, k: int, g: torch.Generator, dev: torch.device) -> Tensor:
    present = torch.rand(b, k, generator=g, device=dev) < 0.5
    present[:, 0] = True
    return present


def _draw_shadows(cfg: AugmentConfig, b: int, h: int, w: int, g: torch.Generator, dev: torch.device) -> CastShadows:
    horizon, floor, k = cfg.horizon * h, (1.0 - cfg.horizon) * h, SHADOW_BANDS
    foot_x = _u((b, k), -0.25 * w, 1.25 * w, g, dev)
    foot_y = _u((b, k), horizon + 0.2 * floor, h + 0.5 * floor, g, dev)  # below the frame: a caster nearby
    side = torch.where(torch.rand(b, k, generator=g, device=dev) < 0.5, -1.0, 1.0)
    # The first band crosses the frame: its caster stands within the frame's columns, and one standing below the
    # frame casts toward the horizon.
    foot_x[:, 0] = (foot_x[:, 0] + 0.25 * w) / 1.5
    side[:, 0] = torch.where(foot_y[:, 0] > h, -1.0, side[:, 0])
    return CastShadows(
        vp_x=w / 2 + w / 2 * torch.tan(_u(b, -1.35, 1.35, g, dev)),  # sun azimuth within ±77° of the view axis
        drift=_u(b, -cfg.cast_shadow_drift, cfg.cast_shadow_drift, g, dev),
        strength=_u(b, *cfg.cast_shadow_strength, g, dev),
        foot_x=foot_x,
        foot_y=foot_y,
        width=_u((b, k), *cfg.cast_shadow_width_px, g, dev),
        side=side,
        present=_present(b, k, g, dev),
    )


def _draw_glare(cfg: AugmentConfig, b: int, h: int, w: int, g: torch.Generator, dev: torch.device) -> Glare:
    horizon, floor, k = cfg.horizon * h, (1.0 - cfg.horizon) * h, GLARE_PATCHES
    return Glare(
        x=_u((b, k), 0.0, w, g, dev),
        y=_u((b, k), horizon + 0.15 * floor, h, g, dev),
        a=_u((b, k), *cfg.glare_size_px, g, dev),
        b=_u((b, k), *cfg.glare_size_px, g, dev),
        angle=_u((b, k), 0.0, math.pi, g, dev),
        gain=_u((b, k), *cfg.glare_gain, g, dev),
        present=_present(b, k, g, dev),
    )


def _draw_flare(cfg: AugmentConfig, b: int, h: int, w: int, g: torch.Generator, dev: torch.device) -> Flare:
    gain, k = _u(b, *cfg.flare_gain, g, dev), FLARE_GHOSTS
    return Flare(
        x=_u(b, 0.0, w, g, dev),
        y=_u(b, -0.25 * h, cfg.horizon * h, g, dev),  # a low sun: near the horizon or just above the frame
        glow=_u(b, 0.02 * w, 0.06 * w, g, dev),
        streak_angle=_u(b, 0.0, math.pi, g, dev),
        streak_len=_u(b, 0.15 * w, 0.5 * w, g, dev),
        gain=gain,
        veil=gain * _u(b, 0.01, 0.06, g, dev),
        ghost_at=_u((b, k), -1.4, 0.7, g, dev),
        ghost_radius=_u((b, k), 0.012 * w, 0.08 * w, g, dev),
        ghost_gain=gain[:, None] * _u((b, k), 0.05, 0.25, g, dev),
    )


def draw_lighting(cfg: AugmentConfig, shape: tuple[int, ...], g: torch.Generator, dev: torch.device) -> LightingDraw:
    """Draw which lighting effects run on each window of a `(B, T, 1, H, W)` batch, and all their parameters."""
    b, t, _, h, w = shape
    probs = torch.tensor([cfg.probability(name) for name in LIGHTING], device=dev)
    on = torch.rand(b, len(LIGHTING), generator=g, device=dev) < probs
    shadows = _draw_shadows(cfg, b, h, w, g, dev)
    glare, flare = _draw_glare(cfg, b, h, w, g, dev), _draw_flare(cfg, b, h, w, g, dev)
    blur = MotionBlur(
        length=_u(b, 1.0, cfg.motion_blur_px, g, dev),
        angle=_u(b, -1.0, 1.0, g, dev) * math.radians(cfg.motion_blur_tilt_deg),
    )
    sign = torch.where(torch.rand(b, generator=g, device=dev) < 0.5, -1.0, 1.0)
    exposure = ExposureStep(
        start=1 + (torch.rand(b, generator=g, device=dev) * (t - 1)).floor(),  # a frame after the first
        frames=1 + (torch.rand(b, generator=g, device=dev) * cfg.exposure_ramp_frames).floor(),
        stops=sign * _u(b, 0.25 * cfg.exposure_stops, cfg.exposure_stops, g, dev),
    )
    # The kernel's taps lie within one pixel of a segment of half-length L/2 + 1/2 tilted at most `tilt`.
    reach, tilt = 0.5 * cfg.motion_blur_px + 0.5, math.radians(cfg.motion_blur_tilt_deg)
    radius = (math.floor(reach * math.sin(tilt) + 1.0), math.floor(reach + math.sin(tilt)))
    return LightingDraw(on, shadows, glare, flare, blur, exposure, cfg.horizon * h, radius)


def _grid(h: int, w: int, dev: torch.device) -> tuple[Tensor, Tensor]:
    """Pixel-centre rows `(1, H, 1)` and columns `(1, 1, W)`."""
    ys = torch.arange(h, device=dev, dtype=torch.float32) + 0.5
    xs = torch.arange(w, device=dev, dtype=torch.float32) + 0.5
    return ys.view(1, h, 1), xs.view(1, 1, w)


def cast_shadow_gain(p: CastShadows, t: int, h: int, w: int, horizon: float) -> Tensor:
    """Luma multiplier `(B, T, H, W)`: 1 in the sun, `strength` inside a band (below the horizon only)."""
    b, dev = p.vp_x.shape[0], p.vp_x.device
    ys, xs = _grid(h, w, dev)
    dx, dy = xs - p.vp_x.view(b, 1, 1), (ys - horizon).expand(b, h, w)
    phi, rho = torch.atan2(dy, dx), torch.hypot(dx, dy)  # polar coordinates about the vanishing point, (B, H, W)
    turn = p.drift.view(b, 1, 1, 1) * torch.arange(t, device=dev).view(1, t, 1, 1)  # (B, T, 1, 1)
    rho_t = rho.unsqueeze(1)
    cover = torch.zeros(b, t, h, w, device=dev)
    for k in range(p.foot_x.shape[1]):  # a few bands; windows stay batched
        fx, fy = p.foot_x[:, k] - p.vp_x, p.foot_y[:, k] - horizon
        f_rho = torch.hypot(fx, fy)
        # The width shrinks toward the horizon like any ground feature; as an angle about the vanishing point.
        half = (0.5 * p.width[:, k] * fy / (h - horizon) / f_rho).view(b, 1, 1, 1)
        off_axis = (phi - torch.atan2(fy, fx).view(b, 1, 1)).unsqueeze(1)  # (B, 1, H, W) at the first frame
        beyond = (p.side[:, k].view(b, 1, 1) * (rho - f_rho.view(b, 1, 1)) + 0.5).clamp(0.0, 1.0)
        # Per frame, in place: the distance inside the band's edge (px) + 1/2, clipped: one pixel of anti-aliasing.
        band = torch.addcmul(half * rho_t + 0.5, (off_axis - turn).abs_(), rho_t, value=-1.0).clamp_(0.0, 1.0)
        band.mul_((beyond * p.present[:, k].view(b, 1, 1)).unsqueeze(1))
        torch.maximum(cover, band, out=cover)  # overlapping shadows are one shadow
    cover.mul_(ys > horizon)
    return cover.mul_(p.strength.view(b, 1, 1, 1) - 1.0).add_(1.0)


def glare_light(p: Glare, h: int, w: int) -> Tensor:
    """Added luma `(B, H, W)` of the glare patches (unclipped)."""
    b = p.x.shape[0]
    ys, xs = _grid(h, w, p.x.device)
    light = torch.zeros(b, h, w, device=p.x.device)
    for k in range(p.x.shape[1]):
        dx, dy = xs - p.x[:, k].view(b, 1, 1), ys - p.y[:, k].view(b, 1, 1)
        c, s = torch.cos(p.angle[:, k]).view(b, 1, 1), torch.sin(p.angle[:, k]).view(b, 1, 1)
        q = ((dx * c + dy * s) / p.a[:, k].view(b, 1, 1)) ** 2 + ((dy * c - dx * s) / p.b[:, k].view(b, 1, 1)) ** 2
        light += (p.gain[:, k] * p.present[:, k]).view(b, 1, 1) * torch.exp(-q)
    return light


def flare_light(p: Flare, h: int, w: int) -> Tensor:
    """Added luma `(B, H, W)` of a lens flare: glow and streak at the source, ghosts, veil (unclipped)."""
    b = p.x.shape[0]
    ys, xs = _grid(h, w, p.x.device)
    sx, sy = p.x.view(b, 1, 1), p.y.view(b, 1, 1)
    dx, dy = xs - sx, ys - sy
    glow = torch.exp(-(dx**2 + dy**2) / (2 * p.glow.view(b, 1, 1) ** 2))
    c, s = torch.cos(p.streak_angle).view(b, 1, 1), torch.sin(p.streak_angle).view(b, 1, 1)
    along, across = dx * c + dy * s, dy * c - dx * s
    streak = 0.6 * torch.exp(-0.5 * (across / 0.8) ** 2 - along.abs() / p.streak_len.view(b, 1, 1))
    light = p.gain.view(b, 1, 1) * (glow + streak) + p.veil.view(b, 1, 1)
    cx, cy = w / 2, h / 2
    for k in range(p.ghost_at.shape[1]):
        at = p.ghost_at[:, k].view(b, 1, 1)
        r = torch.hypot(xs - (cx + at * (sx - cx)), ys - (cy + at * (sy - cy)))
        disc = ((p.ghost_radius[:, k].view(b, 1, 1) - r) / 2 + 0.5).clamp(0.0, 1.0)  # a two-pixel soft rim
        light += p.ghost_gain[:, k].view(b, 1, 1) * disc
    return light


def motion_blur(y: Tensor, p: MotionBlur, radius: tuple[int, int]) -> Tensor:
    """Average each window's frames along its short line: `y (B, T, 1, H, W)` -> same shape. The kernel is the
    anti-aliased segment of length `p.length` in a `(2 radius + 1)` kernel, one grouped convolution for the whole
    batch; borders repeat."""
    b, (rv, ru) = y.shape[0], radius
    v = torch.arange(-rv, rv + 1, device=y.device, dtype=y.dtype).view(1, -1, 1)  # kernel rows
    u = torch.arange(-ru, ru + 1, device=y.device, dtype=y.dtype).view(1, 1, -1)  # kernel columns
    c, s = torch.cos(p.angle).view(b, 1, 1), torch.sin(p.angle).view(b, 1, 1)
    along, across = u * c + v * s, v * c - u * s
    kernel = (1.0 - across.abs()).clamp(min=0.0) * (0.5 * p.length.view(b, 1, 1) + 0.5 - along.abs()).clamp(0.0, 1.0)
    kernel = kernel / kernel.sum(dim=(1, 2), keepdim=True)  # the centre tap is always > 0
    planes = F.pad(rearrange(y, "b t 1 h w -> t b h w"), (ru, ru, rv, rv), mode="replicate")
    out = F.conv2d(planes, rearrange(kernel, "b kh kw -> b 1 kh kw"), groups=b)
    return rearrange(out, "t b h w -> b t 1 h w")


def exposure_gain(p: ExposureStep, t: int) -> Tensor:
    """Gain `(B, T)`: 1 before `start`, then ramping linearly in stops to `2^stops` over `frames` frames."""
    frame = torch.arange(t, device=p.start.device).view(1, t)
    progress = ((frame - p.start.view(-1, 1) + 1) / p.frames.view(-1, 1)).clamp(0.0, 1.0)
    return torch.exp2(p.stops.view(-1, 1) * progress)


def lighting_(y: Tensor, d: LightingDraw) -> Tensor:
    """Apply the drawn effects in place to `y (B, T, 1, H, W)` float in [0, 1]: shadows and glare on the scene,
    then flare in the lens, blur during the exposure, exposure gain, and a clip to [0, 1]. Returns `y`."""
    b, t, _, h, w = y.shape
    chosen = [d.on[:, j].nonzero(as_tuple=True)[0] for j in range(len(LIGHTING))]
    shaded, glared, flared, blurred, exposed = chosen
    if len(shaded):
        y[shaded] *= cast_shadow_gain(_take(d.shadows, shaded), t, h, w, d.horizon).unsqueeze(2)
    if len(glared):
        y[glared] += rearrange(glare_light(_take(d.glare, glared), h, w), "b h w -> b 1 1 h w")
    if len(flared):
        y[flared] += rearrange(flare_light(_take(d.flare, flared), h, w), "b h w -> b 1 1 h w")
    if len(blurred):
        y[blurred] = motion_blur(y[blurred], _take(d.blur, blurred), d.blur_radius)
    if len(exposed):
        y[exposed] *= rearrange(exposure_gain(_take(d.exposure, exposed), t), "b t -> b t 1 1 1")
    return y.clamp_(0.0, 1.0)
