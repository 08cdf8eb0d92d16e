"""Run an exported student in the 15 Hz deployment loop: on the car's camera, a recorded log, or the sim.

    python -m experiments.run_car sim --export outputs/export              # closed loop in the training sim
    python -m experiments.run_car camera --export /opt/carfile --device 0  # a real camera (OpenCV)
    python -m experiments.run_car log --export outputs/export --log-in outputs/real_log.h5
    python -m experiments.run_car proxy --protocol calibration --reality.physics bicycle  # the calibration drive

Every step (frame, command, estimates, timing, late frames, stops) goes to an HDF5 real log that `datasets/`
reads back; the run's summary (laps, off-tracks, step counts) is printed and written beside it (`<log>.json`). The
runtime reads only ONNX / OpenVINO IR / JSON and opens no network port.

`--protocol calibration` drives the dynamics calibration's scripted command sequence instead of a student (source
sim: the training sim's dynamics; source proxy: the reality proxy's) on an open floor, into the same log format, with
the true camera poses and parameters flagged in it (`experiments.calibrate dynamics --log` fits it).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import torch

from datasets.real_log import LogReplaySource, RealLogWriter
from envs.config_io import write_text_atomic
from envs.console import make_console
from envs.errors import ConfigError
from envs.racing.config import EnvConfig
from envs.racing.deploy import Command
from envs.racing.env import RacingEnv
from envs.racing.reality import RealityConfig
from experiments.cli import run
from student.deploy import LoopConfig, StudentRuntime, drive


@dataclass(frozen=True)
class RunCarConfig:
    """Deployment run."""

    export: str = "outputs/export"
    """export folder (from experiments.export_student, or an unpacked carfile.tar.gz)"""
    source: Literal["sim", "camera", "log", "proxy"] = "sim"
    """where frames come from (proxy: the reality proxy, with --protocol only)"""
    protocol: Literal["", "calibration"] = ""
    """drive a scripted protocol instead of the student (source sim or proxy): calibration = the dynamics
    calibration drive"""
    reality: RealityConfig = field(default_factory=RealityConfig)
    """source proxy: the reality proxy whose dynamics drive the protocol"""
    seed: int = 0
    """--protocol: seed of the car's parameters"""
    backend: Literal["onnx", "openvino"] = "onnx"
    """inference runtime"""
    threads: int = 1
    """inference threads"""
    device: int = 0
    """camera index (source camera)"""
    log_in: str = ""
    """recorded real log to replay (source log)"""
    log_out: str = "outputs/real_log.h5"
    """where this run's real log goes"""
    calibration: str = ""
    """calibration JSON (command -> measured steering and speed)"""
    max_speed_percent: float = 100.0
    """the car's maximum-speed setting (%), as on the DeepRacer device console: every speed command is scaled by it"""
    loop: LoopConfig = field(default_factory=lambda: LoopConfig(max_steps=450))
    """rate and watchdog"""
    sim: EnvConfig = field(default_factory=lambda: EnvConfig(num_envs=1, camera="projective"))
    """sim settings (source sim); its action space must match the export's"""
    realtime: bool = False
    """sim only: hold the real 15 Hz rate (otherwise as fast as the runtime allows)"""
    torch_checkpoint: str = ""
    """sim only: also drive the same sim (same seed) with this torch student checkpoint and report both"""


class SimCar:
    """The sim as frame source and actuator in lockstep: read() renders, actuate() steps the env."""

    def __init__(self, env: RacingEnv) -> None:
        self.env = env
        self.obs = env.get_observations()
        self.laps, self.offtrack, self.lap_times = 0, 0, []

    def read(self):
        return self.obs["camera"][0, 0].numpy(), time.monotonic()

    def actuate(self, cmd: Command) -> None:
        if cmd.safe_stop:
            return
        if self.env.action_space.kind == "discrete":
            action = torch.tensor([[float(cmd.action)]])
        else:
            lo, hi = self.env.action_space.steering_range
            s_lo, s_hi = self.env.action_space.speed_range
            chosen = cmd.speed * 100.0 / self.env.cfg.max_speed_percent  # the env applies the speed setting itself
            action = torch.tensor(
                [[2 * (cmd.steering_deg - lo) / (hi - lo) - 1, 2 * (chosen - s_lo) / (s_hi - s_lo) - 1]]
            )
        self.obs, _, _, extras = self.env.step(action)
        if bool(extras["new_lap"][0]):
            self.laps += 1
            self.lap_times.append(float(extras["lap_time"][0]))
        self.offtrack += int(extras["offtrack"][0])


class CameraSource:
    def __init__(self, index: int) -> None:
        import cv2

        self.cap = cv2.VideoCapture(index)
        if not self.cap.isOpened():
            raise ConfigError(f"camera {index} could not be opened")

    def read(self):
        ok, frame = self.cap.read()
        return (frame, time.monotonic()) if ok else None


def counts_steps(cfg: RunCarConfig) -> int:
    return cfg.loop.max_steps or 450


