"""How the deployed student's outputs become the car's commands: the DeepRacer action space of the export's
`model_metadata.json`, the car's calibration table, and its maximum-speed setting. The deployment runtime
(`student.deploy`) gets this mapping through the task contract (`Task.command_mapper`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from envs.errors import ActionSpaceError, check_range
from envs.racing.car import MAX_SPEED_PERCENT_RANGE, ActionSpace, Calibration


@dataclass
class Command:
    """One command sent to the car: steering angle, speed (m/s, after the speed setting), the chosen action's index
    (-1 for a continuous action or a stop) and whether it is a safe stop."""

    steering_deg: float
    speed: float
    action: int
    safe_stop: bool = False


class DeepRacerCommands:
    """Policy outputs -> calibrated `Command` at the car's speed setting, and the previous-action input the policy
    reads next (the env's `proprio` group: steering / 30 degrees, speed / the action space's top speed)."""

    previous_action_dim = 2

    def __init__(self, folder: str | Path, calibration: str = "", max_speed_percent: float = 100.0) -> None:
        check_range("max_speed_percent", max_speed_percent, *MAX_SPEED_PERCENT_RANGE)
        path = Path(folder) / "model_metadata.json"
        if not path.is_file():
            raise ActionSpaceError(f"{folder}: missing model_metadata.json")
        try:
            metadata = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ActionSpaceError(f"{path}: invalid JSON ({err})") from None
        self.action_space = ActionSpace.from_metadata(metadata, source=str(path))
        self.calibration = Calibration.load(calibration) if calibration else Calibration()
        self.max_speed_percent = max_speed_percent

    @property
    def num_outputs(self) -> int:
        return self.action_space.num_outputs

    def stop(self) -> Command:
        return Command(0.0, 0.0, -1, safe_stop=True)

    def command(self, action_logits: np.ndarray) -> tuple[Command, np.ndarray]:
        """`(1, A)` outputs -> (the command to send, the `(1, 2)` previous-action input)."""
        space = self.action_space
        if space.kind == "discrete":
            action = int(np.argmax(action_logits[0]))
            angle, speed = space.choices[action]
        else:
            a = np.clip(action_logits[0], -1.0, 1.0)
            action = -1
            angle = space.steering_range[0] + (a[0] + 1) / 2 * (space.steering_range[1] - space.steering_range[0])
            speed = space.speed_range[0] + (a[1] + 1) / 2 * (space.speed_range[1] - space.speed_range[0])
        steer, spd = self.calibration.apply(torch.tensor([np.radians(angle)]), torch.tensor([float(speed)]))
        steer_deg = float(np.degrees(steer.item()))
        previous = np.array([[np.radians(steer_deg) / np.radians(30.0), spd.item() / space.max_speed]], np.float32)
        # The car's maximum-speed setting scales what the car is sent; the previous-action input keeps the choice.
        return Command(steer_deg, float(spd.item()) * self.max_speed_percent / 100.0, action), previous


def command_mapper(folder: str | Path, options: dict[str, Any]) -> DeepRacerCommands:
    """The racing task's command mapping for an export folder; options: `calibration` (a calibration table's path)
    and `max_speed_percent` (the car's speed setting)."""
    return DeepRacerCommands(folder, **options)
