"""Command lines as submitit jobs (local jobs waited for, each outcome by index; Slurm resources; no `sbatch` refused)
and the mean ± 95% t-interval over seeds."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from scipy import stats

from datasets.jobs import (
    JobOutcome,
    SlurmConfig,
    cell,
    check_sbatch,
    check_seeds,
    job_outcome,
    make_executor,
    mean_interval,
    run_jobs,
    seed_summary,
)
from envs.errors import ConfigError


def test_local_jobs_run_their_command_lines_and_report_each_outcome(tmp_path):
    executor = make_executor("local", tmp_path / "jobs", "test-jobs", job_minutes=5)
    commands = [
        ("ok", [sys.executable, "-c", f"open({str(tmp_path / 'ran')!r}, 'w').close()"]),
        ("bad", [sys.executable, "-c", "import sys; sys.exit(3)"]),
    ]
    outcomes = run_jobs(executor, commands, max_parallel=2)
    assert sorted(outcomes) == [0, 1] and (tmp_path / "ran").is_file(), "the job ran in this working directory"
    assert outcomes[0].ok and not outcomes[1].ok and outcomes[1].code == 3
    assert outcomes[1].log.parent == tmp_path / "jobs"
    assert outcomes[1].describe("'bad'") == f"'bad' exit code 3 (log {outcomes[1].log})"


def test_a_job_that_did_not_finish_is_named_with_submitit_s_reason():
    def ended_early():
        raise RuntimeError("Job timed out\nmore detail")

    job = SimpleNamespace(result=ended_early, paths=SimpleNamespace(stderr=Path("jobs/7_0_log.err")))
    outcome = job_outcome(job)
    assert outcome == JobOutcome(1, Path("jobs/7_0_log.err"), "Job timed out") and not outcome.ok
    assert outcome.describe("run") == "run did not finish (Job timed out; log jobs/7_0_log.err)"


def test_slurm_jobs_get_the_resource_flags(tmp_path, monkeypatch):
    """The Slurm options reach submitit's sbatch parameters (a stand-in `srun` on PATH lets the executor be built)."""
    fake = tmp_path / "bin" / "srun"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    slurm = SlurmConfig(partition="gpu", gpus_per_job=2, cpus_per_task=6, mem_gb=32, additional=("account=robotics",))
    params = make_executor("slurm", tmp_path / "jobs", "sweep", 90, max_parallel=3, slurm=slurm)._executor.parameters
    expected = {"partition": "gpu", "gpus_per_node": 2, "cpus_per_task": 6, "time": 90, "mem": "32GB"}
    assert {k: params[k] for k in expected} == expected
    assert params["array_parallelism"] == 3 and params["additional_parameters"] == {"account": "robotics"}
    with pytest.raises(ConfigError, match="slurm.additional"):
        SlurmConfig(additional=("robotics",))


def test_no_sbatch_and_bad_seeds_are_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConfigError, match=r"--launcher slurm: no `sbatch` on PATH"):
        check_sbatch()
    check_seeds((0, 3, 1))
    with pytest.raises(ConfigError, match=r"--seeds 0 1 0: seed 0 is given twice"):
        check_seeds((0, 1, 0))
    with pytest.raises(ConfigError, match=r"--seeds 2 -1: seed -1 is negative"):
        check_seeds((2, -1))


def test_mean_and_95_percent_t_interval():
    # By hand: mean 2.5, sd sqrt(5/3) = 1.2910, t(0.975, 3) = 3.1824 -> 3.1824 * 1.2910 / 2 = 2.0543.
    mean, half = mean_interval([1.0, 2.0, 3.0, 4.0])
    assert mean == 2.5 and half == pytest.approx(2.0543, abs=1e-4)
    low, high = stats.t.interval(0.95, 3, loc=2.5, scale=stats.sem([1.0, 2.0, 3.0, 4.0]))
    assert (mean - half, mean + half) == pytest.approx((low, high))
    assert mean_interval([0.95, 0.97]) == pytest.approx((0.96, 12.7062 * 0.0141421 / math.sqrt(2)), rel=1e-4)
    assert mean_interval([0.4]) == (0.4, None), "one seed: no interval"
    assert cell(0.95, 0.02) == "0.950 ± 0.020" and cell(0.4) == "0.400" and cell(math.nan, math.nan) == "nan"
    summary = seed_summary({0: {"laps": 1.0, "off": 2.0}, 3: {"laps": 0.0, "off": 2.0}})
    assert summary["seeds"] == [0, 3] and summary["mean"] == {"laps": 0.5, "off": 2.0}
    assert summary["ci95"]["off"] == 0.0 and summary["per_seed"]["3"] == {"laps": 0.0, "off": 2.0}
