"""Deployment runtime: the exported student driving at the task's control rate with a watchdog, logging every step.

The runtime reads only ONNX / OpenVINO IR / JSON from an export folder (nothing pickled) and opens no network port. It
owns the recurrent state, preprocesses frames exactly like the robot (OpenCV resize to the export's image size,
BGR -> gray), runs ONNX Runtime or OpenVINO (with the planar odometry beside it for a student whose factor estimator
reads it), maps the outputs through the task's command mapping (racing: the DeepRacer action space and calibration
table; a task with a box action that registers none: `BoxCommands`, the clamped means themselves), and holds the
control rate: a frame that arrives late repeats the last command, a camera that stops delivering stops the robot, and
so does a loop that itself stalls (a control period past `stale_after`); shorter overruns of the control period are
counted and logged. A student that reads more of its `proprio` group than the previous action (an arm's joint
positions, gripper widths, wrench estimate) gets those readings from the frame source beside each frame; the
previous action it keeps itself, as the command it sent.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from envs.camera_model import preprocess
from envs.errors import GapbridgeError, check_range
from envs.task import get_task

REQUIRED_FILES = ("student.onnx", "export.json")
"""files every export holds; the task's command mapping reads its own (racing: model_metadata.json)"""


class ExportError(GapbridgeError, ValueError):
    """An export folder is corrupt or does not match what the runtime expects."""


class FrameSource(Protocol):
    """Delivers camera frames: `read()` -> (BGR or gray uint8 image, capture timestamp in seconds) or None; a robot
    whose student reads more than its previous action adds its readings `(1, R)` as a third item."""

    def read(self) -> tuple[np.ndarray, float] | tuple[np.ndarray, float, np.ndarray] | None: ...


@dataclass
class BoxCommand:
    """A box action sent as it is: `action` `(1, A)` inside the box; `safe_stop` marks the stop command."""

    action: np.ndarray
    safe_stop: bool = False


class BoxCommands:
    """The command mapping of a task with a box action (`export.json`'s `action_space`) that registers none: the
    command is the policy's means clamped to the box, and the previous action the student reads next is that command
    (as the env's `proprio` group holds it); the stop command is the box's centre (for the arms: no motion of either
    hand, the middle of the finger-force range)."""

    def __init__(self, space: dict) -> None:
        if space.get("kind") != "continuous":
            kind = space.get("kind")
            raise ExportError(f"no command mapping for a {kind!r} action space; the task must register one")
        self.dim, self.low, self.high = int(space["dim"]), float(space["low"]), float(space["high"])

    @property
    def num_outputs(self) -> int:
        return self.dim

    @property
    def previous_action_dim(self) -> int:
        return self.dim

    def command(self, action_logits: np.ndarray) -> tuple[BoxCommand, np.ndarray]:
        action = np.clip(np.asarray(action_logits, np.float32).reshape(1, self.dim), self.low, self.high)
        return BoxCommand(action), action.copy()

    def stop(self) -> BoxCommand:
        centre = np.full((1, self.dim), 0.5 * (self.low + self.high), np.float32)
        return BoxCommand(centre, safe_stop=True)


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


