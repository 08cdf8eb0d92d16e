"""Per-checkpoint scores of checkpoint selection in `scores.json`, so a stopped selection continues where it stopped
and changing one evaluation's settings re-scores only that evaluation (`experiments.select_checkpoint`)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from envs.config_io import to_yaml, write_text_atomic

SCORE_INPUTS = {
    "robust": ("action_noise", "robust"),
    "fixed_lap": ("fixed_lap",),
    "sim2sim": ("action_noise", "robust"),
    "proxy": ("proxy", "reality"),
}
"""the settings each evaluation's episodes depend on (besides the checkpoint, the run's own world and the car's speed
setting, which every evaluation depends on)"""


def _score_key(settings: dict[str, str], name: str) -> str:
    return "".join(f"{part}:\n{settings[part]}" for part in SCORE_INPUTS[name]) + settings.get("car", "")


class ScoreCache:
    """Per-checkpoint scores in `scores.json`, rewritten atomically after every evaluation of every checkpoint.

    An evaluation's score is reused only for the same file (path, size, modification time) evaluated with the same
    settings of that evaluation (`SCORE_INPUTS`): asking for more robust episodes scores the robust evaluation again
    and keeps the proxy's laps, and a selection stopped halfway through a checkpoint keeps the evaluations it finished.
    The evaluations are seeded, so a reused score equals what scoring again would give.

    `settings` holds the value of every part named in `SCORE_INPUTS` (a number or a config dataclass), `evaluations`
    the evaluations this selection runs, `max_speed_percent` the car's speed setting in all of them."""

    def __init__(
        self,
        path: Path,
        settings: Mapping[str, Any],
        evaluations: Iterable[str],
        max_speed_percent: float = 100.0,
        enabled: bool = True,
    ) -> None:
        self.path = path
        texts = {part: to_yaml(value) for part, value in settings.items()}
        if max_speed_percent != 100.0:  # every evaluation drives the car at this setting (100: keys as before)
            texts["car"] = f"max_speed_percent:\n{max_speed_percent}"
        self.keys = {name: _score_key(texts, name) for name in evaluations}
        self.rows: dict[str, dict] = {}
        if enabled and path.is_file():
            try:
                saved = json.loads(path.read_text())
            except (OSError, ValueError):
                saved = {}
            rows = saved.get("rows", {}) if isinstance(saved, dict) else {}
            self.rows = rows if isinstance(rows, dict) else {}

    @staticmethod
    def _stamp(checkpoint: Path) -> str:
        st = checkpoint.stat()
        return f"{checkpoint.resolve()}:{st.st_size}:{st.st_mtime_ns}"

    def get(self, checkpoint: Path) -> dict:
        """The checkpoint's evaluations still valid: `{name: metrics, name_episodes: …, name_seconds: …}` for each."""
        row = self.rows.get(self._stamp(checkpoint), {})
        scored = row.get("scored", {})
        out = {}
        for name, key in self.keys.items():
            if scored.get(name) == key and name in row:
                out.update({k: row[k] for k in (name, f"{name}_episodes", f"{name}_seconds") if k in row})
        return out

    def put(self, checkpoint: Path, name: str, parts: dict) -> None:
        """Store one evaluation of a checkpoint (`parts`: its metrics, per-episode scores and seconds)."""
        row = self.rows.setdefault(self._stamp(checkpoint), {})
        row.update(parts)
        row.setdefault("scored", {})[name] = self.keys[name]
        write_text_atomic(self.path, json.dumps({"version": 2, "rows": self.rows}, default=float))
