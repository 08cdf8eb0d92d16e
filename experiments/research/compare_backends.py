"""Cross-backend check: drive the bicycle model and the Genesis car with the same open-loop commands.

    python -m experiments.research.compare_backends default

Scenarios: straight lines and constant-radius turns at several speeds and frictions, one scenario per env. Reports
per scenario the steady-state speed and turning radius of both backends and how far their trajectories drift apart
(position and heading after 1, 2 and 4 s). In the kinematic regime (low speed, high friction) they should agree
within a few percent; at low friction and high speed the Genesis car slides, and the size of the gap is what the
randomization has to cover. One more env takes step commands (a speed step from rest, then a steering step once the
speed has settled) and gives each backend's step responses: when the speed, the wheel angle and the yaw rate reach 10,
50 and 90% of their change (ms after the step; no latency or actuation effects on either car). Writes
`compare_backends.json` and a trajectory plot.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from rich.table import Table

from envs.config_io import write_text_atomic
from envs.console import make_console
from envs.racing.config import EnvConfig
from envs.racing.physics_bicycle import BicyclePhysics, CarParams
from experiments.cli import run


@dataclass(frozen=True)
class CompareConfig:
    """Scenarios and duration."""

    speeds: tuple[float, ...] = (0.5, 1.0, 2.0, 3.0)
    """commanded speeds (m/s)"""
    steering: tuple[float, ...] = (0.0, 0.15, 0.3, 0.5)
    """commanded bicycle steering angles (rad)"""
    frictions: tuple[float, ...] = (1.0, 0.5, 0.3)
    """tire-ground friction"""
    seconds: float = 6.0
    """duration of each run"""
    step_speed: float = 1.5
    """the step-response env's speed step from rest at 0.5 s (m/s)"""
    step_steering: float = 0.3
    """its steering step (rad), at 2.5 s"""
    env: EnvConfig = field(default_factory=lambda: EnvConfig(num_envs=1, physics="genesis"))
    """car spec and substeps (physics is set per backend)"""
    out_dir: str = "outputs/compare_backends"
    """where the JSON and plot go"""


def scenarios(cfg: CompareConfig) -> list[tuple[float, float, float]]:
    return [(v, d, mu) for mu in cfg.frictions for v in cfg.speeds for d in cfg.steering]


STEP_TIMES = (0.5, 2.5)
"""when the step-response env's speed and steering steps come (s)"""


def drive(physics, steer: torch.Tensor, speed: torch.Tensor, substeps: int) -> np.ndarray:
    """Run the open-loop commands (`(N,)` held, or `(T, N)` per substep); returns `(T, N, 6)`: x, y, yaw, speed, yaw
    rate and wheel angle after every substep."""
    out = []
    for k in range(substeps):
        s = physics.step(steer if steer.dim() == 1 else steer[k], speed if speed.dim() == 1 else speed[k])
        out.append(torch.stack([s.x, s.y, s.yaw, s.speed, s.yaw_rate, s.steer], -1).cpu().numpy())
    return np.stack(out)


