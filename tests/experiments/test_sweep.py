"""`experiments.ablate` over seeds and launchers: a local-launcher sweep (submitit jobs) gives the inline sweep's table,
a finished sweep submits nothing, a failed job is named while the other rows are written, Slurm is refused where there
is no `sbatch`, and each seed reaches its stage's seed flags (the launcher itself and the interval arithmetic:
tests/datasets/test_jobs.py)."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from envs.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
TEACHER_ARGS = "smoke --trainer.iterations 1 --env.num-envs 8 --final-eval.max-seconds 2"
"""the cheapest teacher run of the smoke preset: one PPO iteration, a 2-second final evaluation"""
WALL_TIME = ("minutes", "dagger_minutes")
"""columns that measure wall time, the only ones that differ between two runs of one seed"""


def ablate(out_dir: Path, *args: str, path: str | None = None) -> subprocess.CompletedProcess:
    """`python -m experiments.ablate teacher` on the cheap base run, two variants, in its own process."""
    # One torch thread per run: on a busy 2-core machine, idle OpenMP threads spinning triple a run's time.
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    if path is not None:
        env["PATH"] = path
    argv = ["teacher", "--teacher-args", TEACHER_ARGS, "--variants", "base", "no-noise", "--out-dir", str(out_dir)]
    return subprocess.run(
        [sys.executable, "-m", "experiments.ablate", *argv, "--wandb.mode", "disabled", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def without_wall_time(table: str) -> list[list[str]]:
    """The Markdown table's rows without its wall-time column."""
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines() if line.startswith("| ")]
    keep = [i for i, name in enumerate(rows[0]) if name not in WALL_TIME]
    return [[row[i] for i in keep] for row in rows]


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory) -> dict[str, Path]:
    """The same 2 variants x 2 seeds teacher sweep, run inline and as local submitit jobs (one at a time); the
    `<launcher>.md` / `<launcher>.json` keys hold each sweep's results as it wrote them."""
    out = {}
    for launcher in ("inline", "local"):
        out[launcher] = out_dir = tmp_path_factory.mktemp(launcher)
        proc = ablate(out_dir, "--seeds", "0", "1", "--launcher", launcher)
        assert proc.returncode == 0, proc.stderr[-3000:]
        for kind in ("md", "json"):
            out[f"{launcher}.{kind}"] = (out_dir / f"ablation.{kind}").read_text()
    return out


def test_local_sweep_gives_the_inline_table(sweeps):
    inline, local = json.loads(sweeps["inline.json"]), json.loads(sweeps["local.json"])
    assert list(local) == ["base", "no-noise"] and all(v["seeds"] == [0, 1] for v in local.values())
    for variant in local:
        for seed in ("0", "1"):
            ours, theirs = (
                {k: v for k, v in d[variant]["per_seed"][seed].items() if k not in WALL_TIME} for d in (local, inline)
            )
            assert json.dumps(ours) == json.dumps(theirs), (variant, seed)  # (NaN lap-time ratios when nobody laps)
    tables = [without_wall_time(sweeps[f"{k}.md"]) for k in ("inline", "local")]
    assert tables[0] == tables[1] and tables[0][0][:2] == ["variant", "seeds"] and "±" in tables[0][1][2]
    # Each seed reached its stage's seed flags: the two seeds' runs differ, each run's config holds its seed.
    base = [json.loads((sweeps["local"] / "base" / f"seed_{s}" / "eval.json").read_text()) for s in (0, 1)]
    assert base[0]["eval/reinvent2018"]["progress"] != base[1]["eval/reinvent2018"]["progress"]
    config = (sweeps["local"] / "no-noise" / "seed_1" / "config.yaml").read_text()
    assert config.count("seed: 1") >= 2, "--trainer.seed and --env.seed"
    # One job per run, one at a time (`--max-parallel` 1): each run started after the one before it finished.
    runs = [sweeps["local"] / v / f"seed_{s}" for v in local for s in (0, 1)]
    jobs = {path.name.split("_")[0] for path in (sweeps["local"] / "jobs").glob("*_log.err")}
    assert len(jobs) >= 4 and all((run / "ablation_command.json").is_file() for run in runs)
    spans = sorted(
        (run.joinpath("config.yaml").stat().st_mtime, run.joinpath("eval.json").stat().st_mtime) for run in runs
    )
    assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans)), spans


