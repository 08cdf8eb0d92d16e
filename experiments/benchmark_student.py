"""Student compute: DAgger training windows per second and deployment-step frames per second, per architecture.

    python -m experiments.benchmark_student default     # writes outputs/benchmark_student.json
    python -m experiments.benchmark_student default --device cuda --variants default

Times `train_step` (augmentation, forward over `context + labels_per_window` frames with the context encoded without
gradients and the encoder's gradient through every `--dagger.cnn-grad-stride`-th supervised frame, losses, backward,
Adam) on synthetic windows shaped like DAgger's, and `StudentModel.step` on a batch of
cars, for each variant: the default student, the motion encoder, a TCN over 61 steps, and the GRU. The figures tell
what an architecture choice costs a DAgger round; the whole-run time also includes collection and evaluation.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from rich.table import Table

from adaptation.history_encoder import HistoryConfig
from envs.augment import AugmentConfig, augment
from envs.config_io import write_text_atomic
from envs.console import make_console
from envs.errors import ConfigError, check_range
from envs.machine import check_device, machine, synchronize
from envs.task import get_task
from envs.vehicle import VEHICLE_ESTIMATES
from experiments.cli import run
from student.dagger import DaggerConfig, train_step
from student.model import OutputSpec, StudentConfig, StudentModel
from student.networks import EncoderConfig

VARIANTS: dict[str, StudentConfig] = {
    "default": StudentConfig(),
    "motion-encoder": StudentConfig(encoder=EncoderConfig(motion=True)),
    "tcn-61-steps": StudentConfig(history=HistoryConfig(dilations=(1, 2, 4, 8))),
    "gru-history": StudentConfig(history=HistoryConfig(kind="gru")),
}
"""student architectures to time"""
SPEC = OutputSpec(
    "discrete", 10, 8, get_task("racing").estimates, {"action_latency": 7, "camera_latency": 5}, 2, "racing"
)


@dataclass(frozen=True)
class StudentBenchConfig:
    """Variants, batch shapes and repetitions."""

    variants: tuple[str, ...] = tuple(VARIANTS)
    """architectures to time (see VARIANTS)"""
    dagger: DaggerConfig = field(default_factory=DaggerConfig)
    """training batch shape (batch_windows, labels_per_window) and precision, as in DAgger"""
    train_steps: int = 20
    """timed training steps per variant (after 2 untimed)"""
    step_envs: int = 32
    """cars in the timed deployment step"""
    step_calls: int = 50
    """timed deployment steps per variant"""
    device: str = "cpu"
    """torch device of the model, the batches and the deployment step (e.g. cuda)"""
    out: str = "outputs/benchmark_student.json"
    """JSON output"""

    def __post_init__(self) -> None:
        unknown = [v for v in self.variants if v not in VARIANTS]
        if unknown:
            raise ConfigError(f"unknown variants {unknown}; known: {sorted(VARIANTS)}")
        check_range("train_steps", self.train_steps, 1, 100_000)
        check_range("step_envs", self.step_envs, 1, 100_000)
        check_range("step_calls", self.step_calls, 1, 100_000)


def synthetic_batch(cfg: StudentConfig, dagger: DaggerConfig, rng: np.random.Generator) -> dict[str, np.ndarray]:
    b, t = dagger.batch_windows, cfg.context + dagger.labels_per_window
    return {
        "camera": rng.integers(0, 256, size=(b, t, 1, 120, 160), dtype=np.uint8),
        "prev_action": rng.uniform(-1, 1, size=(b, t, 2)).astype(np.float32),
        "teacher_logits": rng.normal(size=(b, t, SPEC.num_outputs)).astype(np.float32),
        "z": rng.uniform(-1, 1, size=(b, t, SPEC.latent_dim)).astype(np.float32),
        "targets": np.abs(rng.normal(1.0, 0.2, size=(b, t, len(VEHICLE_ESTIMATES.targets)))).astype(np.float32) * 0.05,
        "mask": np.ones((b, t), dtype=bool),
    }


def measure(name: str, cfg: StudentBenchConfig) -> dict:
    torch.manual_seed(0)
    student = VARIANTS[name]
    device = torch.device(cfg.device)
    model = StudentModel(student, SPEC).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.dagger.learning_rate)
    gen, rng = torch.Generator(device=device).manual_seed(1), np.random.default_rng(0)
    batch = synthetic_batch(student, cfg.dagger, rng)
    aug = AugmentConfig()
    step = lambda: train_step(model, optimizer, batch, cfg.dagger, 1 / 60, lambda x: augment(x, aug, gen))  # noqa: E731
    for _ in range(2):
        step()
    t0 = time.perf_counter()
    for _ in range(cfg.train_steps):
        step()
    train_s = (time.perf_counter() - t0) / cfg.train_steps
    model.eval()
    state = model.init_state(cfg.step_envs, device)
    camera = torch.randint(0, 256, (cfg.step_envs, 1, 120, 160), dtype=torch.uint8, device=device)
    prev = torch.zeros(cfg.step_envs, 2, device=device)
    with torch.no_grad():
        model.step(camera, prev, state)
        synchronize(device)
        t0 = time.perf_counter()
        for _ in range(cfg.step_calls):
            _, _, state = model.step(camera, prev, state)
        synchronize(device)
        step_s = (time.perf_counter() - t0) / cfg.step_calls
    window = batch["camera"].shape[1]
    return {
        "variant": name,
        "window_frames": window,
        "train_step_ms": 1000 * train_s,
        "train_windows_per_s": cfg.dagger.batch_windows / train_s,
        "train_frames_per_s": cfg.dagger.batch_windows * window / train_s,
        "deploy_frames_per_s": cfg.step_envs / step_s,
        "state_floats_per_car": int(state[0].numel()),
        "parameters": sum(p.numel() for p in model.parameters()),
    }


def main(cfg: StudentBenchConfig) -> dict:
    check_device(cfg.device)
    console = make_console()
    info = machine()  # the load average before the measurements
    rows = [measure(name, cfg) for name in cfg.variants]
    base = next((r for r in rows if r["variant"] == "default"), rows[0])
    for r in rows:
        r["train_step_vs_first"] = r["train_step_ms"] / base["train_step_ms"]
    table = Table(title=f"student compute ({cfg.dagger.batch_windows} windows per step, {cfg.step_envs} cars)")
    for col in ("variant", "window", "train step ms", f"× {base['variant']}", "deploy frames/s", "state floats"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["variant"], str(r["window_frames"]), f"{r['train_step_ms']:.0f}",
                      f"{r['train_step_vs_first']:.2f}", f"{r['deploy_frames_per_s']:.0f}",
                      str(r["state_floats_per_car"]))  # fmt: skip
    console.print(table)
    shape = {"batch_windows": cfg.dagger.batch_windows, "labels_per_window": cfg.dagger.labels_per_window}
    result = {"results": rows, "machine": info, "device": cfg.device, "dagger": shape}
    write_text_atomic(cfg.out, json.dumps(result, indent=2))
    console.print(f"results in [bold]{cfg.out}[/]")
    return result


PRESETS = {
    "default": ("every variant, DAgger's batch shape, 20 timed training steps", StudentBenchConfig()),
    "smoke": (
        "two variants, tiny batches",
        StudentBenchConfig(
            variants=("default", "motion-encoder"),
            dagger=replace(DaggerConfig(), batch_windows=1, labels_per_window=2),
            train_steps=1,
            step_envs=2,
            step_calls=2,
        ),
    ),
}

if __name__ == "__main__":
    run(main, {"racing": PRESETS}, description=__doc__)
