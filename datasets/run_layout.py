"""Where a run directory keeps its files, for the scripts that read another run's output.

<run>/config.yaml                  the resolved config
<run>/checkpoints/iter_*.pt        a teacher run's checkpoints (every one kept)
<run>/teacher.pt                   a finished teacher run's selected checkpoint (the teacher its students distill)
<run>/checkpoints/round_*.pt       a student run's checkpoints, one per DAgger round
<run>/checkpoints/*_estimator.pt   a student with a refitted factor estimator (beside its checkpoint)
<run>/data/manifest.json           the recorded episodes' shards
<run>/eval.json                    the final evaluation, written when the run finishes
"""

from __future__ import annotations

from pathlib import Path

from datasets.rollouts import MANIFEST
from envs.errors import ConfigError

TEACHER_CHECKPOINTS = "iter_*.pt"
TEACHER_FILE = "teacher.pt"
STUDENT_CHECKPOINTS = "round_*.pt"

ESTIMATOR_SUFFIX = "_estimator"
"""a refitted estimator's default file sits next to its checkpoint, named with this suffix (checkpoint selection
skips such files: the policy is the checkpoint's own)"""


def estimator_path(checkpoint: Path) -> Path:
    return checkpoint.with_name(f"{checkpoint.stem}{ESTIMATOR_SUFFIX}{checkpoint.suffix}")


def latest_checkpoint(run_dir: str | Path, pattern: str) -> Path | None:
    """The newest `checkpoints/<pattern>` of a run directory (None when it has none)."""
    found = sorted((Path(run_dir) / "checkpoints").glob(pattern))
    return found[-1] if found else None


def run_teacher(run_dir: str | Path) -> Path | None:
    """A teacher run's teacher: its selected checkpoint (`teacher.pt`, written when the run finishes), else its newest
    checkpoint (a run still in progress); None when it has neither."""
    selected = Path(run_dir) / TEACHER_FILE
    return selected if selected.is_file() else latest_checkpoint(run_dir, TEACHER_CHECKPOINTS)


def recorded_data(checkpoint: str, data_dir: str = "") -> Path:
    """The run's shard folder: `data_dir`, or `data` beside the checkpoint's `checkpoints` folder; refused by name
    when it holds no manifest (and without a checkpoint: every script reading a run's episodes needs the student)."""
    if not checkpoint:
        raise ConfigError("--checkpoint is required (a student checkpoint from experiments.distill_student)")
    path = Path(data_dir) if data_dir else Path(checkpoint).resolve().parent.parent / "data"
    if not (path / MANIFEST).is_file():
        raise ConfigError(f"--data-dir {path}: no {MANIFEST} (the run's recorded episodes)")
    return path
