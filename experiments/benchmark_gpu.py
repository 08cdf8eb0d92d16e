"""GPU-path benchmark: state and camera env throughput, Genesis physics, a teacher on a wall budget, student compute.

    python -m experiments.benchmark_gpu default                       # on CUDA; writes outputs/benchmark_gpu.json
    python -m experiments.benchmark_gpu default --teacher-minutes 2 --genesis-envs
    python -m experiments.benchmark_gpu cpu-smoke --out /tmp/b.json   # the smallest sizes on the CPU

Sections, each measurement in its own process with its own timeout (a failure or a timeout is recorded in the JSON
and the next measurement runs):
- `state`: env-steps/s of the bicycle env without a camera, env tensors on `--device`;
- `camera`: frames/s of the projective-camera env (one 160x120 frame per env-step), and of the renderer alone;
- `genesis`: env-steps/s and physics steps/s of the Genesis car (`gs.gpu` backend when the device is CUDA);
- `teacher`: `python -m experiments.train_teacher` on the device for a wall budget; its final evaluation's lap
  completion per direction, and when its periodic evaluation first reached `--teacher-target` in both directions
  (the write time of that iteration's checkpoint, from the process launch and from the run's start);
- `student`: `python -m experiments.benchmark_student` on the device: DAgger training frames/s (windows/s x frames
  per window) and deployment-step frames/s;
- `dagger`: `python -m experiments.distill_student` from that teacher for `--dagger-rounds` rounds, its camera envs,
  teacher and student on the teacher's device: DAgger end to end (collection, training, evaluation), frames/s.

The JSON (rewritten after every measurement) holds the machine, the device name, package versions, the figures
published by a peer project and the goals; the table sets the figures next to them.
"""

from __future__ import annotations

import json
import math
import resource
import shlex
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import torch
from rich.table import Table

from datasets.checkpoints import CheckpointError, load_checkpoint
from datasets.jobs import process_failure, run_process
from envs.config_io import write_text_atomic
from envs.console import make_console
from envs.errors import ConfigError, check_range
from envs.machine import check_device, device_info, machine, package_versions, synchronize
from envs.racing.config import EnvConfig
from experiments.cli import current_task, run

PEER = {
    "project": "deepracer-genesis",
    "gpu": "NVIDIA GeForce RTX 4060 Ti",
    "state_env_steps_per_s": {"num_envs": 4096, "value": 690_000},
    "camera_frames_per_s": {"num_envs": 256, "resolution": "160x120", "value": 27_500},
    "cnn_ppo_loop_steps_per_s": {"value": 3_500},
}
"""figures a peer project publishes for its GPU env (state steps, rendered steps, its CNN PPO loop)"""
GOALS = {"state_env_steps_per_s": 10_000_000, "camera_frames_per_s": 100_000, "teacher_seconds_to_target": 60.0}
"""what this benchmark is meant to show on one GPU"""
Kind = Literal["state", "camera", "genesis"]


