"""First measurements of the two-arm Genesis scene: grasp slip, control-step throughput, camera cost, setter isolation,
and the TCP wrench the arms report at two physics steps.

    python -m experiments.research.bimanual_probe default
    python -m experiments.research.bimanual_probe default --measurements slip
    python -m experiments.research.bimanual_probe default --measurements camera --threads 1
    python -m experiments.research.bimanual_probe smoke

`slip`: the scripted grasp (approach above the bar's ends, descend, close with a finger force, lift 0.15 m, hold) on
every cell of bar mass x friction x finger force, all cells in one batched scene (`repeats` envs per cell, each with
its own random bar pose); per cell the bar's displacement relative to the two TCPs over the lift and over the hold
(mm), the drop rate, and the largest box of grid values in which the script holds the bar (the training range
suggested). `throughput`: env-steps/s of the full 20 Hz control step (IK of both arms, the physics steps, the state
reads) during the grasp, at each env count, with `batch_dofs_info` off and on. `camera`: 96x96 grayscale images/s of
each renderer (Genesis' rasterizer, the ray caster) at each env count, timed around the render while the scripted
grasp runs, and the silhouette IoU of arms and object between the ray caster and Genesis' segmentation. `setters`:
friction, object mass, centre-of-mass shift and arm gains written on one env each; every other env keeps its values
and its motion (compared with a run before the change). Writes `bimanual_probe.json`.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import platform
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Literal

import torch
from rich.table import Table
from torch import Tensor

from envs.bimanual.camera import RaycastCamera, scene_geometry
from envs.bimanual.control import BimanualController, GraspScript, ScriptedGrasp, grasp_points, grasp_yaw
from envs.bimanual.observations import read_state
from envs.bimanual.scene import BimanualScene, SceneConfig, build_scene
from envs.config_io import write_text_atomic
from envs.console import make_console
from envs.errors import ConfigError
from experiments.cli import run

Measurement = Literal["slip", "throughput", "camera", "setters", "wrench"]


@dataclass(frozen=True)
class ProbeConfig:
    """Which measurements, over what grid."""

    measurements: tuple[Measurement, ...] = ("slip", "throughput", "camera", "setters", "wrench")
    """the measurements to run, in order"""
    masses: tuple[float, ...] = (0.1, 0.3, 0.6, 1.0)
    """bar masses of the slip grid (kg)"""
    frictions: tuple[float, ...] = (0.4, 0.8, 1.2)
    """finger-bar frictions of the slip grid"""
    finger_forces: tuple[float, ...] = (-2.0, -4.0, -6.0)
    """finger forces of the slip grid (N)"""
    repeats: int = 4
    """envs per slip cell, each with its own bar pose"""
    pose_jitter: tuple[float, float] = (0.04, 0.3)
    """bar start pose spread: position (± m in x and y) and yaw (± rad)"""
    max_drop_rate: float = 0.0
    """a cell holds when at most this fraction of its envs drops the bar ..."""
    max_hold_slip_mm: float = 10.0
    """... and the bar moves at most this far relative to the TCPs during the hold (mm, mean over its envs)"""
    throughput_envs: tuple[int, ...] = (16, 64, 128)
    """env counts of the throughput measurement"""
    camera_envs: tuple[int, ...] = (16, 32)
    """env counts of the camera measurement"""
    camera_renderers: tuple[Literal["genesis", "raycast"], ...] = ("genesis", "raycast")
    """renderers the camera measurement compares"""
    camera_frames: int = 20
    """frames rendered per camera measurement (control steps around the descent and the grasp)"""
    wrench_steps: tuple[float, ...] = (0.01, 0.005)
    """physics steps (s) at which the wrench measurement reads the arms' TCP wrench (the control step stays 0.05 s)"""
    wrench_envs: int = 16
    """envs (episodes) of the wrench measurement"""
    threads: int = 0
    """torch threads (0: leave torch's default)"""
    scene: SceneConfig = field(default_factory=SceneConfig)
    """the bar and the scene (num_envs and batch_dofs_info are set per measurement)"""
    script: GraspScript = field(default_factory=GraspScript)
    """the scripted grasp"""
    seed: int = 0
    """seed of the bar poses"""
    out: str = "outputs/bimanual_probe.json"
    """where the JSON goes"""

    def __post_init__(self) -> None:
        if not self.measurements:
            raise ConfigError("--measurements is empty; choose from slip, throughput, camera, setters, wrench")
        if self.repeats < 1:
            raise ConfigError(f"--repeats={self.repeats}; need at least 1")
        if any(r not in ("genesis", "raycast") for r in self.camera_renderers):
            raise ConfigError(f"--camera-renderers={self.camera_renderers!r}; choose from genesis, raycast")
        if not 0 <= self.threads <= 256:
            raise ConfigError(f"--threads={self.threads}; allowed [0, 256]")


