"""Cross-backend check: drive the bicycle model and the Genesis car with the same open-loop commands.

    python -m experiments.research.compare_backends default

Scenarios: straight lines and constant-radius turns at several speeds and frictions, one scenario per env. Reports
per scenario the steady-state speed and turning radius of both backends and how far their trajectories drift apart
(position and heading after 1, 2 and 4 s). In the kinematic regime (low speed, high friction) they should agree
within a few percent; at low friction and high speed the Genesis car slides, and the size of the gap is what the
randomization has to cover. Writes `compare_backends.json` and a trajectory plot.
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
    env: EnvConfig = field(default_factory=lambda: EnvConfig(num_envs=1, physics="genesis"))
    """car spec and substeps (physics is set per backend)"""
    out_dir: str = "outputs/compare_backends"
    """where the JSON and plot go"""


def scenarios(cfg: CompareConfig) -> list[tuple[float, float, float]]:
    return [(v, d, mu) for mu in cfg.frictions for v in cfg.speeds for d in cfg.steering]


def drive(physics, steer: torch.Tensor, speed: torch.Tensor, substeps: int) -> np.ndarray:
    """Run the open-loop commands; returns `(T, N, 5)`: x, y, yaw, speed, yaw rate after every substep."""
    out = []
    for _ in range(substeps):
        s = physics.step(steer, speed)
        out.append(torch.stack([s.x, s.y, s.yaw, s.speed, s.yaw_rate], -1).cpu().numpy())
    return np.stack(out)


def steady_radius(traj: np.ndarray) -> np.ndarray:
    """Turning radius from the last half: speed / |yaw rate| (inf when driving straight)."""
    half = traj[len(traj) // 2 :]
    rate = np.abs(half[..., 4]).mean(0)
    return np.where(rate > 1e-3, half[..., 3].mean(0) / np.maximum(rate, 1e-9), np.inf)


def main(cfg: CompareConfig) -> dict:
    from envs.racing.physics_genesis import GenesisPhysics

    console = make_console()
    plan = scenarios(cfg)
    n = len(plan)
    env_cfg = replace(cfg.env, num_envs=n)
    v = torch.tensor([p[0] for p in plan])
    d = torch.tensor([p[1] for p in plan])
    mu = torch.tensor([p[2] for p in plan])
    steps = int(cfg.seconds / env_cfg.dt_physics)
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
    write_text_atomic(out / "compare_backends.json", json.dumps(rows, indent=2))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 8))
    for i in range(n):
        ax.plot(b[:, i, 0], b[:, i, 1], color="tab:blue", lw=0.7)
        ax.plot(g[:, i, 0], g[:, i, 1], color="tab:red", lw=0.7, ls="--")
    ax.set_aspect("equal")
    ax.set_title("open-loop trajectories: bicycle (blue) vs Genesis (red dashed)")
    fig.savefig(out / "compare_backends.png", dpi=100)
    plt.close(fig)
    console.print(f"results in [bold]{out.resolve()}[/]")
    return {"rows": rows}


PRESETS = {
    "default": ("4 speeds x 4 steering angles x 3 frictions, 6 s", CompareConfig()),
    "smoke": ("two scenarios, 1 s", CompareConfig(speeds=(0.5,), steering=(0.3,), frictions=(1.0,), seconds=1.0)),
}

if __name__ == "__main__":
    run(main, {"racing": PRESETS}, description=__doc__)
