"""Errors for bad input. Each message names the file or field and what is wrong; CLIs print it without a traceback."""

from __future__ import annotations


class GapbridgeError(Exception):
    """Base class for input errors that a command-line entry point reports as one line and exits non-zero."""


class ConfigError(GapbridgeError, ValueError):
    """A configuration field is out of range or inconsistent with another one."""


class TrackFileError(GapbridgeError, ValueError):
    """A track file (DeepRacer route `.npy`) is malformed."""


class ActionSpaceError(GapbridgeError, ValueError):
    """A DeepRacer `model_metadata.json` action space or calibration table is invalid."""


class RewardFunctionError(GapbridgeError):
    """A user's DeepRacer `reward_function(params)` raised or returned something other than a finite number."""


def check_range(name: str, value: float, low: float, high: float) -> None:
    """Raise ConfigError unless low <= value <= high."""
    if not (low <= value <= high):
        raise ConfigError(f"{name}={value!r} is out of range; allowed [{low}, {high}]")


def check_interval(name: str, interval: tuple[float, float], low: float, high: float) -> None:
    """Raise ConfigError unless interval is (a, b) with low <= a <= b <= high."""
    if len(interval) != 2:
        raise ConfigError(f"{name}={interval!r} must be a pair (low, high)")
    a, b = interval
    if not (low <= a <= b <= high):
        raise ConfigError(f"{name}={interval!r} is invalid; need {low} <= low <= high <= {high}")
