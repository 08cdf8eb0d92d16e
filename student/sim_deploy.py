"""The deployment loop in the sim, for any task: one env of the task as the loop's frame source and actuator.

`SimRobot` renders the env's camera frame and reads the robot's own readings (the `proprio` columns after the previous
action, which the runtime keeps itself) for `read()`, and steps the env with each command's action for `actuate()`, in
lockstep; it counts episodes and successes as the env reports them. `drive_sim` runs an export folder through
`student.deploy.drive` at the export's control rate on such a robot. Racing's car has its own sim adapter, which maps
DeepRacer commands back onto its action space (`experiments.run_car`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from student.deploy import LoopConfig, StudentRuntime, drive


class SimRobot:
    """One env of a task driven by deployment commands (`command.action`: the env's action row; a `safe_stop` command
    holds the sim still). `read()` -> (camera frame `(H, W)` uint8, time stamp, readings `(1, R)`)."""

    def __init__(self, env: Any, previous_action_dim: int, clock: Callable[[], float] = time.monotonic) -> None:
        if env.num_envs != 1:
            raise ValueError(f"SimRobot drives one env, the env has {env.num_envs}")
        self.env, self.previous_action_dim, self.clock = env, previous_action_dim, clock
        self.obs = env.get_observations()
        self.steps, self.episodes, self.successes, self.stops = 0, 0, 0, 0

    def read(self) -> tuple[np.ndarray, float, np.ndarray]:
        frame = self.obs["camera"][0, 0].cpu().numpy()
        proprio = self.obs["proprio"] if "proprio" in self.obs.keys() else torch.zeros(1, self.previous_action_dim)
        readings = proprio[:1, self.previous_action_dim :].cpu().numpy().astype(np.float32)
        return frame, self.clock(), readings

    def actuate(self, command) -> None:
        if getattr(command, "safe_stop", False):
            self.stops += 1
            return
        action = torch.as_tensor(np.asarray(command.action, np.float32)).reshape(1, -1).to(self.env.device)
        self.obs, _, dones, extras = self.env.step(action)
        self.steps += 1
        if bool(dones[0]):
            self.episodes += 1
            self.successes += int(bool(extras["success"][0])) if "success" in extras else 0


def drive_sim(
    runtime: StudentRuntime,
    env: Any,
    steps: int,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = lambda s: None,
    log=None,
) -> dict[str, float]:
    """`steps` control steps of the exported student on one env of its task at the export's control rate (`sleep` a
    no-op: as fast as the sim allows; `time.sleep`: in real time); the loop's counts with the robot's steps, finished
    episodes, successes and safe stops."""
    robot = SimRobot(env, runtime.commands.previous_action_dim, clock)
    cfg = LoopConfig(rate_hz=runtime.control_hz, max_steps=steps)
    counts = drive(runtime, robot, robot.actuate, cfg, log, clock, sleep)
    return {
        **counts,
        "rate_hz": runtime.control_hz,
        "sim_steps": robot.steps,
        "episodes": robot.episodes,
        "successes": robot.successes,
        "safe_stops": robot.stops,
    }
