"""Command lines run as submitit jobs, on this machine or a Slurm cluster, and the mean ± 95% t-interval over seeds.

    executor = make_executor("local", Path("runs/sweep/jobs"), "sweep", job_minutes=60)
    outcomes = run_jobs(executor, [("seed 0", [sys.executable, "-m", "experiments.train_teacher", "smoke"])])
    failed = [o.describe("seed 0") for o in outcomes.values() if not o.ok]

Each job runs one command line in its own process, in this working directory, and returns its exit code; its output
goes to the job's log files under the executor's folder. `seed_summary` condenses a run's rows over seeds into each
metric's mean and the half-width of its 95% t-interval.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import submitit
from scipy import stats

from envs.console import make_console
from envs.errors import ConfigError, check_range


@dataclass(frozen=True)
class SlurmConfig:
    """Resources of each job with `--launcher slurm` (submitit's Slurm executor, the runs as one job array)."""

    partition: str = ""
    """partition (empty: the cluster's default)"""
    gpus_per_job: int = 1
    """GPUs of each job (sbatch --gpus-per-node)"""
    cpus_per_task: int = 8
    """CPU cores of each job"""
    mem_gb: float = 0.0
    """memory of each job in GB (0: the partition's default)"""
    additional: tuple[str, ...] = ()
    """more sbatch options as KEY=VALUE, e.g. `account=robotics constraint=h100` (submitit's
    slurm_additional_parameters)"""

    def __post_init__(self) -> None:
        check_range("slurm.gpus_per_job", self.gpus_per_job, 0, 64)
        check_range("slurm.cpus_per_task", self.cpus_per_task, 1, 1024)
        check_range("slurm.mem_gb", self.mem_gb, 0.0, 16384.0)
        for item in self.additional:
            key, equals, _ = item.partition("=")
            if not key or not equals:
                raise ConfigError(f"--slurm.additional {item!r}: give sbatch options as KEY=VALUE")


def check_sbatch() -> None:
    """Refuse `--launcher slurm` on a machine that cannot submit Slurm jobs (no `sbatch` on PATH), before anything is
    written or submitted."""
    if shutil.which("sbatch") is None:
        raise ConfigError("--launcher slurm: no `sbatch` on PATH (not a Slurm submission host); use --launcher local")


def make_executor(
    launcher: Literal["local", "slurm"],
    folder: Path,
    name: str,
    job_minutes: int,
    max_parallel: int = 0,
    slurm: SlurmConfig | None = None,
) -> submitit.AutoExecutor:
    """submitit's executor of `launcher`, its job files and logs in `folder`, each job named `name` and limited to
    `job_minutes`. A local job sees the GPUs this process sees (submitit's local executor would hide them); Slurm jobs
    get `slurm`'s resources, at most `max_parallel` of a job array running at once (0: 256)."""
    executor = submitit.AutoExecutor(folder=folder, cluster=launcher)
    executor.update_parameters(name=name, timeout_min=job_minutes)
    if launcher == "local":
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        gpus = (
            "unset CUDA_VISIBLE_DEVICES" if visible is None else f"export CUDA_VISIBLE_DEVICES={shlex.quote(visible)}"
        )
        executor.update_parameters(local_setup=[gpus])
        return executor
    s = slurm or SlurmConfig()
    executor.update_parameters(
        gpus_per_node=s.gpus_per_job, cpus_per_task=s.cpus_per_task, tasks_per_node=1,
        slurm_array_parallelism=max_parallel or 256,
        slurm_additional_parameters=dict(item.split("=", 1) for item in s.additional),
        **({"slurm_partition": s.partition} if s.partition else {}), **({"mem_gb": s.mem_gb} if s.mem_gb else {}),
    )  # fmt: skip
    return executor


def job_call(argv: Sequence[str]) -> functools.partial:
    """A job's work: `argv` in its own process, in this working directory; the job returns its
    `subprocess.CompletedProcess` (the exit code) and imports nothing else."""
    return functools.partial(subprocess.run, list(argv), cwd=os.getcwd(), check=False)


@dataclass(frozen=True)
class JobOutcome:
    """How a job ended: its command's exit code, or why the job itself did not finish, and its log."""

    code: int
    """the command's exit code (1 for a job that did not finish)"""
    log: Path
    """the job's stderr log"""
    unfinished: str = ""
    """why the job ended before its command did (time limit, preemption, a kill; submitit's reason); empty if it did
    not"""

    @property
    def ok(self) -> bool:
        """Whether the command ran to the end and exited 0."""
        return not self.unfinished and self.code == 0

    def describe(self, label: str) -> str:
        """A failed job's line: `label`, its exit code (or why the job did not finish) and its log."""
        if self.unfinished:
            return f"{label} did not finish ({self.unfinished}; log {self.log})"
        return f"{label} exit code {self.code} (log {self.log})"


def job_outcome(job: submitit.Job) -> JobOutcome:
    """A done job's outcome (see `JobOutcome`)."""
    try:
        code = job.result().returncode
    except Exception as err:  # the job itself ended early (time limit, preemption, a kill): submitit's reason
        reason = str(err).strip().splitlines() or [type(err).__name__]
        return JobOutcome(1, Path(job.paths.stderr), reason[0])
    return JobOutcome(code, Path(job.paths.stderr))


def run_jobs(
    executor: submitit.AutoExecutor, commands: Sequence[tuple[str, Sequence[str]]], max_parallel: int = 0
) -> dict[int, JobOutcome]:
    """Each `(name, argv)` of `commands` as a job of `executor`, waited for; each job's outcome by its index in
    `commands`, in the order they finished. A local executor runs at most `max_parallel` at once (0: one at a time), a
    Slurm one submits them all as one job array (its parallelism set by `make_executor`). Progress is printed a line
    per job, starting with its name; stopping the wait (an exception, Ctrl-C) cancels the jobs still running."""
    console = make_console()
    waiting, running, done = list(enumerate(commands)), {}, {}
    if executor.cluster == "slurm":
        with executor.batch():
            jobs = [executor.submit(job_call(argv)) for _, argv in commands]
        running, waiting = dict(enumerate(jobs)), []
        console.print(f"submitted {len(jobs)} jobs (array {jobs[0].job_id.split('_')[0]}), logs in {executor.folder}")
    limit, poll_s = max_parallel or 1, 0.5 if executor.cluster == "local" else 15.0
    try:
        while waiting or running:
            while waiting and len(running) < limit:
                i, (name, argv) = waiting.pop(0)
                running[i] = job = executor.submit(job_call(argv))
                console.print(f"{name}: job {job.job_id}, log {job.paths.stdout}")
            time.sleep(poll_s)
            for i in [i for i, job in running.items() if job.done()]:
                done[i] = outcome = job_outcome(running.pop(i))
                console.print(f"{commands[i][0]}: " + ("finished" if outcome.ok else "failed"))
    except BaseException:
        for job in running.values():
            job.cancel(check=False)
        raise
    return done


def check_seeds(seeds: Sequence[int]) -> None:
    """Refuse a seed list (`--seeds`) with a negative or repeated seed."""
    for seed in seeds:
        if seed < 0:
            raise ConfigError(f"--seeds {' '.join(map(str, seeds))}: seed {seed} is negative; seeds are >= 0")
        if list(seeds).count(seed) > 1:
            raise ConfigError(f"--seeds {' '.join(map(str, seeds))}: seed {seed} is given twice")


def mean_interval(values: Sequence[float]) -> tuple[float, float | None]:
    """The mean of `values` and the half-width of its 95% t-interval, `t.ppf(0.975, n - 1) * sd / sqrt(n)` with the
    sample standard deviation (None for one value)."""
    x = np.asarray(values, dtype=float)
    if len(x) < 2:
        return float(x.mean()), None
    return float(x.mean()), float(stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))