@dataclass(frozen=True)
class GpuBenchConfig:
    """Sizes, budgets and timeouts of each section."""

    device: str = "cuda"
    """torch device of the envs, the teacher and the student (cuda, cuda:1, cpu)"""
    state_envs: tuple[int, ...] = (4096, 16384)
    """env counts of the state-only bicycle env (empty = skip)"""
    camera_envs: tuple[int, ...] = (256, 1024)
    """env counts of the projective-camera env (empty = skip)"""
    genesis_envs: tuple[int, ...] = (4096,)
    """env counts of the Genesis car (empty = skip; the first build in a process compiles kernels)"""
    steps: int = 200
    """timed control steps of a state measurement"""
    camera_steps: int = 100
    """timed control steps of a camera measurement"""
    genesis_steps: int = 50
    """timed control steps of a Genesis measurement (each `env.substeps` physics steps)"""
    warmup: int = 20
    """untimed steps before each env measurement (compilation, caches)"""
    compile: bool = True
    """torch.compile the env kernels (as training does)"""
    track: str = "reinvent2018"
    """track of the env measurements and the teacher"""
    teacher_minutes: float = 5.0
    """the teacher's wall budget (its `--trainer.max-minutes`; 0 = skip the teacher)"""
    teacher_envs: int = 4096
    """the teacher's training envs"""
    teacher_iterations: int = 100_000
    """the teacher's iteration cap (the budget ends it first at the default)"""
    teacher_eval_every: int = 10
    """iterations between the teacher's periodic evaluations (a checkpoint is written at each)"""
    teacher_target: float = 0.99
    """lap completion, in both directions, whose first time in the periodic evaluation is reported"""
    teacher_preset: str = "default"
    """train_teacher preset the run starts from"""
    teacher_args: str = ""
    """more train_teacher flags, one string (e.g. "--ppo.num-mini-batches 8")"""
    student_variants: tuple[str, ...] = ("default",)
    """benchmark_student variants (empty = skip)"""
    student_preset: str = "default"
    """benchmark_student preset (its DAgger batch shape)"""
    student_train_steps: int = 20
    """timed DAgger training steps per variant"""
    student_step_envs: int = 1024
    """cars in the timed deployment step"""
    dagger_rounds: int = 1
    """rounds of the DAgger run from the benchmark's teacher (0 = skip)"""
    dagger_preset: str = "default"
    """distill_student preset of that run"""
    dagger_envs: int = 256
    """its collection envs"""
    timeout_s: float = 240.0
    """wall limit of one measurement process (the teacher's: its budget plus `teacher_overhead_s`)"""
    teacher_overhead_s: float = 240.0
    """the teacher's start-up (env build, compilation) and final evaluation, on top of its budget"""
    out: str = "outputs/benchmark_gpu.json"
    """JSON output path (the teacher's run directory is made next to it)"""
    single: str = ""
    """internal: run one env measurement `kind:num_envs` in this process and print its JSON"""

    def __post_init__(self) -> None:
        for name in ("state_envs", "camera_envs", "genesis_envs"):
            for n in getattr(self, name):
                check_range(name, n, 1, 1_000_000)
        counts = ("steps", "camera_steps", "genesis_steps", "teacher_envs", "teacher_iterations", "teacher_eval_every",
                  "student_train_steps", "student_step_envs", "dagger_envs")  # fmt: skip
        for name in counts:
            check_range(name, getattr(self, name), 1, 10_000_000)
        check_range("warmup", self.warmup, 0, 100_000)
        check_range("dagger_rounds", self.dagger_rounds, 0, 10_000)
        check_range("teacher_minutes", self.teacher_minutes, 0.0, 1e4)
        check_range("teacher_target", self.teacher_target, 0.0, 1.0)
        check_range("timeout_s", self.timeout_s, 1.0, 1e6)
        check_range("teacher_overhead_s", self.teacher_overhead_s, 1.0, 1e6)
        try:
            shlex.split(self.teacher_args)
        except ValueError as err:
            raise ConfigError(f"--teacher-args {self.teacher_args!r}: {err}") from None


