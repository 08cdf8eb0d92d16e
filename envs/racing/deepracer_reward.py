"""Run an unmodified DeepRacer `reward_function(params)` on our env.

The DeepRacer console calls a Python function once per step with a dict of 27 documented keys. This adapter builds
exactly that dict for every env from the batched state (a Python loop over envs: the user's function is scalar
Python, so this path is for porting and checking reward functions, not for 4096-env training).
"""

from __future__ import annotations

import importlib.util
import math
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from envs.errors import ConfigError, RewardFunctionError
from envs.racing.track import Track

PARAM_KEYS = (
    "all_wheels_on_track",
    "closest_objects",
    "closest_waypoints",
    "distance_from_center",
    "heading",
    "is_crashed",
    "is_left_of_center",
    "is_offtrack",
    "is_reversed",
    "objects_distance",
    "objects_heading",
    "objects_left_of_center",
    "objects_location",
    "objects_speed",
    "progress",
    "projection_distance",
    "speed",
    "steering_angle",
    "steps",
    "track_length",
    "track_width",
    "waypoints",
    "x",
    "y",
)


def load_reward_function(path: str | Path) -> Callable[[dict[str, Any]], float]:
    """Import `reward_function` from a user's Python file (as pasted into the DeepRacer console)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: reward function file not found")
    spec = importlib.util.spec_from_file_location(f"deepracer_reward_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    fn = getattr(module, "reward_function", None)
    if not callable(fn):
        raise ConfigError(f"{path}: defines no reward_function(params)")
    return fn


class DeepRacerParams:
    """Builds DeepRacer's `params` dicts from batched env tensors."""

    def __init__(self, track: Track) -> None:
        self.track = track
        wp = track.waypoints
        self.waypoints_fwd = [(float(x), float(y)) for x, y in wp]
        self.waypoints_rev = self.waypoints_fwd[::-1]
        # Arc position of each original waypoint on the dense centerline, for closest_waypoints.
        proj = track.project(torch.as_tensor(wp, dtype=torch.float32), torch.zeros(len(wp)))
        self.waypoint_s = proj.s.cpu().numpy().astype(np.float64)

    def closest_waypoints(self, s: float, reversed_: bool) -> list[int]:
        """[previous, next] waypoint indices around arc position s, in the travel order's indexing."""
        m = len(self.waypoint_s)
        ahead = np.remainder(self.waypoint_s - s, self.track.length)
        nxt = int(np.argmin(ahead))  # first waypoint ahead in the forward direction
        prev = (nxt - 1) % m
        if not reversed_:
            return [prev, nxt]
        # Travelling backwards: the next waypoint is the forward "prev"; indices refer to the reversed list.
        return [m - 1 - nxt, m - 1 - prev]

    def build(
        self,
        x: Tensor,
        y: Tensor,
        yaw: Tensor,
        s: Tensor,
        offset: Tensor,
        half_width: Tensor,
        travel: Tensor,
        direction: Tensor,
        steer_cmd: Tensor,
        speed_cmd: Tensor,
        steps: Tensor,
        car_half_track: float,
    ) -> list[dict[str, Any]]:
        """One params dict per env. `offset` is + left of the travel direction; `travel` is metres this episode."""
        cols = [t.detach().cpu().double().numpy() for t in (x, y, yaw, s, offset, half_width, travel, direction)]
        xs, ys, yaws, ss, offs, hws, travels, dirs = cols
        steer_deg = torch.rad2deg(steer_cmd).detach().cpu().double().numpy()
        speeds = speed_cmd.detach().cpu().double().numpy()
        steps_np = steps.detach().cpu().numpy()
        out = []
        length = self.track.length
        for i in range(len(xs)):
            reversed_ = bool(dirs[i] < 0)
            dist = abs(float(offs[i]))
            on_track = dist + car_half_track <= hws[i]
            offtrack = dist - car_half_track > hws[i]
            lap_progress = travels[i] / length
            progress = 100.0 * (lap_progress if lap_progress <= 1.0 else math.fmod(lap_progress, 1.0))
            out.append(
                {
                    "all_wheels_on_track": bool(on_track),
                    "closest_objects": [0, 0],
                    "closest_waypoints": self.closest_waypoints(float(ss[i]), reversed_),
                    "distance_from_center": dist,
                    "heading": math.degrees(float(yaws[i])),
                    "is_crashed": False,
                    "is_left_of_center": bool(offs[i] > 0),
                    "is_offtrack": bool(offtrack),
                    "is_reversed": reversed_,
                    "objects_distance": [],
                    "objects_heading": [],
                    "objects_left_of_center": [],
                    "objects_location": [],
                    "objects_speed": [],
                    "progress": float(max(0.0, progress)),
                    "projection_distance": float(ss[i] if not reversed_ else length - ss[i]),
                    "speed": float(speeds[i]),
                    "steering_angle": float(steer_deg[i]),
                    "steps": int(steps_np[i]),
                    "track_length": float(length),
                    "track_width": float(2.0 * hws[i]),
                    "waypoints": self.waypoints_rev if reversed_ else self.waypoints_fwd,
                    "x": float(xs[i]),
                    "y": float(ys[i]),
                }
            )
        return out


def evaluate_reward_function(fn: Callable[[dict[str, Any]], float], params: list[dict[str, Any]]) -> Tensor:
    """Call a DeepRacer reward function on each params dict. An exception inside it, or a result that is not a finite
    number, is a `RewardFunctionError` naming the file (and line), the env index and its step."""
    values = []
    for i, p in enumerate(params):
        try:
            r = fn(p)
        except Exception as err:  # the user's code: any exception is a mistake in that file
            raise RewardFunctionError(
                f"{_where(fn, err)}: reward_function raised {type(err).__name__}: {err} at step {p.get('steps')} of "
                f"env {i}; params keys: {', '.join(sorted(p))}"
            ) from err
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r):
            raise RewardFunctionError(
                f"{_where(fn)}: reward_function returned {r!r} at step {p.get('steps')} of env {i}; "
                "it must return a finite number"
            )
        values.append(float(r))
    return torch.tensor(values, dtype=torch.float32)


def _where(fn: Callable, err: BaseException | None = None) -> str:
    """`file` of the reward function, or `file:line` of the deepest frame of that file in `err`'s traceback."""
    code = getattr(fn, "__code__", None)
    path = code.co_filename if code is not None else getattr(fn, "__name__", "reward_function")
    frames = [f for f in traceback.extract_tb(err.__traceback__) if f.filename == path] if err is not None else []
    return f"{path}:{frames[-1].lineno}" if frames else path