def random_bar_poses(n: int, cfg: ProbeConfig, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """`(n, 3)` bar centres on the table and `(n,)` yaws, spread around the table centre."""
    dxy, dyaw = cfg.pose_jitter
    xy = (torch.rand(n, 2, generator=gen) * 2 - 1) * dxy
    z = torch.full((n, 1), cfg.scene.object_extent[2] / 2)
    return torch.cat([xy, z], -1), (torch.rand(n, generator=gen) * 2 - 1) * dyaw


def run_grasp(bs: BimanualScene, ctrl: BimanualController, script: GraspScript, force: Tensor, pos, yaw, on_step=None):
    """Reset every env to its bar pose and run the whole script; `on_step(k)` after each control step."""
    everyone = torch.arange(bs.num_envs)
    bs.reset(everyone, pos, yaw)
    ctrl.reset(everyone)
    driver = ScriptedGrasp(script, grasp_points(pos, yaw, bs.cfg.object_extent[0], script.end_margin),
                           grasp_yaw(yaw), force)  # fmt: skip
    for k in range(script.total_steps):
        poses = ctrl.poses()
        ctrl.step(*driver.command(k, ctrl.target_pos, ctrl.target_yaw), poses)
        if on_step is not None:
            on_step(k)


# -------------------------------------------------------------------------------------------------------- slip
def largest_holding_box(holds: Tensor) -> tuple[slice, ...] | None:
    """The box of grid indices (a slice per axis) with the most cells, all of which hold; None when no cell does."""
    best, best_size = None, 0
    ranges = [[(a, b) for a in range(n) for b in range(a + 1, n + 1)] for n in holds.shape]
    for box in itertools.product(*ranges):
        sl = tuple(slice(a, b) for a, b in box)
        size = math.prod(b - a for a, b in box)
        if size > best_size and bool(holds[sl].all()):
            best, best_size = sl, size
    return best


def measure_slip(cfg: ProbeConfig, console) -> dict:
    cells = list(itertools.product(cfg.masses, cfg.frictions, cfg.finger_forces))
    n = len(cells) * cfg.repeats
    bs = build_scene(replace(cfg.scene, num_envs=n, batch_dofs_info=False))
    ctrl = BimanualController(bs)
    cell = torch.arange(n) // cfg.repeats
    grid = torch.tensor(cells)[cell]  # (n, 3): mass, friction, force
    everyone = torch.arange(n)
    bs.set_object_mass(grid[:, 0], everyone)
    bs.set_friction(grid[:, 1], everyone)
    pos, yaw = random_bar_poses(n, cfg, torch.Generator().manual_seed(cfg.seed))
    spans = cfg.script.phases()
    marks = {"closed": spans["close"][1] - 1, "lifted": spans["lift"][1] - 1, "held": spans["hold"][1] - 1}
    rel = {}

    def record(k: int) -> None:
        for name, step in marks.items():
            if k == step:
                rel[name] = bs.object.get_pos() - ctrl.poses().pos.mean(1)

    t0 = time.perf_counter()
    run_grasp(bs, ctrl, cfg.script, grid[:, 2], pos, yaw, record)
    seconds = time.perf_counter() - t0
    height = bs.object.get_pos()[:, 2] - pos[:, 2]
    dropped = (height < cfg.script.lift_height / 2) | bs.solver.get_error_envs_mask()
    lift_slip = (rel["lifted"] - rel["closed"]).norm(dim=-1) * 1000
    hold_slip = (rel["held"] - rel["lifted"]).norm(dim=-1) * 1000
    bs.close()
    rows = []
    shape = (len(cfg.masses), len(cfg.frictions), len(cfg.finger_forces))
    holds = torch.zeros(shape, dtype=torch.bool)
    for i, (m, mu, f) in enumerate(cells):
        sel = cell == i
        kept = sel & ~dropped
        row = {
            "mass": m, "friction": mu, "finger_force": f,
            "drop_rate": float(dropped[sel].float().mean()),
            "lift_slip_mm": float(lift_slip[kept].mean()) if kept.any() else None,
            "hold_slip_mm": float(hold_slip[kept].mean()) if kept.any() else None,
            "hold_slip_max_mm": float(hold_slip[kept].max()) if kept.any() else None,
        }  # fmt: skip
        ok = row["drop_rate"] <= cfg.max_drop_rate and (row["hold_slip_mm"] or math.inf) <= cfg.max_hold_slip_mm
        holds[i // (shape[1] * shape[2]), (i // shape[2]) % shape[1], i % shape[2]] = ok
        rows.append(row)
    box = largest_holding_box(holds)
    axes = (cfg.masses, cfg.frictions, cfg.finger_forces)
    suggested = None
    if box is not None:
        m, mu, f = ([vals[s][0], vals[s][-1]] for vals, s in zip(axes, box))
        suggested = {"mass": m, "friction": mu, "finger_force": sorted(f)}
    table = Table(title=f"scripted grasp: slip relative to the TCPs ({cfg.repeats} envs per cell)")
    for col in ("mass kg", "μ", "force N", "drop", "lift slip mm", "hold slip mm", "hold slip max mm"):
        table.add_column(col)
    fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
    for r in rows:
        table.add_row(f"{r['mass']:.1f}", f"{r['friction']:.1f}", f"{r['finger_force']:.0f}", f"{r['drop_rate']:.2f}",
                      fmt(r["lift_slip_mm"]), fmt(r["hold_slip_mm"]), fmt(r["hold_slip_max_mm"]))  # fmt: skip
    console.print(table)
    console.print(f"largest box of holding cells (training range suggested): {suggested}")
    return {"envs": n, "seconds": seconds, "cells": rows, "suggested_training_range": suggested}


# -------------------------------------------------------------------------------------------------- throughput
def measure_throughput(cfg: ProbeConfig, console) -> dict:
    rows = []
    for batched in (False, True):
        for n in cfg.throughput_envs:
            t_build = time.perf_counter()
            bs = build_scene(replace(cfg.scene, num_envs=n, batch_dofs_info=batched))
            build_s = time.perf_counter() - t_build
            ctrl = BimanualController(bs)
            pos, yaw = random_bar_poses(n, cfg, torch.Generator().manual_seed(cfg.seed))
            start = cfg.script.phases()["descend"][0]  # time from the descent on: contacts, grasp and lift
            clock: dict[str, float] = {}

            def tick(k: int, bs=bs, ctrl=ctrl, start=start, clock=clock) -> None:
                read_state(bs, ctrl)
                if k == start - 1:
                    clock["t0"] = time.perf_counter()

            run_grasp(bs, ctrl, cfg.script, torch.full((n,), cfg.scene.finger_force), pos, yaw, tick)
            steps = cfg.script.total_steps - start
            seconds = time.perf_counter() - clock["t0"]
            rows.append({"batch_dofs_info": batched, "envs": n, "build_s": build_s,
                         "control_steps_per_s": steps / seconds, "env_steps_per_s": n * steps / seconds,
                         "physics_env_steps_per_s": n * steps * cfg.scene.decimation / seconds})  # fmt: skip
            bs.close()
    base = {r["envs"]: r["env_steps_per_s"] for r in rows if not r["batch_dofs_info"]}
    for r in rows:
        r["relative_to_unbatched"] = r["env_steps_per_s"] / base[r["envs"]]
    table = Table(title="full control step (20 Hz: IK, 5 physics steps, state reads)")
    for col in ("batch_dofs_info", "envs", "env-steps/s", "physics env-steps/s", "vs off", "build s"):
        table.add_column(col)
    for r in rows:
        table.add_row(str(r["batch_dofs_info"]), str(r["envs"]), f"{r['env_steps_per_s']:.0f}",
                      f"{r['physics_env_steps_per_s']:.0f}", f"{r['relative_to_unbatched']:.2f}",
                      f"{r['build_s']:.1f}")  # fmt: skip
    console.print(table)
    return {"rows": rows}


# ------------------------------------------------------------------------------------------------------ camera
def silhouette_iou(a: Tensor, b: Tensor) -> Tensor:
    """`(N,)` intersection over union of boolean masks `(N, H, W)` (1 where both are empty)."""
    inter, union = (a & b).flatten(1).sum(-1), (a | b).flatten(1).sum(-1)
    return torch.where(union > 0, inter / union.clamp(min=1), torch.ones(()))


def camera_agreement(bs: BimanualScene) -> dict:
    """IoU of what the ray caster and Genesis' segmentation call arm and object, per env, on a Genesis scene."""
    raycaster = RaycastCamera(scene_geometry(bs), bs.cfg.camera_res)
    poses = bs.solver.get_links_pos(), bs.solver.get_links_quat()
    genesis, mine = bs.render_links(), raycaster.render_links(*poses)
    obj = bs.object_link
    arm = lambda links: (links >= 0) & (links != obj)  # noqa: E731
    images = torch.cat([bs.render_gray(), raycaster.render(*poses)])
    return {"arms": silhouette_iou(arm(genesis), arm(mine)).tolist(),
            "object": silhouette_iou(genesis == obj, mine == obj).tolist(), "images": images}  # fmt: skip


def measure_camera(cfg: ProbeConfig, console, out_dir: Path) -> dict:
    """Images/s of each renderer while the scripted grasp runs (arms reaching into view), timed around the render."""
    rows: list[dict] = []
    held: dict = {}  # the agreement with Genesis, measured once on the first Genesis scene
    begin = max(0, cfg.script.phases()["descend"][0] - cfg.camera_frames // 2)  # around the descent and the grasp
    shots = range(begin, begin + cfg.camera_frames)
    for renderer in cfg.camera_renderers:
        for n in cfg.camera_envs:
            scene = replace(cfg.scene, num_envs=n, camera=True, camera_renderer=renderer, batch_dofs_info=False)
            bs = build_scene(scene)
            ctrl = BimanualController(bs)
            pos, yaw = random_bar_poses(n, cfg, torch.Generator().manual_seed(cfg.seed))
            t0 = time.perf_counter()
            bs.render_gray()
            first_s = time.perf_counter() - t0
            render_s: list[float] = []

            def shoot(k: int, bs=bs, render_s=render_s, renderer=renderer) -> None:
                if k in shots:
                    t0 = time.perf_counter()
                    bs.render_gray()
                    render_s.append(time.perf_counter() - t0)
                if k == shots[len(shots) // 2] and renderer == "genesis" and not held:
                    held.update(camera_agreement(bs))

            t0 = time.perf_counter()
            run_grasp(bs, ctrl, cfg.script, torch.full((n,), cfg.scene.finger_force), pos, yaw, shoot)
            step_s = (time.perf_counter() - t0 - sum(render_s)) / cfg.script.total_steps
            frame_s = sum(render_s) / len(render_s)
            rows.append({"renderer": renderer, "envs": n, "res": cfg.scene.camera_res, "first_frame_s": first_s,
                         "images_per_s": n / frame_s, "ms_per_image": 1000 * frame_s / n,
                         "control_steps_per_s_with_camera": 1 / (step_s + frame_s),
                         "control_steps_per_s_without": 1 / step_s})  # fmt: skip
            bs.close()
    table = Table(title=f"camera {cfg.scene.camera_res}x{cfg.scene.camera_res} gray during the grasp, torch threads "
                  f"{torch.get_num_threads()}")  # fmt: skip
    for col in ("renderer", "envs", "images/s", "ms/image", "control steps/s with / without", "first frame s"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["renderer"], str(r["envs"]), f"{r['images_per_s']:.0f}", f"{r['ms_per_image']:.2f}",
                      f"{r['control_steps_per_s_with_camera']:.1f} / {r['control_steps_per_s_without']:.1f}",
                      f"{r['first_frame_s']:.2f}")  # fmt: skip
    console.print(table)
    result: dict = {"rows": rows}
    if held:
        import cv2

        images = held.pop("images")  # (2n, 1, H, W): Genesis, then the ray caster
        k = min(4, images.shape[0] // 2)
        grid = torch.cat([torch.cat(list(images[:k, 0]), 1), torch.cat(list(images[images.shape[0] // 2 :][:k, 0]), 1)])
        out_dir.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(out_dir / "bimanual_probe_camera.png"), grid.numpy())
        result["iou_raycast_vs_genesis"] = held
        mean = {key: round(sum(v) / len(v), 3) for key, v in held.items()}
        console.print(f"silhouette IoU of the ray caster against Genesis' segmentation, mean over envs: {mean}")
    return result


# ----------------------------------------------------------------------------------------------------- setters
def measure_setters(cfg: ProbeConfig, console) -> dict:
    """Env 1 friction, env 2 mass, env 3 centre of mass, env 4 gains; envs 0 and 5 untouched."""
    n = 6
    bs = build_scene(replace(cfg.scene, num_envs=n, batch_dofs_info=True))
    ctrl = BimanualController(bs)
    pos = torch.tensor([[0.0, 0.0, bs.cfg.object_extent[2] / 2]]).expand(n, -1)
    yaw = torch.zeros(n)
    force = torch.full((n,), -2.0)  # a light grip, so that friction and mass show in the motion

    def trajectory() -> Tensor:
        trace = []
        run_grasp(bs, ctrl, cfg.script, force, pos, yaw, lambda k: trace.append(bs.object.get_pos()))
        return torch.stack(trace)  # (T, N, 3)

    def values() -> dict[str, Tensor]:
        return {"friction": bs.friction(), "mass": bs.object_mass(), "com_shift": bs.object_com_shift().norm(dim=-1),
                "kp": bs.arm_kp()[:, 0, 0]}  # fmt: skip

    before, base = values(), trajectory()
    bs.set_friction(torch.tensor([0.3]), torch.tensor([1]))
    bs.set_object_mass(torch.tensor([1.2]), torch.tensor([2]))
    bs.set_object_com_shift(torch.tensor([[0.1, 0.0, 0.0]]), torch.tensor([3]))
    kp_scale = torch.tensor([0.3])
    bs.set_arm_gains(kp_scale, kp_scale, torch.tensor([4]))
    after, moved = values(), trajectory()
    bs.close()
    target_env = {"friction": 1, "mass": 2, "com_shift": 3, "kp": 4}
    rows = []
    for name, k in target_env.items():
        changed = (after[name] - before[name]).abs() > 1e-6
        rows.append({"setter": name, "env": k, "changed_envs": changed.nonzero().flatten().tolist(),
                     "value_before": float(before[name][k]), "value_after": float(after[name][k])})  # fmt: skip
    gap_mm = ((moved - base).norm(dim=-1).amax(0) * 1000).tolist()  # (N,) largest object-path difference
    ok = all(r["changed_envs"] == [r["env"]] for r in rows) and max(gap_mm[0], gap_mm[5]) < 0.1
    table = Table(title="per-env setters: one env each (envs 0 and 5 untouched)")
    for col in ("setter", "env", "envs whose value changed", "value before -> after"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["setter"], str(r["env"]), str(r["changed_envs"]),
                      f"{r['value_before']:.3f} -> {r['value_after']:.3f}")  # fmt: skip
    console.print(table)
    console.print(
        "largest object-path change after the setters, per env (mm): " + ", ".join(f"{g:.3f}" for g in gap_mm)
    )
    console.print(f"isolation holds: {ok}")
    return {"rows": rows, "object_path_change_mm": gap_mm, "isolated": ok}


def measure_wrench(cfg: ProbeConfig, console) -> dict:
    """The TCP wrench the arms report (their joint torques through the Jacobian, calibration exact, no noise or bias)
    while the scripted expert lifts the bar in the nominal world, at each physics step of `wrench_steps`: its mean and
    standard deviation per axis over every control step of every episode."""
    from envs.bimanual.config import BimanualConfig, nominal
    from envs.bimanual.env import BimanualEnv
    from envs.bimanual.expert import ScriptedExpert
    from envs.bimanual.task import BimanualEvalConfig, run_episodes, summarize

    table, rows = Table(title="TCP wrench during the expert's lift (arm 0; N and N·m)"), []
    for col in ("physics step", "success", "mean fx fy fz", "std fx fy fz", "std tx ty tz"):
        table.add_column(col)
    for dt in cfg.wrench_steps:
        base = BimanualConfig(num_envs=cfg.wrench_envs, seed=cfg.seed)
        decimation = round(base.control_dt / dt)
        env_cfg = nominal(replace(base, dt=dt, decimation=decimation))
        env = BimanualEnv(replace(env_cfg, observations=replace(
            env_cfg.observations, wrench_noise=0.0, wrench_bias=0.0, wrench_bias_walk=0.0)))  # fmt: skip
        expert, readings = ScriptedExpert(env), []

        def act(o, env=env, expert=expert, readings=readings):
            readings.append(env.tcp_wrench().clone())
            return expert(o)

        try:
            success = summarize(run_episodes(act, env, BimanualEvalConfig(cfg.wrench_envs, cfg.seed, False)))["success"]
        finally:
            env.close()
        mean, std = torch.stack(readings).mean((0, 1)), torch.stack(readings).std((0, 1))  # over steps and envs
        rows.append({"dt": dt, "success": success, "mean": mean.tolist(), "std": std.tolist()})
        fmt = lambda v: " ".join(f"{x:.1f}" for x in v.tolist())  # noqa: E731
        table.add_row(f"{dt:g} s", f"{success:.0%}", fmt(mean[0, :3]), fmt(std[0, :3]), fmt(std[0, 3:]))
    console.print(table)
    return {"rows": rows}


def main(cfg: ProbeConfig) -> dict:
    console = make_console()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    out = Path(cfg.out)
    report = {"config": asdict(cfg), "machine": {"cpu_count": os.cpu_count(), "load_avg_start": os.getloadavg(),
              "platform": platform.platform(), "torch_threads": torch.get_num_threads()}}  # fmt: skip
    for m in cfg.measurements:
        t0 = time.perf_counter()
        if m == "slip":
            report[m] = measure_slip(cfg, console)
        elif m == "throughput":
            report[m] = measure_throughput(cfg, console)
        elif m == "camera":
            report[m] = measure_camera(cfg, console, out.parent)
        elif m == "wrench":
            report[m] = measure_wrench(cfg, console)
        else:
            report[m] = measure_setters(cfg, console)
        report[m]["wall_s"] = time.perf_counter() - t0
        report[m]["load_avg_end"] = os.getloadavg()
        write_text_atomic(out, json.dumps(report, indent=2, default=str))
    console.print(f"results in [bold]{out.resolve()}[/]")
    return report


PRESETS = {
    "default": (
        "the issue's four measurements (36-cell slip grid, throughput 16/64/128, camera 16/32, setters) and the wrench",
        ProbeConfig(),
    ),
    "smoke": (
        "tiny: a 2-cell slip grid, 4 envs throughput, 2 envs camera, setters",
        ProbeConfig(
            masses=(0.3,),
            frictions=(0.8,),
            finger_forces=(-2.0, -4.0),
            repeats=1,
            throughput_envs=(4,),
            camera_envs=(2,),
            wrench_envs=2,
            camera_frames=2,
            script=GraspScript(approach_steps=40, hold_steps=10),
            out="outputs/bimanual_probe_smoke.json",
        ),
    ),
}

if __name__ == "__main__":
    run(main, PRESETS, description=__doc__)
