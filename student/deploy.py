"""Deployment runtime: the exported student driving at 15 Hz with a watchdog, logging every step.

The runtime reads only ONNX / OpenVINO IR / JSON from an export folder (nothing pickled) and opens no network port. It
owns the recurrent state, preprocesses frames exactly like the car (OpenCV resize to 160x120, BGR -> gray), runs ONNX
Runtime or OpenVINO (with the planar odometry beside it for a student whose factor estimator reads it), maps the chosen
action through the calibration table, and holds the control rate: a frame that arrives late repeats the last safe
command, a camera that stops delivering stops the car, and so does a loop that itself stalls (a control period past
`stale_after`); shorter overruns of the control period are counted and logged.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from envs.camera_model import preprocess
from envs.errors import GapbridgeError, check_range
from envs.racing.car import MAX_SPEED_PERCENT_RANGE, ActionSpace, Calibration

REQUIRED_FILES = ("student.onnx", "model_metadata.json", "export.json")


class ExportError(GapbridgeError, ValueError):
    """An export folder is corrupt or does not match what the runtime expects."""


class FrameSource(Protocol):
    """Delivers camera frames: `read()` -> (BGR or gray uint8 image, capture timestamp in seconds) or None."""

    def read(self) -> tuple[np.ndarray, float] | None: ...


class OnnxBackend:
    def __init__(self, path: Path, threads: int = 1) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        self.inputs = {i.name: i.shape for i in self.session.get_inputs()}
        self.outputs = [o.name for o in self.session.get_outputs()]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(self.outputs, self.session.run(self.outputs, feeds)))


def _graph_name(names: set[str]) -> str:
    """The name an input was exported under: one not made up by the converter (those start with `/`)."""
    plain = sorted(n for n in names if not n.startswith("/"))
    return plain[0] if plain else sorted(names)[0]


class OpenVinoBackend:
    def __init__(self, xml: Path, threads: int = 1) -> None:
        import openvino as ov

        core = ov.Core()
        # f32: on CPUs with bf16 support OpenVINO would otherwise run in bf16 and drift ~1e-3 from the trained model.
        config = {"INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": "f32"}
        self.model = core.compile_model(str(xml), "CPU", config)
        self.request = self.model.create_infer_request()
        # An input tensor can carry several names (the ONNX input's and an internal node's); keep the ONNX one.
        self.inputs = {_graph_name(i.get_names()): list(i.get_partial_shape().to_shape()) for i in self.model.inputs}
        self.outputs = [o.get_any_name() for o in self.model.outputs]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        result = self.request.infer(feeds)
        return {o.get_any_name(): result[o] for o in self.model.outputs}


@dataclass
class Command:
    steering_deg: float
    speed: float
    action: int
    safe_stop: bool = False


class StudentRuntime:
    """Loads an export folder, validates it, and maps frames to calibrated commands with explicit state."""

    def __init__(
        self,
        folder: str | Path,
        backend: str = "onnx",
        threads: int = 1,
        calibration: str = "",
        max_speed_percent: float = 100.0,
    ) -> None:
        check_range("max_speed_percent", max_speed_percent, *MAX_SPEED_PERCENT_RANGE)
        self.max_speed_percent = max_speed_percent
        self.folder = Path(folder)
        for name in REQUIRED_FILES:
            if not (self.folder / name).is_file():
                raise ExportError(f"{self.folder}: missing {name}")
        try:
            self.info = json.loads((self.folder / "export.json").read_text())
            metadata = json.loads((self.folder / "model_metadata.json").read_text())
        except json.JSONDecodeError as err:
            raise ExportError(f"{self.folder}: invalid JSON ({err})") from None
        self.action_space = ActionSpace.from_metadata(metadata, source=str(self.folder / "model_metadata.json"))
        self.calibration = Calibration.load(calibration) if calibration else Calibration()
        if backend == "onnx":
            self.backend = OnnxBackend(self.folder / "student.onnx", threads)
        elif backend == "openvino":
            xml = self.folder / "student.xml"
            if not xml.is_file():
                raise ExportError(f"{self.folder}: no OpenVINO IR (student.xml); export with openvino installed")
            self.backend = OpenVinoBackend(xml, threads)
        else:
            raise ExportError(f"backend {backend!r}; use onnx or openvino")
        self.tracker = self._odometry() if "motion" in self.backend.inputs else None
        self.reset()
        self._check_shapes()

    def _odometry(self):
        """The tracker feeding a graph's `motion` input: planar odometry through the camera `export.json` names."""
        import torch

        from adaptation.odometry import OdometryTracker, PlanarOdometry
        from envs.camera_model import CameraConfig

        try:
            odo = self.info["odometry"]
            optics, dt = CameraConfig(**odo["optics"]), float(odo["dt"])
        except (KeyError, TypeError, ValueError) as err:
            raise ExportError(
                f"{self.folder}: the model reads odometry but export.json has no valid odometry entry ({err})"
            ) from None
        self._torch = torch
        return OdometryTracker(PlanarOdometry(optics), dt, 1)

    def _check_shapes(self) -> None:
        inputs = self.backend.inputs
        expected = {"camera": [1, 1, 120, 160], "prev_action": [1, 2], "history_in": self.info["history_shape"]}
        if self.tracker is not None:
            expected["motion"] = [1, 3]
        for name, shape in expected.items():
            if name not in inputs:
                raise ExportError(f"{self.folder}: model has no input {name!r} (inputs: {sorted(inputs)})")
            if list(inputs[name]) != list(shape):
                raise ExportError(f"{self.folder}: input {name!r} has shape {list(inputs[name])}, expected {shape}")
        probe = self.backend.run(self._feeds(np.zeros((1, 1, 120, 160), np.float32)))
        n_out = probe["action_logits"].shape[-1]
        n_act = self.action_space.num_choices if self.action_space.kind == "discrete" else 2
        if n_out != n_act:
            raise ExportError(f"{self.folder}: model outputs {n_out} actions but the action table has {n_act}")

    def _feeds(self, camera: np.ndarray, motion: np.ndarray | None = None) -> dict[str, np.ndarray]:
        feeds = {"camera": camera, "prev_action": self.prev_action, "history_in": self.history}
        if self.tracker is not None:
            feeds["motion"] = np.zeros((1, 3), np.float32) if motion is None else motion
        return feeds

    def _motion(self, camera: np.ndarray) -> np.ndarray:
        """Normalized body velocities between the last frame and this one (zeros at an episode's first frame)."""
        return self.tracker.estimator_inputs(self._torch.from_numpy(camera)).numpy().astype(np.float32)

    def reset(self) -> None:
        try:
            self.history = np.zeros(self.info["history_shape"], dtype=np.float32)
        except (KeyError, TypeError, ValueError):
            raise ExportError(f"{self.folder}: export.json has no valid history_shape") from None
        self.prev_action = np.zeros((1, 2), dtype=np.float32)
        self.last_outputs: dict[str, np.ndarray] = {}
        if self.tracker is not None:
            self.tracker.reset(self._torch.ones(1, dtype=self._torch.bool))

    def infer(self, camera: np.ndarray) -> dict[str, np.ndarray]:
        """One control step on a preprocessed `(1, 1, 120, 160)` frame; advances the recurrent state."""
        motion = self._motion(camera) if self.tracker is not None else None
        self.last_motion = motion
        out = self.backend.run(self._feeds(camera, motion))
        self.history = out["history_out"].astype(np.float32)
        self.last_outputs = out
        return out

    def command(self, outputs: dict[str, np.ndarray]) -> Command:
        """Outputs -> calibrated command at the car's speed setting; updates the previous-action input like the env's
        `proprio` group."""
        import torch

        space = self.action_space
        if space.kind == "discrete":
            action = int(np.argmax(outputs["action_logits"][0]))
            angle, speed = space.choices[action]
        else:
            a = np.clip(outputs["action_logits"][0], -1.0, 1.0)
            action = -1
            angle = space.steering_range[0] + (a[0] + 1) / 2 * (space.steering_range[1] - space.steering_range[0])
            speed = space.speed_range[0] + (a[1] + 1) / 2 * (space.speed_range[1] - space.speed_range[0])
        steer, spd = self.calibration.apply(torch.tensor([np.radians(angle)]), torch.tensor([float(speed)]))
        steer_deg = float(np.degrees(steer.item()))
        self.prev_action = np.array(
            [[np.radians(steer_deg) / np.radians(30.0), spd.item() / space.max_speed]], np.float32
        )
        # The car's maximum-speed setting scales what the car is sent; the previous-action input keeps the choice.
        return Command(steer_deg, float(spd.item()) * self.max_speed_percent / 100.0, action)