def seed_summary(rows: dict[int, dict[str, float]]) -> dict:
    """A run over seeds, from its row of metrics at each seed: the seeds, each metric's mean and 95% interval
    half-width (None with one seed), and the per-seed rows (keyed by the seed as a string, as JSON keeps them)."""
    cols = list(next(iter(rows.values())))
    spread = {c: mean_interval([row[c] for row in rows.values()]) for c in cols}
    return {
        "seeds": list(rows), "mean": {c: m for c, (m, _) in spread.items()},
        "ci95": {c: h for c, (_, h) in spread.items()}, "per_seed": {str(s): row for s, row in rows.items()},
    }  # fmt: skip


def cell(mean: float, half: float | None = None) -> str:
    """A table cell: `0.950`, or `0.950 ± 0.020` with an interval."""
    return f"{mean:.3f}" if half is None or math.isnan(mean) else f"{mean:.3f} ± {half:.3f}"


def run_process(cmd: list[str], timeout: float) -> dict:
    """Run `cmd` in a new process group with a wall limit (the whole group is killed at the limit)."""
    start = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    out, err, timed_out = "", "", False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
    except BaseException:  # interrupted: the measurement's processes end with this one (they have their own session)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        raise
    if timed_out:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    return {"rc": proc.returncode, "stdout": out, "stderr": err, "timed_out": timed_out, "start": start,
            "seconds": time.time() - start}  # fmt: skip


def process_failure(child: dict, what: str, timeout: float) -> dict | None:
    """An error record for a process that timed out or failed (None when it succeeded)."""
    if child["timed_out"]:
        return {"status": "timeout", "error": f"{what}: no result within {timeout:.0f} s"}
    if child["rc"] != 0:
        tail = (child["stderr"] or child["stdout"]).strip()[-1500:]
        return {"status": "error", "error": f"{what} exited with {child['rc']}: {tail}"}
    return None
