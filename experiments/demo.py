"""`make demo`: the main job on built-in defaults. For now: the scripted pure-pursuit driver on every built-in track,
both directions, under full randomization; prints lap times against the optimal lap and where the plots went."""

from __future__ import annotations

from experiments.cli import run
from experiments.drive_scripted import PRESETS
from experiments.drive_scripted import main as drive

DEMO_PRESETS = {"default": (PRESETS["default"][0], PRESETS["default"][1]), "smoke": PRESETS["smoke"]}

if __name__ == "__main__":
    run(drive, DEMO_PRESETS, description=__doc__)