@dataclass(frozen=True)
class LoopConfig:
    rate_hz: float = 15.0
    """control rate"""
    late_after: float = 1.5
    """a frame older than this many periods is late: repeat the last safe command"""
    stale_after: float = 0.5
    """seconds without a frame, or between two commands, after which the car stops"""
    overrun_tolerance: float = 0.25
    """a loop period longer than (1 + this) control periods is an overrun: counted and logged"""
    max_steps: int = 0
    """stop after this many steps (0 = until the source ends)"""

    def __post_init__(self) -> None:
        check_range("loop.overrun_tolerance", self.overrun_tolerance, 0.0, 10.0)


class PeriodWatch:
    """The watchdog on the loop itself: the time between two commands sent to the car. A period past `stale_after`
    is a stall (the car drove that long on one command) and stops the car; a shorter one past the tolerance is an
    overrun, counted and logged. Stalls count as overruns too."""

    def __init__(self, cfg: LoopConfig, start: float, counts: dict, log=None) -> None:
        self.period, self.cfg, self.last_sent, self.counts, self.log = 1.0 / cfg.rate_hz, cfg, start, counts, log
        counts.update({"overruns": 0, "stalls": 0, "max_period_ms": 0.0})

    def stalled(self, now: float) -> bool:
        """Account for a command about to be sent at `now`; True when the loop stalled and the car must stop."""
        gap, self.last_sent = now - self.last_sent, now
        self.counts["max_period_ms"] = max(self.counts["max_period_ms"], round(1000.0 * gap, 1))
        if gap <= (1.0 + self.cfg.overrun_tolerance) * self.period:
            return False
        self.counts["overruns"] += 1
        stall = gap > self.cfg.stale_after
        self.counts["stalls"] += int(stall)
        if self.log is not None:
            what = "loop stalled: car stopped" if stall else "loop overrun"
            ms, period_ms = 1000.0 * gap, 1000.0 * self.period
            self.log.event(now, f"{what}: {ms:.0f} ms since the last command (control period {period_ms:.0f} ms)")
        return stall