def test_a_finished_sweep_submits_nothing(sweeps, monkeypatch):
    import submitit

    from datasets.run_logger import WandbConfig
    from experiments import ablate

    def no_jobs(*args, **kwargs):
        raise AssertionError("a finished sweep built an executor")

    monkeypatch.setattr(submitit, "AutoExecutor", no_jobs)
    monkeypatch.setattr(ablate, "run_stage", no_jobs)
    cfg = ablate.AblateConfig(
        stage="teacher", variants=("base", "no-noise"), teacher_args=TEACHER_ARGS, out_dir=str(sweeps["local"]),
        wandb=WandbConfig(mode="disabled"), seeds=(0, 1), launcher="local",
    )  # fmt: skip
    jobs = sweeps["local"] / "jobs"
    before = sorted(p.name for p in jobs.iterdir())
    again = ablate.main(cfg)
    assert sorted(p.name for p in jobs.iterdir()) == before
    assert json.dumps(again) == json.dumps(json.loads(sweeps["local.json"]))
    assert (sweeps["local"] / "ablation.md").read_text() == sweeps["local.md"]


def test_a_failed_job_is_named_and_the_other_rows_are_written(sweeps):
    # Seed 3 of `base` resumes from a broken checkpoint and fails; seeds 0 and 1 are the finished runs of the sweep.
    out = sweeps["local"]
    broken = out / "base" / "seed_3" / "checkpoints" / "iter_000001.pt"
    broken.parent.mkdir(parents=True)
    broken.write_bytes(b"not a checkpoint")
    proc = ablate(out, "--variants", "base", "--seeds", "0", "1", "3", "--launcher", "local")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, "the stage's own exit code (it refused its input)"
    (line,) = proc.stderr.strip().splitlines()
    assert "ablation: 1 runs failed" in line and "'base' seed 3 exit code 2 (log " in line, line
    log = Path(line.split("(log ")[1].split(")")[0])
    assert log.parent == out / "jobs" and "not a readable checkpoint" in log.read_text()
    assert json.loads((out / "ablation.json").read_text())["base"]["seeds"] == [0, 1]
    assert "failed: 'base' seed 3 exit code 2" in (out / "ablation.md").read_text()


def test_slurm_without_sbatch_is_refused_before_anything_is_submitted(tmp_path):
    path = os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"])
    assert shutil.which("sbatch", path=path) is None
    proc = ablate(tmp_path / "out", "--seeds", "0", "1", "--launcher", "slurm", path=path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "--launcher slurm: no `sbatch` on PATH" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_seed_flags_reach_each_stage_and_bad_seeds_are_refused(tmp_path):
    from experiments import distill_student, train_teacher
    from experiments.ablate import AblateConfig, variant_command
    from experiments.cli import parse

    teacher = AblateConfig(stage="teacher", teacher_args=TEACHER_ARGS, out_dir=str(tmp_path), seeds=(0, 7))
    args = variant_command(teacher, "no-noise", 7)
    cfg = parse(train_teacher.PRESETS, "", args)
    assert (cfg.trainer.seed, cfg.env.seed, cfg.run_dir) == (7, 7, str(tmp_path / "no-noise" / "seed_7"))
    student = AblateConfig(stage="student", teacher="t.pt", student_args="smoke", out_dir=str(tmp_path), seeds=(5,))
    assert parse(distill_student.PRESETS, "", variant_command(student, "base", 5)).dagger.seed == 5
    # Without --seeds: no seed flags, the run directory of a single-seed ablation.
    plain = variant_command(AblateConfig(stage="teacher", out_dir=str(tmp_path)), "base")
    assert "--trainer.seed" not in plain and plain[plain.index("--run-dir") + 1] == str(tmp_path / "base")
    with pytest.raises(ConfigError, match=r"--seeds 0 1 0: seed 0 is given twice"):
        AblateConfig(seeds=(0, 1, 0))
    with pytest.raises(ConfigError, match=r"--seeds 2 -1: seed -1 is negative"):
        AblateConfig(seeds=(2, -1))
