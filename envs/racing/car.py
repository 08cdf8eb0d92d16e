"""DeepRacer-class car: constants, action spaces (DeepRacer `model_metadata.json`) and the calibration table.

The policy chooses an action; the action space turns it into a commanded (steering angle, speed); the calibration
table turns that command into what the car measurably does (the real car maps each action to servo and throttle
values through measured steering angles and speeds). Physics then follows the calibrated targets.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor

from envs.errors import ActionSpaceError, ConfigError, check_range

MAX_SPEED_PERCENT_RANGE = (10.0, 100.0)
"""allowed values of the car's maximum-speed setting (%), wherever it is set"""


@dataclass(frozen=True)
class CarSpec:
    """Physical constants of a 1/18-scale DeepRacer-class car (SI units)."""

    wheelbase: float = 0.164
    """front-to-rear axle distance (m)"""
    cg_to_front: float = 0.082
    """centre of gravity to front axle (m); the rear distance is wheelbase minus this"""
    track_width: float = 0.162
    """left-to-right wheel distance (m)"""
    wheel_radius: float = 0.0325
    """wheel radius (m)"""
    mass: float = 1.5
    """total mass (kg)"""
    yaw_inertia: float = 0.015
    """yaw moment of inertia about the centre of gravity (kg m^2)"""
    max_steering_deg: float = 30.0
    """steering limit either side (degrees)"""
    min_speed: float = 0.1
    """lowest speed command (m/s)"""
    max_speed: float = 4.0
    """highest speed command (m/s)"""
    cornering_stiffness: float = 12.0
    """normalized tire cornering stiffness: lateral force per unit load per radian of slip"""
    steering_time_constant: float = 0.06
    """first-order steering servo lag (s)"""
    motor_time_constant: float = 0.20
    """first-order lag from speed command to longitudinal speed (s)"""
    max_accel: float = 4.0
    """largest forward acceleration of the drivetrain (m/s^2)"""
    max_brake: float = 6.0
    """largest deceleration (m/s^2)"""
    drivetrain: Literal["all", "rear"] = "all"
    """driven wheels of the contact-wheel (genesis) car; the DeepRacer chassis is four-wheel drive"""

    def __post_init__(self) -> None:
        check_range("car.wheelbase", self.wheelbase, 0.05, 1.0)
        check_range("car.cg_to_front", self.cg_to_front, 0.0, self.wheelbase)
        check_range("car.mass", self.mass, 0.1, 50.0)
        check_range("car.max_steering_deg", self.max_steering_deg, 1.0, 45.0)
        check_range("car.min_speed", self.min_speed, 0.0, self.max_speed)
        check_range("car.max_speed", self.max_speed, 0.1, 20.0)
        for name in ("steering_time_constant", "motor_time_constant", "max_accel", "max_brake", "yaw_inertia"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"car.{name} must be > 0, got {getattr(self, name)}")
        if self.drivetrain not in ("all", "rear"):
            raise ConfigError(f"car.drivetrain={self.drivetrain!r}; use 'all' or 'rear'")

    @property
    def cg_to_rear(self) -> float:
        return self.wheelbase - self.cg_to_front

    @property
    def max_steering(self) -> float:
        return math.radians(self.max_steering_deg)


METADATA_KEYS = {
    "action_space",
    "action_space_type",
    "sensor",
    "neural_network",
    "training_algorithm",
    "version",
    "preprocess_type",
    "regional_parameters",
}
DISCRETE_ACTION_KEYS = {"steering_angle", "speed", "index"}


