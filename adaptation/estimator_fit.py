"""Fit a student's factor estimator on a run's recorded episodes.

During DAgger the estimator trains on the same few windows per gradient step as the policy, far less than it needs: its
inputs are five numbers per step, so once the history encoder is trained, the estimator can be fitted to every recorded
episode at little cost. `episode_inputs` runs the (frozen) student over each recorded episode from its start, exactly as
it runs on the car, and keeps the estimator's inputs and the true factors; `fit_estimator` trains the estimator alone on
random windows of them, holding out every `holdout_every`-th episode to report what it does on episodes it never saw.

A run records a few hundred episodes, one world (one friction, one motor gain) each: too few labels for the slow
factors, which an estimator then learns per episode and not from the car's response.
`adaptation.simulated_worlds.simulated_inputs` adds as many worlds as wanted at little cost: the teacher drives the
training world without a camera, blind to the factors the student cannot see, and the estimator's motion inputs are the
true body velocities passed through the student's own errors (`MotionErrors`, measured on its replay: the linear map
from truth and recent commands to estimate, plus whole residual sequences of recorded episodes, so the errors keep their
correlation in time and across the three velocities). They are off by default: on a default-teacher student they made
the fit worse on its held-out recorded episodes, because the real errors depend on the world and the driving in ways
the model does not carry (docs/results.md#estimates). `estimate_sources` shows why the slow factors stay hidden: the
motion estimates follow the commands more than the car.

Planar odometry's errors are another matter: they do not depend on the commands, and `odometry_errors` measures them
where the truth is known (a drive of the camera env, the camera's pose change beside the tracked one).
`with_odometry_errors` gives simulated worlds with exact odometry those errors, so that an estimator trained on them
reads measured odometry, which one trained on exact odometry does poorly (it never saw the errors;
`experiments.research.probe_motion --sim-motion noisy_odometry`). For such an estimator
`adaptation.simulated_worlds.simulated_inputs(..., camera=True)` lets the student drive the worlds through its camera,
so the estimator learns from the driving it reads online, not the teacher's (`experiments.fit_estimator odometry`;
its figures in docs/results.md#odometry-fed-estimator).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

from adaptation.factor_estimator import FACTORS, MOTION, FactorEstimator, normalize_velocities
from adaptation.losses import expected_class, latency_class, r2_score
from datasets.rollouts import read_shards
from envs.vehicle import VEHICLE_ESTIMATES


@dataclass
class EpisodeInputs:
    """Flat rows of all recorded episodes (each episode's rows contiguous, in step order)."""

    inputs: Tensor  # (M, 5) the estimator's inputs
    targets: Tensor  # (M, len(VEHICLE_ESTIMATES.targets))
    episode: Tensor  # (M,) episode id
    step: Tensor  # (M,) step within the episode

    @staticmethod
    def cat(parts: list[EpisodeInputs]) -> EpisodeInputs:
        """The rows of `parts` one after another (their episode ids must differ)."""
        return EpisodeInputs(*(torch.cat([getattr(p, k) for p in parts]) for k in EPISODE_FIELDS))

    def with_motion(self, motion: Tensor) -> EpisodeInputs:
        """The same rows with `motion` `(M, 3)` (normalized) as the motion inputs."""
        return EpisodeInputs(torch.cat([self.inputs[:, :2], motion], -1), self.targets, self.episode, self.step)


@dataclass
class ReplayBatch:
    """Recorded episodes of one shard run through the student together, left-padded to a common length."""

    cols: dict[str, np.ndarray]  # the shard's fields
    spans: list[tuple[int, int]]  # each episode's rows [a, b) in `cols`; row i of the batch is episode i
    prev_action: Tensor  # (B, T, 2), zero where padded
    mask: Tensor  # (B, T) True on the episode's steps
    heads: dict[str, Tensor]  # the student's heads (float32)

    def unpad(self, x: Tensor) -> list[Tensor]:
        """Per episode, the rows of `x` (B, T, ...) that hold its steps, in step order."""
        t = x.shape[1]
        return [x[row, t - (b - a) :] for row, (a, b) in enumerate(self.spans)]


@torch.no_grad()
def replay_episodes(
    model, data_dir: str | Path, fields: tuple[str, ...] = (), batch_frames: int = 4096, bf16: bool = False
) -> Iterator[ReplayBatch]:
    """Run the (frozen, eval-mode) student over every episode of the run's finished shards from its start, exactly as
    it runs on the car, one shard in memory at a time.

    Episodes of a shard are padded to a common length on the left (padding is masked, as at an episode start) and run
    through `model.forward_window` in batches of about `batch_frames` frames; `bf16` runs it under bfloat16 autocast,
    as DAgger trains (faster where the CPU has native bf16; outputs within a few thousandths of the float32 pass).
    `fields` are read besides the camera, previous actions and episode ids."""
    was_training = model.training
    model.eval()
    try:
        for cols in read_shards(data_dir, tuple(dict.fromkeys(("camera", "prev_action", "episode", *fields)))):
            n = len(cols["episode"])
            if n == 0:
                continue
            starts = np.flatnonzero(np.r_[True, cols["episode"][1:] != cols["episode"][:-1]])
            ends = np.r_[starts[1:], n]
            order = np.argsort(ends - starts)  # similar lengths batch together: little padding
            i = 0
            while i < len(order):
                longest = int(max(ends[order[i]] - starts[order[i]], 1))
                j = i + max(1, batch_frames // longest)
                group = order[i:j]
                longest = int((ends[group] - starts[group]).max())
                spans = [(int(starts[e]), int(ends[e])) for e in group]
                # raw uint8 frames, scaled inside the encoder as on the car (a quarter of the memory traffic)
                cam = torch.zeros(len(group), longest, 1, *cols["camera"].shape[-2:], dtype=torch.uint8)
                prev = torch.zeros(len(group), longest, cols["prev_action"].shape[-1])
                mask = torch.zeros(len(group), longest, dtype=torch.bool)
                for row, (a, b) in enumerate(spans):
                    cam[row, longest - (b - a) :] = torch.from_numpy(cols["camera"][a:b])
                    prev[row, longest - (b - a) :] = torch.from_numpy(cols["prev_action"][a:b])
                    mask[row, longest - (b - a) :] = True
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    _, heads = model.forward_window(cam, prev, mask)
                yield ReplayBatch(cols, spans, prev, mask, {k: v.float() for k, v in heads.items()})
                i = j
    finally:
        model.train(was_training)


def episode_inputs(model, data_dir: str | Path, batch_frames: int = 4096, bf16: bool = False) -> EpisodeInputs:
    """The estimator's inputs over every episode in the run's finished shards (`replay_episodes`), with the true
    targets, episode ids and steps."""
    out: dict[str, list[Tensor]] = {"inputs": [], "targets": [], "episode": [], "step": []}
    for batch in replay_episodes(model, data_dir, ("targets", "step"), batch_frames, bf16):
        x = FactorEstimator.inputs(batch.prev_action, batch.heads["estimates"])
        out["inputs"].extend(v.float() for v in batch.unpad(x))
        for a, b in batch.spans:
            for k in ("targets", "episode", "step"):
                out[k].append(torch.from_numpy(np.asarray(batch.cols[k][a:b])))
    if not out["inputs"]:
        raise ValueError(f"{data_dir}: no recorded episodes in the finished shards")
    return EpisodeInputs(*(torch.cat(out[k]) for k in ("inputs", "targets", "episode", "step")))


EPISODE_FIELDS = ("inputs", "targets", "episode", "step")


def normalized_motion(targets: Tensor) -> Tensor:
    """The true body velocities `(..., 3)` of `targets`, normalized as the history encoder estimates them."""
    return normalize_velocities(targets[..., [VEHICLE_ESTIMATES.column(n) for n in MOTION]])


def episode_spans(episode: Tensor) -> list[tuple[int, int]]:
    """`[a, b)` row ranges of the contiguous episodes in `episode`."""
    cut = torch.nonzero(episode[1:] != episode[:-1])[:, 0] + 1
    bounds = [0, *cut.tolist(), len(episode)]
    return list(itertools.pairwise(bounds))


COMMAND_LAGS = 8
"""`MotionErrors` regresses the estimates on the previous actions of this many steps as well as on the truth"""


def motion_design(truth: Tensor, prev_action: Tensor, step: Tensor, lags: int = COMMAND_LAGS) -> Tensor:
    """Regressors of a student's motion estimates `(N, 1 + 3 + 2 * lags)`: a constant, the true (normalized) body
    velocities, and the previous actions of the last `lags` steps of the same episode (zeros before its start, as a
    reset leaves them). Rows are grouped by episode in step order, `step` counting from each episode's start."""
    cols = [torch.ones(len(truth), 1, dtype=truth.dtype), truth]
    for k in range(lags):
        lagged = torch.roll(prev_action.to(truth.dtype), k, 0)
        cols.append(lagged * (step >= k).to(truth.dtype)[:, None])
    return torch.cat(cols, -1)


@dataclass
class MotionErrors:
    """How a student's motion estimates err (normalized units): estimate = `motion_design(...) @ weights` + residual,
    the residuals of every recorded episode kept whole, from its start, in step order. The estimates lean on the
    commands as well as on the car's true motion (a camera student learns what its commands predict), so the linear
    part reads both."""

    weights: Tensor  # (1 + 3 + 2 * lags, 3)
    residuals: list[Tensor]  # per recorded episode, (T_e, 3)

    @property
    def lags(self) -> int:
        return (self.weights.shape[0] - 4) // 2

    def predict(self, truth: Tensor, prev_action: Tensor, step: Tensor) -> Tensor:
        """The linear part of the estimates `(N, 3)` for true (normalized) velocities and commands."""
        return (motion_design(truth.double(), prev_action, step, self.lags) @ self.weights.double()).float()

    def sample(self, length: int, generator: torch.Generator, under_way: int = 30) -> Tensor:
        """A residual sequence `(length, 3)` for an episode from its start: one recorded episode's from its start,
        continued (where it is shorter) by other episodes' residuals from `under_way` steps on, so the errors after
        a reset look like the errors after a reset."""

        def pick() -> Tensor:
            return self.residuals[int(torch.randint(len(self.residuals), (1,), generator=generator))]

        parts = [pick()]
        total = len(parts[0])
        while total < length:
            more = pick()
            parts.append(more[min(under_way, len(more) - 1) :])
            total += len(parts[-1])
        return torch.cat(parts)[:length]


def motion_errors(data: EpisodeInputs, lags: int = COMMAND_LAGS) -> MotionErrors:
    """Fit `MotionErrors` to the student's estimates (`data.inputs[:, 2:]`): least squares on the truth and the last
    `lags` commands, per velocity (0 lags: truth only, the gain then says how much the estimates shrink)."""
    est = data.inputs[:, 2:].double()
    design = motion_design(normalized_motion(data.targets).double(), data.inputs[:, :2], data.step, lags)
    weights = torch.linalg.lstsq(design, est).solution
    res = (est - design @ weights).float()
    return MotionErrors(weights.float(), [res[a:b] for a, b in episode_spans(data.episode) if b - a > 0])


def odometry_errors(measured: Tensor, exact: Tensor, episode: Tensor, step: Tensor) -> MotionErrors:
    """How planar odometry errs, from a drive on which the camera's true pose change is known
    (`adaptation.odometry_errors.record_drive`): `measured` and `exact` are normalized body velocities `(N, 3)`
    (rows grouped by episode in step order); measured = `[1, exact] @ weights` + residual, least squares over the rows
    with a frame before them (step > 0), each episode's residuals kept whole from its start. Applied to exact
    odometry by `with_odometry_errors` (no command terms: the odometry never sees the commands)."""
    live = step > 0
    if int(live.sum()) < 4:
        raise ValueError(f"odometry_errors: {int(live.sum())} rows with a frame before them, need 4 or more")
    design = torch.cat([torch.ones(len(exact), 1, dtype=torch.float64), exact.double()], -1)
    weights = torch.linalg.lstsq(design[live], measured.double()[live]).solution
    res = ((measured.double() - design @ weights) * live.double()[:, None]).float()
    return MotionErrors(weights.float(), [res[a:b] for a, b in episode_spans(episode) if b - a > 1])


def with_odometry_errors(
    data: EpisodeInputs, errors: MotionErrors, seed: int = 0, under_way: int = 10
) -> EpisodeInputs:
    """`data` whose motion inputs are exact odometry (`simulated_inputs` without errors) with `errors`
    (`odometry_errors`, no command lags) applied: the linear part row by row and one residual sequence per episode
    (`MotionErrors.sample`), zeros at each episode's first step as the tracker reports them."""
    if errors.lags != 0:
        raise ValueError(f"with_odometry_errors: errors with {errors.lags} command lags (odometry errors have none)")
    motion = errors.predict(data.inputs[:, 2:], data.inputs[:, :2], data.step)
    gen = torch.Generator().manual_seed(seed)
    for a, b in episode_spans(data.episode):
        motion[a:b] += errors.sample(b - a, gen, under_way=under_way)
    return data.with_motion(motion * (data.step > 0).float()[:, None])


def estimate_sources(data: EpisodeInputs, after_steps: int = 30, lags: int = COMMAND_LAGS) -> dict[str, float]:
    """What a student's motion estimates follow: R^2 of each estimate (speed, lateral speed, yaw rate) from a linear
    fit on the true velocities (`truth/…`), on its last `lags` commands (`commands/…`), and on both (`both/…`), over
    the steps from `after_steps` on. An estimate the commands explain as well as the truth does carries little of
    the car's actual response: the friction and motor gain cannot show through it."""
    est = data.inputs[:, 2:].double()
    design = motion_design(normalized_motion(data.targets).double(), data.inputs[:, :2], data.step, lags)
    rows = data.step >= after_steps
    parts = {"truth": slice(0, 4), "commands": [0, *range(4, design.shape[1])], "both": slice(None)}
    if int(rows.sum()) <= design.shape[1]:  # too few steps that long after a start to fit
        return {f"{part}/{name}": float("nan") for part in parts for name in MOTION}
    out = {}
    for part, cols in parts.items():
        x, y = design[rows][:, cols], est[rows]
        res = y - x @ torch.linalg.lstsq(x, y).solution
        r2 = 1.0 - res.var(0) / y.var(0).clamp(min=1e-12)
        out.update({f"{part}/{name}": float(v) for name, v in zip(MOTION, r2, strict=True)})
    return out


def _windows(data: EpisodeInputs, ends: Tensor, length: int) -> tuple[Tensor, Tensor, Tensor]:
    """Windows of `length` rows ending at `ends`; rows of another episode are masked (and zeroed)."""
    idx = ends[:, None] - torch.arange(length - 1, -1, -1)[None, :]
    valid = idx >= 0
    idx = idx.clamp(min=0)
    mask = valid & (data.episode[idx] == data.episode[ends][:, None])
    x = data.inputs[idx] * mask.unsqueeze(-1)
    return x, data.targets[idx], mask


def _losses(heads: dict[str, Tensor], targets: Tensor, weights: Tensor, dt_physics: float) -> Tensor:
    denom = weights.sum().clamp(min=1.0)

    def ce(logits: Tensor, column: int) -> Tensor:
        cls = latency_class(targets[..., column], dt_physics, logits.shape[-1])
        flat = rearrange(logits, "b t k -> (b t) k"), rearrange(cls, "b t -> (b t)")
        return (F.cross_entropy(*flat, reduction="none") * rearrange(weights, "b t -> (b t)")).sum()

    spec = VEHICLE_ESTIMATES
    factors = torch.stack([(targets[..., spec.column(n)] - spec.scale[n][0]) / spec.scale[n][1] for n in FACTORS], -1)
    mse = ((heads["factors"] - factors).square().mean(-1) * weights).sum()
    return (ce(heads["action_latency_logits"], 0) + ce(heads["camera_latency_logits"], 1) + mse) / denom


SCORES = ("action_latency_r2", "loop_latency_r2", *(f"{name}_r2" for name in FACTORS))


@torch.no_grad()
def score(
    estimator: FactorEstimator, data: EpisodeInputs, rows: Tensor, dt_physics: float, min_step: int | None = None
) -> dict[str, float]:
    """R^2 of the expected action and loop latency (in substeps) and of friction and motor gain, on `rows`, each
    output taken from step `min_step` of its episode on (default: once the episode has run the estimator's receptive
    field; earlier outputs read the zeros a reset leaves, as on the car)."""
    ctx = estimator.cfg.receptive_field
    ends = rows[data.step[rows] >= (ctx - 1 if min_step is None else min_step)]
    if len(ends) == 0:  # no episode that long
        return {k: float("nan") for k in SCORES}
    preds = []
    for chunk in torch.split(ends, 8192):
        x, _, mask = _windows(data, chunk, ctx)
        heads = estimator(x, mask)
        preds.append({k: v[:, -1] for k, v in heads.items()})
    heads = {k: torch.cat([p[k] for p in preds]) for k in preds[0]}
    t = data.targets[ends]
    act = latency_class(t[:, 0], dt_physics, heads["action_latency_logits"].shape[-1]).float()
    cam = latency_class(t[:, 1], dt_physics, heads["camera_latency_logits"].shape[-1]).float()
    e_act, e_cam = expected_class(heads["action_latency_logits"]), expected_class(heads["camera_latency_logits"])
    out = {"action_latency_r2": r2_score(e_act, act), "loop_latency_r2": r2_score(e_act + e_cam, act + cam)}
    for i, name in enumerate(FACTORS):
        centre, scale = VEHICLE_ESTIMATES.scale[name]
        out[f"{name}_r2"] = r2_score(heads["factors"][:, i] * scale + centre, t[:, VEHICLE_ESTIMATES.column(name)])
    return out


def fit_estimator(
    estimator: FactorEstimator,
    data: EpisodeInputs,
    dt_physics: float,
    steps: int = 4000,
    batch: int = 32,
    window: int = 64,
    learning_rate: float = 3e-3,
    holdout_every: int = 10,
    seed: int = 0,
    simulated: EpisodeInputs | None = None,
    after_steps: int = 30,
    progress: Callable[[int, float], None] | None = None,
    progress_every: int = 1000,
) -> dict[str, float]:
    """Train `estimator` (only) on random windows of the recorded episodes, and of `simulated` ones (every one of
    them trains; episode ids distinct from the recorded ones); every `holdout_every`-th recorded episode is held out.
    `window` grows to cover the receptive field. Returns the scores on the training and held-out recorded episodes
    (`train/…`, `heldout/…`: once the receptive field is full; `heldout_after/…`: every output from `after_steps`
    on, 2 s at 15 Hz, as the evaluation's time bins count them)."""
    gen = torch.Generator().manual_seed(seed)
    held = (data.episode % holdout_every) == 0
    train_rows = torch.nonzero(~held)[:, 0]
    recorded = data
    if simulated is not None:
        if bool(torch.isin(simulated.episode, data.episode).any()):
            raise ValueError("simulated episode ids overlap the recorded ones")
        data = EpisodeInputs.cat([data, simulated])
        train_rows = torch.cat([train_rows, torch.arange(len(recorded.episode), len(data.episode))])
    if len(train_rows) == 0:
        raise ValueError("no episodes left to fit the factor estimator on")
    ctx = estimator.cfg.receptive_field - 1
    window = max(window, ctx + 32)
    opt = torch.optim.Adam(estimator.parameters(), lr=learning_rate)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps, eta_min=0.1 * learning_rate)
    was_training = estimator.training
    estimator.train()
    pos = torch.arange(window)[None, :]
    running, since = 0.0, 0
    for i in range(steps):
        ends = train_rows[torch.randint(0, len(train_rows), (batch,), generator=gen)]
        x, targets, mask = _windows(data, ends, window)
        # a position carries a loss once its receptive field lies inside the window, or from its episode start on
        weights = (mask & ((pos >= ctx) | ~mask[:, :1])).float()
        loss = _losses(estimator(x, mask), targets, weights, dt_physics)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        running, since = running + float(loss.detach()), since + 1
        if progress is not None and ((i + 1) % progress_every == 0 or i + 1 == steps):
            progress(i + 1, running / since)
            running, since = 0.0, 0
    estimator.train(was_training)
    recorded_train = torch.nonzero(~held)[:, 0]
    out = {f"train/{k}": v for k, v in score(estimator, recorded, recorded_train, dt_physics).items()}
    held_rows = torch.nonzero(held)[:, 0]
    out.update({f"heldout/{k}": v for k, v in score(estimator, recorded, held_rows, dt_physics).items()})
    after = score(estimator, recorded, held_rows, dt_physics, min_step=after_steps)
    out.update({f"heldout_after/{k}": v for k, v in after.items()})
    out["episodes"] = float(len(torch.unique(recorded.episode)))
    if simulated is not None:
        out["simulated_episodes"] = float(len(torch.unique(simulated.episode)))
    return out