def drive_torch(checkpoint: str, env_cfg: EnvConfig, steps: int) -> dict:
    """The torch student on the same sim (fresh env, same seed) for comparison with the exported one."""
    from student.loaded import load_student

    student = load_student(checkpoint)
    car = SimCar(RacingEnv(env_cfg))
    obs = car.obs
    for _ in range(steps):
        obs, _, dones, extras = car.env.step(student.act(obs))
        student.reset(dones)
        if bool(extras["new_lap"][0]):
            car.laps += 1
            car.lap_times.append(float(extras["lap_time"][0]))
        car.offtrack += int(extras["offtrack"][0])
    return {"laps": car.laps, "offtrack": car.offtrack, "lap_times": car.lap_times, "steps": steps}


def drive_protocol_log(cfg: RunCarConfig, console) -> dict:
    """The scripted protocol in the sim's or the proxy's dynamics, written as a real log (no student)."""
    from datasets.drive_log import write_scripted_log
    from envs.racing.calibration_drive import calibration_protocol, drive_protocol
    from envs.racing.reality import reality_env_config

    if cfg.source not in ("sim", "proxy") or not cfg.protocol:
        raise ConfigError(f"source {cfg.source} with --protocol {cfg.protocol!r}: a protocol drives in the sim or "
                          "the proxy, and the proxy drives a protocol only (--protocol calibration)")  # fmt: skip
    env = cfg.sim if cfg.source == "sim" else reality_env_config(cfg.sim, cfg.reality, part="dynamics")
    env = replace(env, randomization=replace(env.randomization, action_noise=False))
    protocol = calibration_protocol(env.control_hz)
    drive = drive_protocol(env, protocol, seed=cfg.seed)
    write_scripted_log(
        cfg.log_out, drive.time, drive.steering_deg, drive.speed, [(r, name) for r, name, _ in protocol.segments],
        true_pose=drive.camera_pose, truth=drive.truth, attrs={"protocol": cfg.protocol, "drive": cfg.source},
    )  # fmt: skip
    summary = {"source": cfg.source, "protocol": cfg.protocol, "seconds": protocol.seconds,
               "segments": [{"row": r, "name": n, "instruction": text} for r, n, text in protocol.segments],
               "truth": drive.truth, "log": str(Path(cfg.log_out).resolve())}  # fmt: skip
    console.print(json.dumps(summary, indent=2))
    write_text_atomic(Path(cfg.log_out).with_suffix(".json"), json.dumps(summary, indent=2))
    return summary


def main(cfg: RunCarConfig) -> dict:
    console = make_console()
    if cfg.protocol or cfg.source == "proxy":
        return drive_protocol_log(cfg, console)
    runtime = StudentRuntime(
        cfg.export, cfg.backend, cfg.threads, calibration=cfg.calibration, max_speed_percent=cfg.max_speed_percent
    )
    log = RealLogWriter(cfg.log_out, attrs={"export": str(Path(cfg.export).resolve()), "source": cfg.source})
    summary: dict = {"source": cfg.source, "backend": cfg.backend, "max_speed_percent": cfg.max_speed_percent}
    try:
        if cfg.source == "sim":
            env_cfg = replace(
                cfg.sim,
                num_envs=1,
                camera=cfg.sim.camera if cfg.sim.camera != "none" else "projective",
                max_speed_percent=cfg.max_speed_percent,
                # the sim car at the runtime's setting: the runtime scales by it and `SimCar` undoes that
                randomization=replace(cfg.sim.randomization, max_speed_percent=False),
            )
            car = SimCar(RacingEnv(env_cfg))
            if car.env.action_space != runtime.commands.action_space:
                raise ConfigError("the sim's action space differs from the export's model_metadata.json")
            sleep = time.sleep if cfg.realtime else (lambda s: None)
            counts = drive(runtime, car, car.actuate, cfg.loop, log, sleep=sleep)
            summary.update({"laps": car.laps, "offtrack": car.offtrack, "lap_times": car.lap_times})
            if cfg.torch_checkpoint:
                summary["torch_student"] = drive_torch(cfg.torch_checkpoint, env_cfg, counts_steps(cfg))
        elif cfg.source == "camera":
            counts = drive(runtime, CameraSource(cfg.device), lambda cmd: None, cfg.loop, log)
        else:
            if not cfg.log_in:
                raise ConfigError("--log-in is required with source log")
            counts = drive(runtime, LogReplaySource(cfg.log_in), lambda cmd: None, cfg.loop, log)
        summary.update(counts)
    finally:
        log.close()
    summary["log"] = str(Path(cfg.log_out).resolve())
    console.print(json.dumps(summary, indent=2))
    write_text_atomic(Path(cfg.log_out).with_suffix(".json"), json.dumps(summary, indent=2))
    return summary


PRESETS = {
    "sim": ("closed loop in the sim", RunCarConfig()),
    "camera": ("a camera device through OpenCV", RunCarConfig(source="camera", loop=LoopConfig())),
    "log": ("replay a recorded log", RunCarConfig(source="log", loop=LoopConfig())),
    "proxy": ("a scripted protocol in the reality proxy's dynamics (--protocol calibration)",
              RunCarConfig(source="proxy", protocol="calibration", log_out="outputs/calibration_drive.h5")),
}  # fmt: skip

if __name__ == "__main__":
    run(main, {"racing": PRESETS}, description=__doc__)