@dataclass(frozen=True)
class ActionSpace:
    """A DeepRacer action space.

    Discrete: `choices` is a tuple of (steering_deg, speed) and the policy outputs one index, so `num_actions == 1`.
    Continuous: the policy outputs two values in [-1, 1] mapped linearly onto the steering and speed boxes.
    """

    kind: str = "discrete"
    choices: tuple[tuple[float, float], ...] = ()
    steering_range: tuple[float, float] = (-30.0, 30.0)
    speed_range: tuple[float, float] = (0.5, 4.0)

    def __post_init__(self) -> None:
        validate_action_space(self.kind, self.choices, self.steering_range, self.speed_range, "action space")

    @property
    def num_actions(self) -> int:
        """Width of the action tensor the env takes (rsl_rl's `num_actions`)."""
        return 1 if self.kind == "discrete" else 2

    @property
    def num_choices(self) -> int:
        return len(self.choices)

    @property
    def num_outputs(self) -> int:
        """Width of the policy's raw output: one logit per choice (discrete) or the two means (continuous)."""
        return self.num_choices if self.kind == "discrete" else 2

    def to_dict(self) -> dict[str, Any]:
        """The saved form of the action spec (the task contract's): the `model_metadata.json` content."""
        return self.to_metadata()

    @property
    def max_speed(self) -> float:
        return max(c[1] for c in self.choices) if self.kind == "discrete" else self.speed_range[1]

    def table(self, device: str | torch.device = "cpu") -> Tensor:
        """Discrete table `(A, 2)` of (steering radians, speed m/s)."""
        rows = [(math.radians(a), s) for a, s in self.choices]
        return torch.tensor(rows, dtype=torch.float32, device=device)

    def to_commands(self, actions: Tensor, table: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Policy actions -> commanded (steering radians `(N,)`, speed m/s `(N,)`)."""
        if self.kind == "discrete":
            table = self.table(actions.device) if table is None else table
            idx = actions.reshape(actions.shape[0], -1)[:, 0].round().long().clamp(0, self.num_choices - 1)
            cmd = table[idx]
            return cmd[:, 0], cmd[:, 1]
        a = actions.reshape(actions.shape[0], 2).clamp(-1.0, 1.0)
        lo_s, hi_s = (math.radians(v) for v in self.steering_range)
        steer = lo_s + (a[:, 0] + 1.0) * 0.5 * (hi_s - lo_s)
        speed = self.speed_range[0] + (a[:, 1] + 1.0) * 0.5 * (self.speed_range[1] - self.speed_range[0])
        return steer, speed

    def normalized(self, steer: Tensor, speed: Tensor, max_steering: float) -> Tensor:
        """Commands as the `(N, 2)` observation of a previous action: steering / max, speed / action max speed."""
        return torch.stack([steer / max_steering, speed / self.max_speed], dim=-1)

    # ------------------------------------------------------------------------------------ model_metadata.json
    def to_metadata(self) -> dict[str, Any]:
        """The DeepRacer `model_metadata.json` content for this action space (camera sensor, PPO)."""
        if self.kind == "discrete":
            space: Any = [
                {"steering_angle": float(a), "speed": float(s), "index": i} for i, (a, s) in enumerate(self.choices)
            ]
        else:
            space = {
                "steering_angle": {"low": float(self.steering_range[0]), "high": float(self.steering_range[1])},
                "speed": {"low": float(self.speed_range[0]), "high": float(self.speed_range[1])},
            }
        return {
            "action_space": space,
            "action_space_type": self.kind,
            "sensor": ["FRONT_FACING_CAMERA"],
            "neural_network": "DEEP_CONVOLUTIONAL_NETWORK_SHALLOW",
            "training_algorithm": "clipped_ppo",
            "version": "5",
        }

    @classmethod
    def from_metadata(cls, data: dict[str, Any], source: str = "model_metadata.json") -> ActionSpace:
        if not isinstance(data, dict):
            raise ActionSpaceError(f"{source}: expected a JSON object at the top level")
        unknown = set(data) - METADATA_KEYS
        if unknown:
            raise ActionSpaceError(f"{source}: unknown keys {sorted(unknown)}; allowed {sorted(METADATA_KEYS)}")
        if "action_space" not in data:
            raise ActionSpaceError(f"{source}: missing 'action_space'")
        space = data["action_space"]
        kind = data.get("action_space_type", "continuous" if isinstance(space, dict) else "discrete")
        if kind == "discrete":
            if not isinstance(space, list) or not space:
                raise ActionSpaceError(f"{source}: discrete 'action_space' must be a non-empty list")
            choices = []
            for i, entry in enumerate(space):
                if not isinstance(entry, dict):
                    raise ActionSpaceError(f"{source}: action_space[{i}] must be an object")
                bad = set(entry) - DISCRETE_ACTION_KEYS
                if bad:
                    raise ActionSpaceError(f"{source}: action_space[{i}] has unknown keys {sorted(bad)}")
                if "steering_angle" not in entry or "speed" not in entry:
                    raise ActionSpaceError(f"{source}: action_space[{i}] needs 'steering_angle' and 'speed'")
                choices.append((_number(entry["steering_angle"], source, i), _number(entry["speed"], source, i)))
            validate_action_space("discrete", choices, (-30.0, 30.0), (0.5, 4.0), source)
            return cls(kind="discrete", choices=tuple(choices))
        if kind == "continuous":
            if not isinstance(space, dict) or set(space) != {"steering_angle", "speed"}:
                raise ActionSpaceError(
                    f"{source}: continuous 'action_space' needs exactly 'steering_angle' and 'speed'"
                )
            boxes = []
            for key in ("steering_angle", "speed"):
                box = space[key]
                if not isinstance(box, dict) or set(box) != {"low", "high"}:
                    raise ActionSpaceError(f"{source}: action_space.{key} must be {{'low': ..., 'high': ...}}")
                boxes.append((_number(box["low"], source, key), _number(box["high"], source, key)))
            validate_action_space("continuous", (), boxes[0], boxes[1], source)
            return cls(kind="continuous", steering_range=boxes[0], speed_range=boxes[1])
        raise ActionSpaceError(f"{source}: action_space_type must be 'discrete' or 'continuous', got {kind!r}")

    @classmethod
    def load(cls, path: str | Path) -> ActionSpace:
        return cls.from_metadata(read_json(path, "file"), source=str(path))

    def save(self, path: str | Path) -> None:
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_metadata(), indent=2))
        tmp.replace(path)


def read_json(path: str | Path, what: str) -> Any:
    """Parsed JSON of `path`; a missing file or invalid JSON is an ActionSpaceError naming the file."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ActionSpaceError(f"{path}: {what} not found") from None
    except json.JSONDecodeError as err:
        raise ActionSpaceError(f"{path}: invalid JSON ({err})") from None


def _number(value: Any, source: str, where: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ActionSpaceError(f"{source}: action_space[{where}] value {value!r} is not a finite number")
    return float(value)


def validate_action_space(
    kind: str,
    choices: tuple[tuple[float, float], ...] | list[tuple[float, float]],
    steering_range: tuple[float, float],
    speed_range: tuple[float, float],
    source: str,
    spec: CarSpec | None = None,
) -> None:
    """Steering within the car's limit, speeds within its range, a non-empty discrete table."""
    spec = spec or CarSpec()
    lim = spec.max_steering_deg
    if kind == "discrete":
        if not choices:
            raise ActionSpaceError(f"{source}: empty action list")
        for i, (angle, speed) in enumerate(choices):
            if abs(angle) > lim + 1e-9:
                raise ActionSpaceError(f"{source}: action {i} steering_angle {angle} is outside ±{lim}°")
            if not (spec.min_speed - 1e-9 <= speed <= spec.max_speed + 1e-9):
                raise ActionSpaceError(
                    f"{source}: action {i} speed {speed} is outside [{spec.min_speed}, {spec.max_speed}]"
                )
    elif kind == "continuous":
        lo, hi = steering_range
        if not (-lim - 1e-9 <= lo < hi <= lim + 1e-9):
            raise ActionSpaceError(
                f"{source}: steering_angle box [{lo}, {hi}] must satisfy -{lim} <= low < high <= {lim}"
            )
        lo, hi = speed_range
        if not (spec.min_speed - 1e-9 <= lo < hi <= spec.max_speed + 1e-9):
            raise ActionSpaceError(
                f"{source}: speed box [{lo}, {hi}] must satisfy {spec.min_speed} <= low < high <= {spec.max_speed}"
            )
    else:
        raise ActionSpaceError(f"{source}: kind must be 'discrete' or 'continuous', got {kind!r}")


def discrete_grid(angles: tuple[float, ...], speeds: tuple[float, ...]) -> ActionSpace:
    """The DeepRacer console's grid: every steering angle with every speed."""
    return ActionSpace(kind="discrete", choices=tuple((float(a), float(s)) for a in angles for s in speeds))


DEFAULT_ANGLES = (-30.0, -15.0, 0.0, 15.0, 30.0)
DEFAULT_SPEEDS = (1.4, 2.8)
ACTION_SPACES: dict[str, ActionSpace] = {
    "default": discrete_grid(DEFAULT_ANGLES, DEFAULT_SPEEDS),
    "console-default": discrete_grid(DEFAULT_ANGLES, (0.5, 1.0)),
    "fast-throttle": discrete_grid(DEFAULT_ANGLES, (1.8, 3.6)),
    "continuous": ActionSpace(kind="continuous", steering_range=(-30.0, 30.0), speed_range=(0.5, 3.5)),
}
"""Named action spaces; `default` is 5 angles x 2 speeds. Any `model_metadata.json` path works too."""


def load_action_space(spec: str) -> ActionSpace:
    """A named action space or a DeepRacer `model_metadata.json` path."""
    if spec in ACTION_SPACES:
        return ACTION_SPACES[spec]
    if spec.endswith(".json"):
        return ActionSpace.load(spec)
    raise ConfigError(
        f"unknown action space {spec!r}; use one of {sorted(ACTION_SPACES)} or a model_metadata.json path"
    )


@dataclass(frozen=True)
class Calibration:
    """Piecewise-linear maps from commanded to measured steering angle (degrees) and speed (m/s).

    Identity by default. A JSON file holds `{"steering": {"command": [...], "measured": [...]},
    "speed": {"command": [...], "measured": [...]}}` with increasing commands.
    """

    steering_command: tuple[float, ...] = (-30.0, 30.0)
    steering_measured: tuple[float, ...] = (-30.0, 30.0)
    speed_command: tuple[float, ...] = (0.0, 4.0)
    speed_measured: tuple[float, ...] = (0.0, 4.0)
    source: str = field(default="identity", compare=False)

    def __post_init__(self) -> None:
        for name in ("steering", "speed"):
            cmd, meas = getattr(self, f"{name}_command"), getattr(self, f"{name}_measured")
            if len(cmd) < 2 or len(cmd) != len(meas):
                raise ActionSpaceError(f"{self.source}: {name} needs >= 2 command/measured pairs of equal length")
            if any(b <= a for a, b in itertools.pairwise(cmd)):
                raise ActionSpaceError(f"{self.source}: {name}.command must be strictly increasing")
            if not all(math.isfinite(v) for v in (*cmd, *meas)):
                raise ActionSpaceError(f"{self.source}: {name} has a non-finite value")

    @classmethod
    def load(cls, path: str | Path) -> Calibration:
        path = Path(path)
        data = read_json(path, "calibration file")
        if not isinstance(data, dict) or set(data) - {"steering", "speed"}:
            raise ActionSpaceError(f"{path}: calibration needs only 'steering' and 'speed' tables")
        kwargs: dict[str, Any] = {"source": str(path)}
        for name in ("steering", "speed"):
            if name in data:
                table = data[name]
                if not isinstance(table, dict) or set(table) != {"command", "measured"}:
                    raise ActionSpaceError(f"{path}: {name} must be {{'command': [...], 'measured': [...]}}")
                kwargs[f"{name}_command"] = tuple(float(v) for v in table["command"])
                kwargs[f"{name}_measured"] = tuple(float(v) for v in table["measured"])
        return cls(**kwargs)

    def apply(self, steer_rad: Tensor, speed: Tensor) -> tuple[Tensor, Tensor]:
        """Commanded (radians, m/s) -> measured (radians, m/s); linear extrapolation is clamped to the table ends."""
        deg = torch.rad2deg(steer_rad)
        steer = torch.deg2rad(interp1d(deg, self.steering_command, self.steering_measured))
        return steer, interp1d(speed, self.speed_command, self.speed_measured)


def interp1d(x: Tensor, xp: tuple[float, ...], fp: tuple[float, ...]) -> Tensor:
    """Batched piecewise-linear interpolation, constant beyond the ends (like numpy.interp)."""
    if len(xp) == 2 and xp == fp:
        return x.clamp(xp[0], xp[1])
    xp_t = torch.tensor(xp, dtype=x.dtype, device=x.device)
    fp_t = torch.tensor(fp, dtype=x.dtype, device=x.device)
    xc = x.clamp(xp_t[0], xp_t[-1])
    idx = (torch.searchsorted(xp_t, xc.contiguous(), right=True) - 1).clamp(0, len(xp) - 2)
    x0, x1, f0, f1 = xp_t[idx], xp_t[idx + 1], fp_t[idx], fp_t[idx + 1]
    return f0 + (xc - x0) * (f1 - f0) / (x1 - x0)