def measure_env(cfg: GpuBenchConfig, kind: Kind, num_envs: int) -> dict:
    """Time `env.step` with random discrete actions made on the device; env-steps/s, build time, peak memory."""
    device = check_device(cfg.device)
    env_cfg = EnvConfig(
        num_envs=num_envs, track=cfg.track, device=cfg.device, compile=cfg.compile,
        camera="projective" if kind == "camera" else "none", physics="genesis" if kind == "genesis" else "bicycle",
    )  # fmt: skip
    from envs.racing.env import RacingEnv  # imported here: the parent process never builds an env

    t0 = time.perf_counter()
    env = RacingEnv(env_cfg)
    build = time.perf_counter() - t0
    gen = torch.Generator(device=device).manual_seed(0)
    choices = env.action_space.num_choices
    actions = [torch.randint(0, choices, (num_envs, 1), generator=gen, device=device).float() for _ in range(8)]
    steps = {"state": cfg.steps, "camera": cfg.camera_steps, "genesis": cfg.genesis_steps}[kind]
    for i in range(cfg.warmup):
        env.step(actions[i % 8])
    dones = torch.zeros((), device=device)
    synchronize(device)
    t0 = time.perf_counter()
    for i in range(steps):
        obs, _, done, _ = env.step(actions[i % 8])
        dones += done.sum()
    synchronize(device)
    elapsed = time.perf_counter() - t0
    result = {
        "status": "ok", "kind": kind, "num_envs": num_envs, "steps": steps, "seconds": elapsed,
        "env_steps_per_s": num_envs * steps / elapsed, "resets_per_step": float(dones) / steps,
        "build_seconds": build, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
    }  # fmt: skip
    if device.type == "cuda":
        result["peak_device_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
    if kind == "camera":
        result["frames_per_s"] = result["env_steps_per_s"]
        result["image"] = list(obs["camera"].shape[1:])
        state, reps = env.physics.state, max(4, steps // 2)
        synchronize(device)
        t0 = time.perf_counter()
        for _ in range(reps):
            env.camera.render(state.x, state.y, state.yaw, env.visuals)
        synchronize(device)
        result["render_only_frames_per_s"] = num_envs * reps / (time.perf_counter() - t0)
    if kind == "genesis":
        import genesis as gs  # already imported by the env

        result["physics_steps_per_s"] = result["env_steps_per_s"] * env_cfg.substeps
        result["genesis_backend"] = str(getattr(gs, "backend", "unknown"))
    return result


def env_measurement(cfg: GpuBenchConfig, kind: Kind, n: int) -> dict:
    cmd = [sys.executable, "-m", "experiments.benchmark_gpu", "default", "--task", current_task(),
           "--device", cfg.device, "--track", cfg.track, "--steps", str(cfg.steps), "--camera-steps",
           str(cfg.camera_steps), "--genesis-steps", str(cfg.genesis_steps), "--warmup", str(cfg.warmup),
           "--compile" if cfg.compile else "--no-compile", "--single", f"{kind}:{n}"]  # fmt: skip
    child = run_process(cmd, cfg.timeout_s)
    bad = process_failure(child, f"{kind} at {n} envs", cfg.timeout_s)
    try:
        result = bad or json.loads(child["stdout"].strip().splitlines()[-1])
    except (ValueError, IndexError):
        result = {"status": "error", "error": f"no JSON result line; output ends: {child['stdout'][-1000:]}"}
    return {"kind": kind, "num_envs": n, **result, "process_seconds": child["seconds"]}


def lap_completion(metrics: dict) -> dict[str, float]:
    return {d: metrics.get(f"{d}/lap_completion", metrics.get("lap_completion", 0.0)) for d in ("forward", "reverse")}


def teacher_report(cfg: GpuBenchConfig, run_dir: Path, launched: float) -> dict:
    """The teacher's figures from its run directory: the last checkpoint's `history` (one entry per periodic
    evaluation), each entry timed by the write of its iteration's checkpoint, and, once the run has finished,
    `eval.json` (final evaluation, iterations, env-steps, training wall time)."""
    ckpts = sorted((run_dir / "checkpoints").glob("iter_*.pt"))
    history = json.loads(load_checkpoint(ckpts[-1])["history"]) if ckpts else []
    started = (run_dir / "config.yaml").stat().st_mtime
    timeline = []
    for entry in history:
        ckpt = run_dir / "checkpoints" / f"iter_{int(entry['iteration']):06d}.pt"
        written = ckpt.stat().st_mtime if ckpt.exists() else float("nan")
        timeline.append({"iteration": int(entry["iteration"]), "env_steps": int(entry["env_steps"]),
                         **lap_completion(entry), "seconds_from_launch": written - launched,
                         "seconds_from_run_start": written - started})  # fmt: skip
    first = next((t for t in timeline if min(t["forward"], t["reverse"]) >= cfg.teacher_target), None)
    report = {"status": "ok", "num_envs": cfg.teacher_envs, "budget_minutes": cfg.teacher_minutes,
              "target": cfg.teacher_target, "reached_target": first is not None, "first_at_target": first,
              "history": timeline, "run_dir": str(run_dir)}  # fmt: skip
    if not (run_dir / "eval.json").exists():
        return report
    summary = json.loads((run_dir / "eval.json").read_text())
    final, train_s = summary[f"eval/{cfg.track}"], 60.0 * summary["wall_minutes"]
    return {**report, "iterations": summary["iterations"], "env_steps": summary["env_steps"],
            "train_seconds": train_s, "env_steps_per_s": summary["env_steps"] / max(train_s, 1e-9),
            "final_eval": {"track": cfg.track, "episodes": final["episodes"], **lap_completion(final),
                           "lap_time": final["lap_time"], "lap_time_ratio": final["lap_time_ratio"]}}  # fmt: skip


def teacher_measurement(cfg: GpuBenchConfig, out_dir: Path) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    run_dir = Path(tempfile.mkdtemp(prefix=f"{Path(cfg.out).stem}-teacher-", dir=out_dir))
    every = str(cfg.teacher_eval_every)
    cmd = [sys.executable, "-m", "experiments.train_teacher", cfg.teacher_preset, "--task", current_task(),
           "--run-dir", str(run_dir), "--env.num-envs", str(cfg.teacher_envs), "--env.device", cfg.device,
           "--env.track", cfg.track, "--trainer.device", cfg.device, "--trainer.max-minutes", str(cfg.teacher_minutes),
           "--trainer.iterations", str(cfg.teacher_iterations), "--trainer.eval-every", every,
           "--trainer.save-every", every, "--generalization-tracks", "--wandb.mode", "disabled",
           *shlex.split(cfg.teacher_args)]  # fmt: skip
    timeout = 60.0 * cfg.teacher_minutes + cfg.teacher_overhead_s
    child = run_process(cmd, timeout)
    bad = process_failure(child, "train_teacher", timeout) or {}
    try:  # a run that failed or timed out still has the history of its checkpoints
        result = {**teacher_report(cfg, run_dir, child["start"]), **bad}
    except (OSError, KeyError, ValueError, CheckpointError) as err:
        result = bad or {"status": "error", "error": f"reading the teacher's run directory {run_dir}: {err!r}"}
    return {**result, "process_seconds": child["seconds"]}


def dagger_measurement(cfg: GpuBenchConfig, teacher_run: Path, out_dir: Path) -> dict:
    """A DAgger run from the benchmark's teacher (its `teacher.pt`): rounds, samples, DAgger wall time and samples
    per second of it, and the student against the teacher from the run's `eval.json`."""
    teacher = teacher_run / "teacher.pt"
    if not teacher.is_file():
        return {"status": "skipped", "reason": f"no {teacher} (the teacher section did not finish)"}
    run_dir = Path(tempfile.mkdtemp(prefix=f"{Path(cfg.out).stem}-dagger-", dir=out_dir))
    cmd = [sys.executable, "-m", "experiments.distill_student", cfg.dagger_preset, "--task", current_task(),
           "--teacher", str(teacher), "--run-dir", str(run_dir), "--dagger.rounds", str(cfg.dagger_rounds),
           "--dagger.envs", str(cfg.dagger_envs), "--wandb.mode", "disabled"]  # fmt: skip
    child = run_process(cmd, cfg.timeout_s)
    bad = process_failure(child, "distill_student", cfg.timeout_s)
    if bad:
        return {**bad, "process_seconds": child["seconds"]}
    summary = json.loads((run_dir / "eval.json").read_text())
    seconds = 60.0 * summary["dagger_minutes"]
    return {"status": "ok", "rounds": summary["rounds"], "envs": cfg.dagger_envs, "samples": summary["samples"],
            "dagger_seconds": seconds, "samples_per_s": summary["samples"] / max(seconds, 1e-9),
            "student": lap_completion(summary["student"]), "teacher": lap_completion(summary["teacher"]),
            "run_dir": str(run_dir), "process_seconds": child["seconds"]}  # fmt: skip


def student_measurement(cfg: GpuBenchConfig, out_dir: Path) -> list[dict]:
    out = out_dir / f"{Path(cfg.out).stem}-student.json"
    cmd = [sys.executable, "-m", "experiments.benchmark_student", cfg.student_preset, "--task", current_task(),
           "--device", cfg.device, "--variants", *cfg.student_variants, "--train-steps", str(cfg.student_train_steps),
           "--step-envs", str(cfg.student_step_envs), "--out", str(out)]  # fmt: skip
    child = run_process(cmd, cfg.timeout_s)
    bad = process_failure(child, "benchmark_student", cfg.timeout_s)
    try:
        report = json.loads(out.read_text()) if not bad else {}
    except (OSError, ValueError) as err:
        bad = {"status": "error", "error": f"reading {out}: {err!r}"}
    if bad:
        return [{**bad, "process_seconds": child["seconds"]}]
    keep = ("variant", "window_frames", "train_windows_per_s", "train_frames_per_s", "deploy_frames_per_s")
    return [{"status": "ok", **{k: r[k] for k in keep}, "deploy_cars": cfg.student_step_envs, **report["dagger"],
             "process_seconds": child["seconds"]} for r in report["results"]]  # fmt: skip


def comparison(report: dict) -> list[dict]:
    """One row per figure: its value, the peer's figure at the same size and the goal where there are such, and the
    measurement's status (a row without a value says why: skipped, error, timeout, or the teacher's target not
    reached)."""
    rows: list[dict] = []

    def add(r: dict, figure: str, size: object, key: str, peer=None, goal=None, higher: bool = True, note: str = ""):
        value = r.get(key) if r.get("status") == "ok" else None
        row = {"figure": figure, "size": size, "value": value, "peer": peer, "goal": goal, "status": r.get("status")}
        if note:
            row["peer_note"] = note
        if value is not None and goal is not None:
            row["meets_goal"] = value >= goal if higher else value <= goal
        rows.append(row)

    state, camera = PEER["state_env_steps_per_s"], PEER["camera_frames_per_s"]
    for r in report["state"]:
        peer = state["value"] if r["num_envs"] == state["num_envs"] else None
        add(r, "state env-steps/s", r["num_envs"], "env_steps_per_s", peer, GOALS["state_env_steps_per_s"])
    for r in report["camera"]:
        peer = camera["value"] if r["num_envs"] == camera["num_envs"] else None
        add(r, "camera frames/s (160x120)", r["num_envs"], "frames_per_s", peer, GOALS["camera_frames_per_s"])
    for r in report["genesis"]:
        add(r, "Genesis physics steps/s", r.get("num_envs"), "physics_steps_per_s")
    for r in report["teacher"]:
        reached = r["status"] != "ok" or r.get("reached_target")
        first = {"status": r["status"] if reached else "target not reached", **(r.get("first_at_target") or {})}
        goal = GOALS["teacher_seconds_to_target"]
        add(first, "teacher s to target laps", r.get("num_envs"), "seconds_from_launch", goal=goal, higher=False)
        final = {"status": r["status"], **(r.get("final_eval") or {})}
        for d in ("forward", "reverse"):
            add(final, f"teacher final laps {d}", r.get("num_envs"), d)
        add(r, "teacher env-steps/s (PPO)", r.get("num_envs"), "env_steps_per_s")
    cnn = PEER["cnn_ppo_loop_steps_per_s"]["value"]
    for r in report["student"]:
        add(r, "student DAgger training frames/s", r.get("variant"), "train_frames_per_s", cnn,
            note="the peer's full CNN PPO loop, steps/s")  # fmt: skip
        add(r, "student deployment frames/s", r.get("deploy_cars"), "deploy_frames_per_s")
    for r in report["dagger"]:
        add(r, "DAgger samples/s (collect + train + eval)", r.get("envs"), "samples_per_s")
    return rows


def clean(value: object) -> object:
    """JSON-safe: NaN and inf become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    return value


def print_table(console, report: dict) -> None:
    peer = f"{PEER['project']} ({PEER['gpu']})"
    table = Table(title=f"GPU path on {report['device']['name']} ({report['config']['device']})")
    for col in ("figure", "size", "value", peer, "goal", "meets goal"):
        table.add_column(col)
    fmt = lambda v: "-" if v is None else f"{v:.2f}" if isinstance(v, float) and v <= 1.0 else f"{v:,.0f}"  # noqa: E731
    for row in report["comparison"]:
        meets = {True: "yes", False: "no"}.get(row.get("meets_goal"), "" if row["status"] == "ok" else row["status"])
        size = "-" if row["size"] is None else str(row["size"])
        table.add_row(row["figure"], size, fmt(row["value"]), fmt(row["peer"]), fmt(row["goal"]), meets)
    console.print(table)
    for name in ("state", "camera", "genesis", "teacher", "student", "dagger"):
        for r in report[name]:
            if r.get("status") != "ok":
                console.print(f"[yellow]{name}: {r.get('status')}: {str(r.get('error', r.get('reason')))[:300]}[/]")


def main(cfg: GpuBenchConfig) -> dict:
    device = check_device(cfg.device)
    if cfg.single:
        kind, n = cfg.single.split(":")
        print(json.dumps(measure_env(cfg, kind, int(n))))  # type: ignore[arg-type]
        return {}
    console = make_console()
    out = Path(cfg.out)
    report: dict = {"machine": machine(), "device": device_info(device), "versions": package_versions(),
                    "config": asdict(cfg), "peer": PEER, "goals": GOALS}  # fmt: skip
    for name in ("state", "camera", "genesis", "teacher", "student", "dagger"):
        report[name] = []
    start = time.time()

    def record(name: str, results: list[dict]) -> None:
        report[name].extend(results)
        report["total_seconds"] = time.time() - start
        report["comparison"] = comparison(report)
        write_text_atomic(out, json.dumps(clean(report), indent=2))

    plan = [("state", n) for n in cfg.state_envs] + [("camera", n) for n in cfg.camera_envs]
    for kind, n in plan + [("genesis", n) for n in cfg.genesis_envs]:
        console.print(f"measuring {kind} at {n} envs on {cfg.device} ...")
        record(kind, [env_measurement(cfg, kind, n)])  # type: ignore[arg-type]
    if not cfg.genesis_envs:
        record("genesis", [{"status": "skipped", "reason": "--genesis-envs is empty"}])
    if cfg.student_variants:
        console.print(f"measuring the student ({', '.join(cfg.student_variants)}) on {cfg.device} ...")
        record("student", student_measurement(cfg, out.parent))
    else:
        record("student", [{"status": "skipped", "reason": "--student-variants is empty"}])
    if cfg.teacher_minutes > 0:
        console.print(f"training a teacher ({cfg.teacher_minutes} min, {cfg.teacher_envs} envs) on {cfg.device} ...")
        record("teacher", [teacher_measurement(cfg, out.parent)])
    else:
        record("teacher", [{"status": "skipped", "reason": "--teacher-minutes is 0"}])
    teacher_run = report["teacher"][0].get("run_dir")
    if cfg.dagger_rounds > 0 and teacher_run:
        console.print(f"DAgger from that teacher ({cfg.dagger_rounds} rounds, {cfg.dagger_envs} envs) ...")
        record("dagger", [dagger_measurement(cfg, Path(teacher_run), out.parent)])
    else:
        record("dagger", [{"status": "skipped", "reason": "--dagger-rounds is 0 or no teacher was trained"}])
    print_table(console, report)
    console.print(f"wrote {out.resolve()} in {report['total_seconds']:.0f} s")
    return report


PRESETS = {
    "default": ("CUDA: state {4096, 16384}, camera {256, 1024}, Genesis 4096 (gs.gpu), a 5-minute teacher at 4096 "
                "envs, the default student", GpuBenchConfig()),
    "cpu-smoke": ("the CPU at the smallest sizes, Genesis skipped, a 3-iteration smoke teacher (checks the script)",
                  GpuBenchConfig(
        device="cpu", state_envs=(64, 128), camera_envs=(8,), genesis_envs=(), steps=20, camera_steps=5,
        genesis_steps=5, warmup=2, compile=False, teacher_minutes=1.0, teacher_envs=32, teacher_iterations=3,
        teacher_eval_every=2, teacher_preset="smoke", student_preset="smoke", student_train_steps=2,
        student_step_envs=8, dagger_preset="smoke", dagger_rounds=1, dagger_envs=4, timeout_s=120.0,
        teacher_overhead_s=120.0, out="outputs/benchmark_gpu_cpu_smoke.json",
    )),
}  # fmt: skip

if __name__ == "__main__":
    run(main, {"racing": PRESETS}, description=__doc__)