class StudentRuntime:
    """Loads an export folder, validates it, and maps frames to the task's commands with explicit state. The export
    names its task (`export.json`); the task's command mapping turns outputs into commands (`command_options` go to
    it: racing takes `calibration` and `max_speed_percent`)."""

    def __init__(self, folder: str | Path, backend: str = "onnx", threads: int = 1, **command_options) -> None:
        self.folder = Path(folder)
        for name in REQUIRED_FILES:
            if not (self.folder / name).is_file():
                raise ExportError(f"{self.folder}: missing {name}")
        try:
            self.info = json.loads((self.folder / "export.json").read_text())
        except json.JSONDecodeError as err:
            raise ExportError(f"{self.folder}: invalid JSON ({err})") from None
        task = get_task(str(self.info.get("task", "racing")))  # exports made before tasks are racing's
        if task.command_mapper is not None:
            self.commands = task.command_mapper(self.folder, command_options)
        elif "action_space" in self.info:
            self.commands = BoxCommands(self.info["action_space"])
        else:
            raise ExportError(f"{self.folder}: task {task.name!r} has no deployment command mapping")
        self.control_hz = float(self.info.get("control_hz", 15.0))
        self.image_hw = tuple(int(v) for v in self.info.get("image_hw", (120, 160)))
        self.proprio_dim = int(self.info.get("proprio_dim", self.commands.previous_action_dim))
        self.readings_dim = self.proprio_dim - self.commands.previous_action_dim
        """columns of the robot's own readings the student reads after the previous action"""
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
        if self.readings_dim < 0:
            raise ExportError(
                f"{self.folder}: the student reads {self.proprio_dim} proprio columns, fewer than the "
                f"{self.commands.previous_action_dim} of the previous action"
            )
        self.proprio_name = "proprio" if self.readings_dim else "prev_action"
        camera = [1, 1, *self.image_hw]
        history = self.info["history_shape"]
        expected = {"camera": camera, self.proprio_name: [1, self.proprio_dim], "history_in": history}
        if self.tracker is not None:
            expected["motion"] = [1, 3]
        for name, shape in expected.items():
            if name not in inputs:
                raise ExportError(f"{self.folder}: model has no input {name!r} (inputs: {sorted(inputs)})")
            if list(inputs[name]) != list(shape):
                raise ExportError(f"{self.folder}: input {name!r} has shape {list(inputs[name])}, expected {shape}")
        probe = self.backend.run(self._feeds(np.zeros(camera, np.float32)))
        n_out = probe["action_logits"].shape[-1]
        n_act = self.commands.num_outputs
        if n_out != n_act:
            raise ExportError(f"{self.folder}: model outputs {n_out} actions but the action space has {n_act}")

    def _feeds(
        self, camera: np.ndarray, motion: np.ndarray | None = None, readings: np.ndarray | None = None
    ) -> dict[str, np.ndarray]:
        proprio = self.prev_action
        if self.readings_dim:
            got = np.zeros((1, self.readings_dim), np.float32) if readings is None else readings
            proprio = np.concatenate([self.prev_action, got[:, : self.readings_dim].astype(np.float32)], axis=1)
        feeds = {"camera": camera, self.proprio_name: proprio, "history_in": self.history}
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
        self.prev_action = np.zeros((1, self.commands.previous_action_dim), dtype=np.float32)
        self.last_outputs: dict[str, np.ndarray] = {}
        if self.tracker is not None:
            self.tracker.reset(self._torch.ones(1, dtype=self._torch.bool))

    def preprocess(self, frame: np.ndarray) -> np.ndarray:
        """Any camera image -> `(1, 1, H, W)` float32 raw 0-255 grayscale at the export's image size."""
        if tuple(self.image_hw) == (120, 160):
            return preprocess(frame)
        import cv2

        if frame.ndim == 3 and frame.shape[2] == 3:
            frame = cv2.cvtColor(frame, cv2.COLOR_BGR2GRAY)
        elif frame.ndim == 3:
            frame = frame[..., 0]
        h, w = self.image_hw
        if frame.shape != (h, w):
            frame = cv2.resize(frame, (w, h), interpolation=cv2.INTER_AREA)
        return frame.astype(np.float32)[None, None]

    def infer(self, camera: np.ndarray, readings: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """One control step on a preprocessed `(1, 1, H, W)` frame (and, for a student that reads them, the robot's
        readings `(1, R)` after the previous action); advances the recurrent state."""
        if self.readings_dim and readings is None:
            raise ExportError(
                f"{self.folder}: the student reads {self.readings_dim} proprio readings besides the previous action; "
                "the frame source gave none"
            )
        motion = self._motion(camera) if self.tracker is not None else None
        self.last_motion = motion
        out = self.backend.run(self._feeds(camera, motion, readings))
        self.history = out["history_out"].astype(np.float32)
        self.last_outputs = out
        return out

    def command(self, outputs: dict[str, np.ndarray]):
        """Outputs -> the task's command; updates the previous-action input like the env's `proprio` group."""
        command, self.prev_action = self.commands.command(outputs["action_logits"])
        return command

    def stop(self):
        """The task's safe stop (racing: zero steering and speed)."""
        return self.commands.stop()


@dataclass(frozen=True)
class LoopConfig:
    rate_hz: float = 15.0
    """control rate (racing's camera; a runtime's `control_hz` is its export's)"""
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
    actuate: Callable[[Any], None],
    cfg: LoopConfig,
    log=None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, float]:
    """The control loop at `cfg.rate_hz` with its watchdogs (camera and loop period); returns counts of steps, late
    frames (repeats), safe stops, loop overruns and stalls, and the longest period between two commands."""
    period = 1.0 / cfg.rate_hz
    last_frame_time = clock()
    last_cmd = runtime.stop()
    counts = {"steps": 0, "late": 0, "stopped": 0}
    watch = PeriodWatch(cfg, last_frame_time, counts, log)
    next_tick = clock()
    while cfg.max_steps == 0 or counts["steps"] < cfg.max_steps:
        item = source.read()
        now = clock()
        if item is None:
            if now - last_frame_time > cfg.stale_after:
                actuate(runtime.stop())
                counts["stopped"] += 1
                if log is not None:
                    log.event(now, "camera stale: car stopped")
                break
            sleep(min(period, cfg.stale_after / 4))
            continue
        frame, stamp, *readings = item
        last_frame_time = now
        if now - stamp > cfg.late_after * period:
            cmd = replace(last_cmd)  # a late frame repeats the last command sent
            counts["late"] += 1
            outputs = {}
        else:
            t0 = clock()
            image = runtime.preprocess(frame) if hasattr(runtime, "preprocess") else preprocess(frame)
            outputs = runtime.infer(image, readings[0]) if readings else runtime.infer(image)
            cmd = runtime.command(outputs)
            if log is not None:
                log.inference_ms = 1000.0 * (clock() - t0)
        if watch.stalled(clock()):
            actuate(runtime.stop())
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