def drive(
    runtime: StudentRuntime,
    source: FrameSource,
    actuate: Callable[[Command], None],
    cfg: LoopConfig,
    log=None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, float]:
    """The 15 Hz loop with its watchdogs (camera and loop period); returns counts of steps, late frames (repeats),
    safe stops, loop overruns and stalls, and the longest period between two commands."""
    period = 1.0 / cfg.rate_hz
    last_frame_time = clock()
    last_cmd = Command(0.0, 0.0, -1, safe_stop=True)
    counts = {"steps": 0, "late": 0, "stopped": 0}
    watch = PeriodWatch(cfg, last_frame_time, counts, log)
    next_tick = clock()
    while cfg.max_steps == 0 or counts["steps"] < cfg.max_steps:
        item = source.read()
        now = clock()
        if item is None:
            if now - last_frame_time > cfg.stale_after:
                actuate(Command(0.0, 0.0, -1, safe_stop=True))
                counts["stopped"] += 1
                if log is not None:
                    log.event(now, "camera stale: car stopped")
                break
            sleep(min(period, cfg.stale_after / 4))
            continue
        frame, stamp = item
        last_frame_time = now
        if now - stamp > cfg.late_after * period:
            cmd = Command(last_cmd.steering_deg, last_cmd.speed, last_cmd.action, safe_stop=last_cmd.safe_stop)
            counts["late"] += 1
            outputs = {}
        else:
            t0 = clock()
            outputs = runtime.infer(preprocess(frame))
            cmd = runtime.command(outputs)
            if log is not None:
                log.inference_ms = 1000.0 * (clock() - t0)
        if watch.stalled(clock()):
            actuate(Command(0.0, 0.0, -1, safe_stop=True))
            counts["stopped"] += 1
            break
        actuate(cmd)
        last_cmd = cmd
        if log is not None:
            log.step(now, frame, cmd, outputs, late=bool(not outputs))
        counts["steps"] += 1
        next_tick += period
        delay = next_tick - clock()
        if delay > 0:
            sleep(delay)
        else:
            next_tick = clock()
    return counts
