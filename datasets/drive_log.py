"""Scripted drives as real logs: a command sequence driven without a student (the calibration protocol) written in the
deployment runtime's HDF5 format, and read back with what a generated drive adds (the true camera poses, flagged).

A generated drive carries `true_pose` `(T, 3)` (x, y, yaw of the pose each row's frame was taken from) and the
attributes `pose_source` ("true camera pose") and `truth` (JSON of the parameters it was driven with); a real car's
log has neither, and its motion comes from the frames. Protocol segments are events `"<time> segment <name>"`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from datasets.real_log import RealLogWriter, read_real_log

TRUE_POSE_SOURCE = "true camera pose"
"""`pose_source` of a log whose `true_pose` is the simulator's (exact motion, no odometry)"""


@dataclass(frozen=True)
class LoggedCommand:
    """A scripted command in the runtime's command layout."""

    steering_deg: float
    speed: float
    action: int = -1
    safe_stop: bool = False


def write_scripted_log(
    path: str | Path,
    time: np.ndarray,
    steering_deg: np.ndarray,
    speed: np.ndarray,
    segments: list[tuple[int, str]],
    frames: np.ndarray | None = None,
    true_pose: np.ndarray | None = None,
    truth: dict | None = None,
    attrs: dict | None = None,
) -> Path:
    """Write a scripted drive (per row: timestamp s, steering deg, speed m/s, and a `(120, 160)` frame or a blank
    one) as a real log; `segments` are (first row, name); `true_pose` and `truth` mark a generated drive."""
    path = Path(path)
    writer = RealLogWriter(path, attrs={"source": "scripted", **(attrs or {})})
    starts = dict(segments)
    blank = np.zeros((120, 160), np.uint8)
    try:
        for k in range(len(time)):
            if k in starts:
                writer.event(float(time[k]), f"segment {starts[k]}")
            frame = blank if frames is None else frames[k]
            writer.step(float(time[k]), frame, LoggedCommand(float(steering_deg[k]), float(speed[k])), {}, False)
    finally:
        writer.close()
    with h5py.File(path, "a") as f:
        f.attrs["frames"] = "blank" if frames is None else "camera"
        if true_pose is not None:
            f.create_dataset("true_pose", data=np.asarray(true_pose, np.float64))
            f.attrs["pose_source"] = TRUE_POSE_SOURCE
        if truth is not None:
            f.attrs["truth"] = json.dumps(truth)
    return path


def read_drive_log(path: str | Path) -> dict:
    """`read_real_log` plus, where present, `true_pose`, `truth` (dict), `pose_source`, `frames` ("blank" or
    "camera") and the segments as (first row, name) from the events."""
    out = read_real_log(path)
    with h5py.File(path, "r") as f:
        n = int(f.attrs["n_valid"])
        if "true_pose" in f:
            out["true_pose"] = f["true_pose"][:n]
        out["pose_source"] = str(f.attrs.get("pose_source", ""))
        out["truth"] = json.loads(f.attrs["truth"]) if "truth" in f.attrs else None
        out["frames"] = str(f.attrs.get("frames", "camera"))
    segments = []
    for event in out["events"]:
        stamp, _, message = str(event).partition(" ")
        if message.startswith("segment "):
            row = int(np.searchsorted(out["time"], float(stamp) - 1e-6))
            segments.append((row, message.removeprefix("segment ")))
    out["segments"] = segments
    return out
