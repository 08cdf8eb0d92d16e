"""Built-in tracks, generated in code, and `load_track` which also accepts DeepRacer route files.

- `oval`: two straights joined by two semicircles.
- `reinvent2018`: a re:Invent-2018-like loop: ~17.7 m centerline, 0.76 m wide, a long main straight, a 180° turn,
  an S-bend (both turn directions) and two 90° corners.
- `technical`: a tight technical loop, 1.07 m wide, 22.5 m, with a right-hand hairpin inside a left-hand loop.

Tracks are chains of straights and circular arcs; two straights are solved so each loop closes exactly.

All three are drivable in both directions (the env reverses the travel direction per episode).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from envs.errors import ConfigError
from envs.racing.track import Track


def _oval(straight: float = 3.0, radius: float = 1.2, step: float = 0.1) -> np.ndarray:
    pts = []
    n_straight = int(round(straight / step))
    n_arc = int(round(np.pi * radius / step))
    for i in range(n_straight):  # bottom straight, heading +x
        pts.append((-straight / 2 + i * step, -radius))
    for i in range(n_arc):  # right semicircle, counter-clockwise
        a = -np.pi / 2 + np.pi * i / n_arc
        pts.append((straight / 2 + radius * np.cos(a), radius * np.sin(a)))
    for i in range(n_straight):  # top straight, heading -x
        pts.append((straight / 2 - i * step, radius))
    for i in range(n_arc):
        a = np.pi / 2 + np.pi * i / n_arc
        pts.append((-straight / 2 + radius * np.cos(a), radius * np.sin(a)))
    return np.asarray(pts)


Piece = tuple[str, float | None] | tuple[str, float, float]
"""("S", length) is a straight (length None: solved for closure); ("A", degrees, radius) an arc, + turns left."""


def _trace(pieces: list[Piece], step: float = 0.05) -> tuple[np.ndarray, np.ndarray, float]:
    """Points along straights and arcs from the origin heading +x; returns (points, end point, end heading)."""
    x, h, pts = np.zeros(2), 0.0, []
    for piece in pieces:
        if piece[0] == "S":
            n = max(1, int(round(piece[1] / step)))
            for _ in range(n):
                pts.append(x.copy())
                x = x + (piece[1] / n) * np.array([np.cos(h), np.sin(h)])
        else:
            angle, radius = np.radians(piece[1]), piece[2]
            n, sign = max(2, int(round(abs(angle) * radius / step))), np.sign(angle)
            center = x + sign * radius * np.array([-np.sin(h), np.cos(h)])
            for _ in range(n):
                pts.append(x.copy())
                h += angle / n
                x = center - sign * radius * np.array([-np.sin(h), np.cos(h)])
    return np.asarray(pts), x, h


def _closed_loop(pieces: list[Piece]) -> np.ndarray:
    """Solve the two free straights (length None, not parallel) so the loop closes exactly; arcs must sum to 360°."""
    free = [i for i, p in enumerate(pieces) if p[0] == "S" and p[1] is None]
    fixed = [("S", 0.0) if i in free else p for i, p in enumerate(pieces)]
    _, end, heading = _trace(fixed)
    assert abs(heading - 2 * np.pi) < 1e-6 and len(free) == 2, "arcs must turn 360° with two free straights"
    headings = np.cumsum([0.0] + [np.radians(p[1]) if p[0] == "A" else 0.0 for p in pieces])[free]
    lengths = np.linalg.solve(np.stack([np.cos(headings), np.sin(headings)]), -end)
    assert (lengths > 0).all(), f"closure needs positive straights, got {lengths}"
    solved = [("S", float(lengths[free.index(i)])) if i in free else p for i, p in enumerate(pieces)]
    return _trace(solved)[0]


# re:Invent 2018-like (counter-clockwise): main straight, 180° right-end turn, a kink down-left through a -50/+50
# S-bend, the back straight, two 90° corners (the last one the tightest) back onto the main straight.
_REINVENT2018: list[Piece] = [
    ("S", None), ("A", 180, 0.75), ("S", 2.0), ("A", -50, 0.9), ("S", 1.0), ("A", 50, 0.9),
    ("S", 1.42), ("A", 90, 0.8), ("S", None), ("A", 90, 0.6),
]  # fmt: skip
# Technical loop: four 90° corners around a right-hand hairpin pushed into the middle of the loop.
_TECHNICAL: list[Piece] = [
    ("S", None), ("A", 90, 0.7), ("S", 2.2), ("A", 90, 0.7), ("S", 0.7), ("A", 90, 0.6), ("S", 0.2),
    ("A", -180, 0.75), ("S", 0.9), ("A", 90, 0.7), ("S", 1.6), ("A", 90, 0.7), ("S", None), ("A", 90, 0.7),
]  # fmt: skip


def _centered(points: np.ndarray) -> np.ndarray:
    return points - 0.5 * (points.min(axis=0) + points.max(axis=0))


BUILTIN_TRACKS: dict[str, tuple[Callable[[], np.ndarray], float]] = {
    "oval": (lambda: _centered(_oval()), 0.9),
    "reinvent2018": (lambda: _centered(_closed_loop(_REINVENT2018)), 0.76),
    "technical": (lambda: _centered(_closed_loop(_TECHNICAL)), 1.07),
}
"""name -> (centerline generator, width in metres)"""


def builtin_track(name: str, spacing: float = 0.1, device: str = "cpu") -> Track:
    """Generate one of the built-in tracks."""
    if name not in BUILTIN_TRACKS:
        raise ConfigError(f"unknown track {name!r}; built-in tracks are {sorted(BUILTIN_TRACKS)} (or a .npy path)")
    make, width = BUILTIN_TRACKS[name]
    return Track(make(), width, name=name, spacing=spacing, device=device)


def load_track(spec: str, spacing: float = 0.1, device: str = "cpu") -> Track:
    """A built-in track by name, or a DeepRacer route file by path (`*.npy`)."""
    if spec.endswith(".npy") or Path(spec).suffix == ".npy":
        return Track.from_deepracer_npy(spec, spacing=spacing, device=device)
    return builtin_track(spec, spacing=spacing, device=device)