def rise_times(signal: np.ndarray, start: int, dt: float, levels=(0.1, 0.5, 0.9)) -> list[float]:
    """Milliseconds after substep `start` until `signal` `(T,)` first covers each level of its change from the value
    before the step to its mean over the last tenth (nan where it never does)."""
    before, after = signal[start - 1], signal[-max(1, len(signal) // 10) :].mean()
    if after == before:
        return [float("nan")] * len(levels)
    share = (signal[start:] - before) / (after - before)
    return [float((np.argmax(share >= q) + 1) * dt * 1000) if (share >= q).any() else float("nan") for q in levels]


def steady_radius(traj: np.ndarray) -> np.ndarray:
    """Turning radius from the last half: speed / |yaw rate| (inf when driving straight)."""
    half = traj[len(traj) // 2 :]
    rate = np.abs(half[..., 4]).mean(0)
    return np.where(rate > 1e-3, half[..., 3].mean(0) / np.maximum(rate, 1e-9), np.inf)


def main(cfg: CompareConfig) -> dict:
    from envs.racing.physics_genesis import GenesisPhysics

    console = make_console()
    plan = scenarios(cfg)
    n = len(plan) + 1  # the last env: the step responses
    env_cfg = replace(cfg.env, num_envs=n)
    mu = torch.tensor([p[2] for p in plan] + [1.0])
    steps = max(int(cfg.seconds / env_cfg.dt_physics), int((STEP_TIMES[1] + 1.0) / env_cfg.dt_physics))
    t = torch.arange(steps)[:, None] * env_cfg.dt_physics
    v = torch.tensor([p[0] for p in plan] + [0.0]).repeat(steps, 1)
    d = torch.tensor([p[1] for p in plan] + [0.0]).repeat(steps, 1)
    v[:, -1] = torch.where(t[:, 0] >= STEP_TIMES[0], cfg.step_speed, 0.0)
    d[:, -1] = torch.where(t[:, 0] >= STEP_TIMES[1], cfg.step_steering, 0.0)
    ids = torch.arange(n)
    params = CarParams.nominal(n)
    params.friction.copy_(mu)
    results = {}
    for name in ("bicycle", "genesis"):
        phys = (
            BicyclePhysics(n, env_cfg.car, env_cfg.dt_physics)
            if name == "bicycle"
            else GenesisPhysics(env_cfg, torch.device("cpu"))
        )
        zero = torch.zeros(n)
        phys.reset(ids, zero, zero, zero, zero)
        phys.set_params(params, ids)
        results[name] = drive(phys, d, v, steps)
    b, g = results["bicycle"], results["genesis"]
    steps_out = step_table(results, env_cfg.dt_physics, console)
    rows = []
    for i, (speed, steer, friction) in enumerate(plan):
        row = {"speed_cmd": speed, "steer_cmd": steer, "friction": friction}
        for name, tr in results.items():
            row[f"{name}_speed"] = float(tr[len(tr) // 2 :, i, 3].mean())
            row[f"{name}_radius"] = float(steady_radius(tr[:, i : i + 1])[0])
        for t in (1.0, 2.0, 4.0):
            k = min(int(t / env_cfg.dt_physics), steps) - 1
            row[f"pos_gap_{t:g}s"] = float(np.hypot(*(b[k, i, :2] - g[k, i, :2])))
            row[f"heading_gap_{t:g}s"] = float(abs(math.remainder(b[k, i, 2] - g[k, i, 2], 2 * math.pi)))
        if steer > 0:
            row["radius_rel_diff"] = row["genesis_radius"] / row["bicycle_radius"] - 1.0
            lat = row["genesis_speed"] ** 2 / row["genesis_radius"]
            row["genesis_slides"] = bool(lat < 0.95 * speed**2 / (env_cfg.car.wheelbase / math.tan(steer)))
        row["speed_rel_diff"] = row["genesis_speed"] / max(row["bicycle_speed"], 1e-6) - 1.0
        rows.append(row)
    table = Table(title="bicycle vs Genesis, open loop")
    for col in ("v", "δ", "μ", "speed b/g", "radius b/g", "radius diff", "pos gap 2 s", "slides"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            f"{r['speed_cmd']:.1f}", f"{r['steer_cmd']:.2f}", f"{r['friction']:.1f}",
            f"{r['bicycle_speed']:.2f}/{r['genesis_speed']:.2f}",
            f"{r['bicycle_radius']:.2f}/{r['genesis_radius']:.2f}",
            f"{r.get('radius_rel_diff', float('nan')):+.1%}", f"{r['pos_gap_2s']:.2f}",
            str(r.get("genesis_slides", "")),
        )  # fmt: skip
    console.print(table)
    out = Path(cfg.out_dir)
    write_text_atomic(out / "compare_backends.json", json.dumps({"scenarios": rows, "steps": steps_out}, indent=2))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 8))
    for i in range(n - 1):
        ax.plot(b[:, i, 0], b[:, i, 1], color="tab:blue", lw=0.7)
        ax.plot(g[:, i, 0], g[:, i, 1], color="tab:red", lw=0.7, ls="--")
    ax.set_aspect("equal")
    ax.set_title("open-loop trajectories: bicycle (blue) vs Genesis (red dashed)")
    fig.savefig(out / "compare_backends.png", dpi=100)
    plt.close(fig)
    console.print(f"results in [bold]{out.resolve()}[/]")
    return {"rows": rows, "steps": steps_out}


def step_table(results: dict[str, np.ndarray], dt: float, console) -> dict[str, dict[str, list[float]]]:
    """Rise times of the step-response env (the last) per backend and channel; printed as a table."""
    speed_at, steer_at = (round(s / dt) for s in STEP_TIMES)
    channels = {"speed": (3, speed_at, steer_at), "wheel angle": (5, steer_at, None), "yaw rate": (4, steer_at, None)}
    out = {name: {ch: rise_times(tr[start - 1 : end, -1, col], 1, dt) for ch, (col, start, end) in channels.items()}
           for name, tr in results.items()}  # fmt: skip
    table = Table(title="step responses: ms to 10 / 50 / 90% of the change")
    for col in ("channel", *results):
        table.add_column(col)
    for ch in channels:
        table.add_row(ch, *(" / ".join(f"{x:.0f}" for x in out[name][ch]) for name in results))
    console.print(table)
    return out


PRESETS = {
    "default": ("4 speeds x 4 steering angles x 3 frictions, 6 s", CompareConfig()),
    "smoke": ("two scenarios, 1 s", CompareConfig(speeds=(0.5,), steering=(0.3,), frictions=(1.0,), seconds=1.0)),
}

if __name__ == "__main__":
    run(main, {"racing": PRESETS}, description=__doc__)
