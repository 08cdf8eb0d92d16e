"""Real-car logs: every deployment step in HDF5 (frames, commands, the student's online estimates, timing).

The same flat, chunked, `n_valid`-flushed layout as rollout shards, so a log survives a power cut and `datasets/`
reads it back for replay and real-to-sim calibration.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

from datasets.rollouts import SCHEMA_VERSION, ShardError
from envs.camera_model import preprocess

LOG_FIELDS = {
    "time": ((), "float64"),
    "camera": ((120, 160), "uint8"),
    "steering_deg": ((), "float32"),
    "speed": ((), "float32"),
    "action": ((), "int32"),
    "late": ((), "bool"),
    "safe_stop": ((), "bool"),
    "inference_ms": ((), "float32"),
    "estimates": ((3,), "float32"),  # friction, motor gain, speed (nan when the model has no history encoder)
    "loop_latency_ms": ((), "float32"),  # most likely action + camera latency (nan when unknown)
}


class RealLogWriter:
    def __init__(self, path: str | Path, attrs: dict | None = None, frame_period_ms: float = 1000 / 60) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = h5py.File(self.path, "w")
        for name, (shape, dtype) in LOG_FIELDS.items():
            chunk = max(1, min(1024, (64 * 1024) // max(1, int(np.prod(shape or (1,))) * np.dtype(dtype).itemsize)))
            self.file.create_dataset(
                name, shape=(0, *shape), maxshape=(None, *shape), dtype=dtype, chunks=(chunk, *shape)
            )
        self.events = self.file.create_dataset("events", shape=(0,), maxshape=(None,), dtype=h5py.string_dtype())
        self.file.attrs.update({"schema_version": SCHEMA_VERSION, "kind": "gapbridge.real_log", "n_valid": 0})
        for k, v in (attrs or {}).items():
            self.file.attrs[k] = v
        self.n = 0
        self.inference_ms = float("nan")
        self.substep_ms = frame_period_ms

    def step(self, now: float, frame: np.ndarray, cmd, outputs: dict, late: bool) -> None:
        gray = preprocess(frame)[0, 0].astype(np.uint8)
        est = outputs.get("estimates")
        est = (
            np.asarray(est, np.float32).reshape(-1)[:3] if est is not None and np.size(est) >= 3 else np.full(3, np.nan)
        )
        lat = float("nan")
        if "action_latency_probs" in outputs and np.size(outputs["action_latency_probs"]) > 1:
            lat = (
                np.argmax(outputs["action_latency_probs"]) + np.argmax(outputs["camera_latency_probs"])
            ) * self.substep_ms
        row = {
            "time": now, "camera": gray, "steering_deg": cmd.steering_deg, "speed": cmd.speed, "action": cmd.action,
            "late": late, "safe_stop": cmd.safe_stop, "inference_ms": self.inference_ms, "estimates": est,
            "loop_latency_ms": lat,
        }  # fmt: skip
        for name, value in row.items():
            ds = self.file[name]
            ds.resize(self.n + 1, axis=0)
            ds[self.n] = value
        self.n += 1
        self.file.attrs["n_valid"] = self.n
        self.file.flush()

    def event(self, now: float, message: str) -> None:
        self.events.resize(self.events.shape[0] + 1, axis=0)
        self.events[-1] = f"{now:.3f} {message}"
        self.file.flush()

    def close(self) -> None:
        if self.file.id.valid:
            self.file.close()


def read_real_log(path: str | Path) -> dict[str, np.ndarray]:
    """All valid rows of a real log (and its events) as arrays."""
    path = Path(path)
    try:
        with h5py.File(path, "r") as f:
            if f.attrs.get("kind") != "gapbridge.real_log":
                raise ShardError(f"{path}: not a real-car log")
            n = int(f.attrs["n_valid"])
            out = {name: f[name][:n] for name in LOG_FIELDS}
            out["events"] = np.array([e.decode() if isinstance(e, bytes) else e for e in f["events"][:]])
            return out
    except OSError as err:
        raise ShardError(f"{path}: unreadable log ({err})") from None


class LogReplaySource:
    """Frames of a recorded log, with fresh timestamps (for offline replays through the runtime)."""

    def __init__(self, path: str | Path, clock=None) -> None:
        import time

        self.frames = read_real_log(path)["camera"]
        self.i = 0
        self.clock = clock or time.monotonic

    def read(self):
        if self.i >= len(self.frames):
            return None
        frame = self.frames[self.i]
        self.i += 1
        return frame, self.clock()
