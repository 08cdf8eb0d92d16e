"""Real-to-sim dynamics calibration: the sim parameters whose response to a logged command sequence matches the
car's logged motion.

The model (`envs.racing.fit_rollout`) is the training sim's own: the actuation effects' command map (steering
deadband, throttle exponent), the action delay (an integer number of physics substeps), the servo slew rate, the
per-car gains and trim (`actuator_targets`) and the bicycle model (`bicycle_step`), its servo and drivetrain lags,
tyre cornering stiffness and acceleration and braking limits taken per parameter set. A car that is not a bicycle
model (the proxy's contact-wheel car, a real one) needs two terms more, which the training sim lacks and the fit
reports without writing (`NUISANCE`): a drivetrain that holds its wheels' speed through a turn (`fit_step`) and a
steering whose wheel angle grows faster than linearly with the command. With their nominal values the model is the
training sim exactly. The gains stay apart from them because the protocol drives each steering angle at two speeds and
each speed straight and in turns: the gains are what the straight runs and small angles show, the extra terms what
only turns and large angles add. Held commands where the car slides irregularly (beyond its grip limit) are left out
(`check_drive`).
It is rolled out over short windows of the log, each started from the motion measured at its first frame and run
through a burn-in before its frame-to-frame motions (forward, left, yaw change, as the planar odometry measures them)
are compared with the log's, so thousands of windows and parameter sets go in one batch.

What enters the comparison is the loop latency: the frames lag the car by the camera latency and the car lags the
commands by the action latency, so a log of commands and frames shows their sum only. The fit:

1. Adam through the rollout (torch autograd) for the smooth parameters (gains, trim, throttle exponent, the two
   lags, the servo slew rate, battery sag, grip where the drive reaches it, the tyre and drivetrain terms), at every
   candidate loop latency at once, from a few random restarts;
2. Adam again at the best few latencies, with bootstrap replicas of the log (windows drawn with replacement) beside
   the full log, so each replica picks its own latency and parameters;
3. CMA-ES (`cma`) for what has no gradient (the steering deadband) together with what it trades against (trim,
   steering gain), one instance per replica, all instances' candidates in one batched rollout.

Each parameter's uncertainty is its spread over the replicas. The fit is refused as unconverged when the restarts
disagree, the latency sits at the edge of the search, or the residual stays above `max_residual`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from envs.errors import GapbridgeError, check_range
from envs.param_fit import adam_fit, block_bootstrap_weights, cma_fit
from envs.racing.calibration_drive import DriveLog
from envs.racing.car import CarSpec
from envs.racing.fit_rollout import MOTION_SCALE, PARAMS, SPEC_FIELDS, Windows, make_windows, rollout, window_losses

SMOOTH = ("motor_gain", "motor_time_constant", "throttle_exponent", "steering_gain", "steering_offset_deg",
          "steering_time_constant", "friction", "servo_slew", "battery_sag_per_minute", "cornering_stiffness",
          "max_accel", "max_brake", "turn_drag", "steering_cubic")  # fmt: skip
NUISANCE = ("turn_drag", "steering_cubic")
"""fitted terms the training sim does not have (reported, never written): the share of the turn's drag on the speed
(1 = the bicycle model's) and the steering's cubic term (wheel angle = gain * command * (1 + c * (command / max
steering)^2) + trim)"""
NOT_WRITTEN = ("cornering_stiffness", "max_accel", "max_brake", *NUISANCE)
"""fitted terms the calibrated config leaves out: they describe the car's tyres and drivetrain so that the gains come
out right"""
AGREED = ("motor_gain", "motor_time_constant", "throttle_exponent", "steering_gain", "steering_offset_deg",
          "steering_time_constant", "friction", "servo_slew")  # fmt: skip
"""the smooth parameters the calibrated config writes, on which the restarts must agree (the battery sag, a note
only, and `NOT_WRITTEN` trade against each other and against the gains, which are checked themselves)"""
NOMINAL = {"motor_gain": 1.0, "throttle_exponent": 1.0, "steering_gain": 1.0, "steering_offset_deg": 0.0,
           "friction": 1.0, "steering_deadband_deg": 0.0, "servo_slew": 0.0, "battery_sag_per_minute": 0.0,
           "turn_drag": 1.0, "steering_cubic": 0.0}  # fmt: skip
SLEW_START = 0.1
"""inverse slew rate (s/rad) the fit starts from when the log identifies it (a servo that limits the big steps)"""


class FitNotConverged(GapbridgeError, RuntimeError):
    """The dynamics fit did not converge; carries the fit for its report."""

    def __init__(self, message: str, fit: DynamicsFit) -> None:
        super().__init__(message)
        self.fit = fit


@dataclass(frozen=True)
class DynamicsFitConfig:
    """The dynamics fit."""

    substeps: int = 4
    """physics substeps per control step of the fitted model (the loop latency's resolution)"""
    max_latency_ms: float = 300.0
    """longest loop (action + camera) latency searched (ms)"""
    burn_in: int = 6
    """control steps each window runs before its motions count (forgets the window's unknown servo state)"""
    window: int = 15
    """control steps of each window that count"""
    restarts: int = 2
    """random starts per candidate latency (their agreement is the convergence check)"""
    bootstrap: int = 6
    """bootstrap replicas of the log (the uncertainty)"""
    top_latencies: int = 3
    """candidate latencies refitted with the replicas"""
    adam_iterations: int = 200
    """Adam iterations over all candidate latencies"""
    refine_iterations: int = 80
    """Adam iterations at the best latencies, with the replicas"""
    adam_lr: float = 0.05
    """Adam step (logit of the unit-box value)"""
    cma_generations: int = 30
    """CMA-ES generations for deadband and slew rate (0 = skip)"""
    cma_popsize: int = 10
    """CMA-ES population"""
    max_residual: float = 1.0
    """largest accepted root-mean-square motion residual, in units of MOTION_SCALE"""
    max_restart_spread: float = 0.03
    """largest accepted disagreement of the restarts (unit-box distance per parameter, on those in `AGREED`)"""
    seed: int = 0
    """seed of the restarts and the bootstrap draws"""

    def __post_init__(self) -> None:
        check_range("fit.substeps", self.substeps, 1, 32)
        check_range("fit.max_latency_ms", self.max_latency_ms, 0.0, 500.0)
        check_range("fit.burn_in", self.burn_in, 1, 60)
        check_range("fit.window", self.window, 2, 200)
        check_range("fit.restarts", self.restarts, 1, 32)
        check_range("fit.bootstrap", self.bootstrap, 2, 200)
        check_range("fit.top_latencies", self.top_latencies, 1, 50)
        check_range("fit.adam_iterations", self.adam_iterations, 1, 10_000)
        check_range("fit.refine_iterations", self.refine_iterations, 0, 10_000)
        check_range("fit.cma_generations", self.cma_generations, 0, 10_000)
        check_range("fit.cma_popsize", self.cma_popsize, 4, 200)
        check_range("fit.max_residual", self.max_residual, 0.0, 1000.0)


@dataclass
class DynamicsFit:
    """A fit's result: values and bootstrap spread per parameter (those it identified), the loop latency, the loss
    over the candidate latencies, residuals, the identifiability flags, and whether it converged (and why not)."""

    values: dict[str, float]
    spread: dict[str, float]
    identified: tuple[str, ...]
    latency_ms: float
    latency_spread_ms: float
    latency_profile: dict[float, float]
    residual: float
    segment_residuals: dict[str, dict[str, float]]
    converged: bool
    reasons: list[str]
    flags: list[str]
    seconds: float
    truth: dict[str, float] | None = None
    windows: int = 0
    replicas: list[dict[str, float]] = field(default_factory=list)


def _loss(win: Windows, latency: Tensor, weights: Tensor, spec: CarSpec, substeps: int, dt: float):
    """The batched objective of P sets: unit-box values `(P, D)` -> `(P,)` weighted mean window loss."""

    def loss(unit: Tensor) -> Tensor:
        pred = rollout(PARAMS.from_unit(unit), latency, win, spec, substeps, dt)
        return (window_losses(pred, win) * weights).sum(1) / weights.sum(1)

    return loss


def _nominal(spec: CarSpec, slew: bool) -> Tensor:
    nominal = {**NOMINAL, **{name: getattr(spec, name) for name in SPEC_FIELDS},
               "servo_slew": SLEW_START if slew else 0.0}  # fmt: skip
    return PARAMS.to_unit(torch.tensor([nominal[n] for n in PARAMS.names]))


@dataclass
class _Problem:
    """What every stage of a fit shares: the windows, the model's timing, the free parameters, the latencies."""

    win: Windows
    spec: CarSpec
    substeps: int
    dt: float
    free: list[bool]
    candidates: Tensor  # loop latencies searched (substeps)

    @property
    def free_idx(self) -> Tensor:
        return torch.tensor([i for i, f in enumerate(self.free) if f])

    def loss(self, latency: Tensor, weights: Tensor):
        return _loss(self.win, latency, weights, self.spec, self.substeps, self.dt)


def _search_latencies(pb: _Problem, cfg: DynamicsFitConfig, nominal: Tensor, gen: torch.Generator):
    """Stage 1: Adam at every candidate latency from the nominal car and random restarts around it; the restarts'
    best loss per latency `(L,)` and the result."""
    n_lat, n_rst, dim, free_idx = len(pb.candidates), cfg.restarts, PARAMS.dim, pb.free_idx
    init = nominal.repeat(n_lat * n_rst, 1)
    shake = (torch.rand(n_lat * n_rst, dim, generator=gen) - 0.5) * 0.3
    shake[::n_rst] = 0.0  # the first start of each latency is the nominal car
    init[:, free_idx] = (init[:, free_idx] + shake[:, free_idx]).clamp(0.02, 0.98)
    latency = pb.candidates.repeat_interleave(n_rst)
    ones = torch.ones(len(latency), len(pb.win.start))
    first = adam_fit(pb.loss(latency, ones), init, cfg.adam_iterations, cfg.adam_lr, pb.free)
    return first.loss.reshape(n_lat, n_rst).min(1).values, first


def _refine(pb: _Problem, cfg: DynamicsFitConfig, first, top: Tensor, gen: torch.Generator) -> dict:
    """Stage 2: Adam at the `top` latencies, the restarts going on and bootstrap replicas starting from the best
    restart; the full log's fit, its restarts, each replica's fit at its own best latency and the replica weights."""
    n_rst, n_boot, n_top, dim, n_win = cfg.restarts, cfg.bootstrap, len(top), PARAMS.dim, len(pb.win.start)
    sets = n_rst + n_boot
    weights = torch.cat([torch.ones(n_rst, n_win), block_bootstrap_weights(torch.arange(n_win), n_boot, gen)])
    units1 = first.unit.reshape(len(pb.candidates), n_rst, dim)[top]  # (K, R, D)
    best1 = first.loss.reshape(len(pb.candidates), n_rst)[top].argmin(1)
    init = torch.cat([units1, units1[torch.arange(n_top), best1][:, None].expand(n_top, n_boot, dim)], 1)
    latency = pb.candidates[top].repeat_interleave(sets)
    second = adam_fit(pb.loss(latency, weights.repeat(n_top, 1)), init.reshape(-1, dim),
                      max(1, cfg.refine_iterations), cfg.adam_lr, pb.free)  # fmt: skip
    loss, unit = second.loss.reshape(n_top, sets), second.unit.reshape(n_top, sets, dim)
    k_best = int(loss[:, :n_rst].min(1).values.argmin())
    restarts = unit[k_best, :n_rst]
    k_boot = loss[:, n_rst:].argmin(0)  # each replica's own latency
    return {
        "fit": restarts[loss[k_best, :n_rst].argmin()], "restarts": restarts, "latency": pb.candidates[top][k_best],
        "boot": unit[k_boot, n_rst + torch.arange(n_boot)], "boot_latency": pb.candidates[top][k_boot],
        "boot_weights": weights[n_rst:],
    }  # fmt: skip


def _tune_deadband(pb: _Problem, cfg: DynamicsFitConfig, stage: dict) -> tuple[Tensor, Tensor]:
    """Stage 3: CMA-ES over the deadband (no gradient) with what it trades against (trim, steering gain), one
    instance per replica and one for the full log; perturbing the other parameters as well would drown its small
    share of the loss. A point CMA-ES does not improve stays as it was."""
    names = ["steering_deadband_deg", "steering_offset_deg", "steering_gain"]
    idx, dim, n_win = torch.tensor([PARAMS.index(n) for n in names]), PARAMS.dim, len(pb.win.start)
    base = torch.cat([stage["fit"][None], stage["boot"]])  # (K, D)
    latency = torch.cat([stage["latency"][None], stage["boot_latency"]])
    weights = torch.cat([torch.ones(1, n_win), stage["boot_weights"]])

    def loss(x: Tensor) -> Tensor:  # (K, pop, d) -> (K, pop)
        k, pop, _ = x.shape
        unit = base[:, None].expand(k, pop, dim).clone()
        unit[..., idx] = x
        objective = pb.loss(latency.repeat_interleave(pop), weights.repeat_interleave(pop, 0))
        return objective(unit.reshape(-1, dim)).reshape(k, pop)

    stds = [5.0, 0.3, 0.3]  # the deadband starts from none at all
    result = cma_fit(loss, base[:, idx].numpy(), 0.03, cfg.cma_generations, cfg.cma_popsize, cfg.seed, stds=stds)
    tuned = base.clone()
    tuned[:, idx] = torch.as_tensor(result.unit, dtype=torch.float32)
    with torch.no_grad():
        before = loss(base[:, idx][:, None]).squeeze(1)
    keep = torch.as_tensor(result.loss, dtype=torch.float32) < before
    tuned = torch.where(keep[:, None], tuned, base)
    return tuned[0], tuned[1:]


def fit_dynamics(log: DriveLog, check, spec: CarSpec, control_hz: float, cfg: DynamicsFitConfig) -> DynamicsFit:
    """Fit the dynamics of `log` (checked by `check_drive`) as the module docstring describes; raises
    `FitNotConverged` (with the fit) when it does not converge."""
    t0 = time.time()
    dt = 1.0 / control_hz / cfg.substeps
    free = [name in SMOOTH and (name != "friction" or check.grip) and (name != "servo_slew" or check.slew)
            for name in PARAMS.names]  # fmt: skip
    candidates = torch.arange(int(math.floor(cfg.max_latency_ms / 1000.0 / dt + 1e-6)) + 1)
    win = make_windows(log, check.valid, cfg.burn_in, cfg.window)
    pb = _Problem(win, spec, cfg.substeps, dt, free, candidates)
    gen = torch.Generator().manual_seed(cfg.seed)
    profile, first = _search_latencies(pb, cfg, _nominal(spec, check.slew), gen)
    top = profile.argsort()[: min(cfg.top_latencies, len(candidates))]
    stage = _refine(pb, cfg, first, top, gen)
    fit_unit, boot_unit = stage["fit"], stage["boot"]
    deadband = cfg.cma_generations > 0 and check.deadband
    if deadband:
        fit_unit, boot_unit = _tune_deadband(pb, cfg, stage)

    names = [n for n in PARAMS.names if free[PARAMS.index(n)] or (deadband and n == "steering_deadband_deg")]
    phys, boot = PARAMS.from_unit(fit_unit), PARAMS.from_unit(boot_unit)
    ms = dt * 1000.0
    lat_ms, boot_ms = float(stage["latency"]) * ms, stage["boot_latency"].float() * ms
    reasons = _unconverged(pb, cfg, stage["restarts"], stage["latency"], lat_ms)
    residual, segments = residuals(log, win, fit_unit, stage["latency"], spec, cfg.substeps, dt)
    if residual > cfg.max_residual:
        reasons.append(f"residual {residual:.3f} (motion rms in units of {MOTION_SCALE}) above --fit.max-residual "
                       f"{cfg.max_residual}")  # fmt: skip
    replicas = [{**{n: float(b[PARAMS.index(n)]) for n in names}, "loop_latency_ms": float(lt)}
                for b, lt in zip(boot, boot_ms, strict=True)]  # fmt: skip
    fit = DynamicsFit(
        {n: float(phys[i]) for i, n in enumerate(PARAMS.names)},
        {n: float(boot[:, PARAMS.index(n)].std()) for n in names}, tuple(names), lat_ms, float(boot_ms.std()),
        {round(float(c) * ms, 3): float(v) for c, v in zip(candidates, profile, strict=True)},
        residual, segments, not reasons, reasons, list(check.flags), time.time() - t0, log.truth, len(win.start),
        replicas,
    )  # fmt: skip
    if reasons:
        raise FitNotConverged("the dynamics fit did not converge: " + "; ".join(reasons), fit)
    return fit


def _unconverged(pb: _Problem, cfg: DynamicsFitConfig, restarts: Tensor, latency: Tensor, lat_ms: float) -> list[str]:
    """Why the fit is not to be trusted (empty: it converged), besides its residual."""
    reasons = []
    checked = torch.tensor([i for i in pb.free_idx.tolist() if PARAMS.names[i] in AGREED])
    if len(restarts) > 1 and len(checked):
        span = restarts[:, checked].max(0).values - restarts[:, checked].min(0).values
        if float(span.max()) > cfg.max_restart_spread:
            worst = PARAMS.names[int(checked[span.argmax()])]
            reasons.append(f"the restarts disagree on {worst} by {float(span.max()):.3f} of its search box")
    if int(latency) == int(pb.candidates[-1]) and len(pb.candidates) > 1:
        reasons.append(f"the loop latency sits at the edge of the search ({lat_ms:.0f} ms): raise --fit.max-latency-ms")
    return reasons


@torch.no_grad()
def residuals(
    log: DriveLog, win: Windows, unit: Tensor, latency: Tensor, spec: CarSpec, substeps: int, dt: float
) -> tuple[float, dict[str, dict[str, float]]]:
    """The fit's root-mean-square motion residual (in units of MOTION_SCALE) and, per protocol segment, the rms
    forward and lateral residual (mm per frame) and yaw residual (mrad per frame)."""
    pred = rollout(PARAMS.from_unit(unit[None]), latency.reshape(1), win, spec, substeps, dt)[0]  # (Nw, W, 3)
    res = pred - win.motion
    total = float(((res / torch.tensor(MOTION_SCALE)).square().mean()).sqrt())
    out = {}
    for s in torch.unique(win.segment).tolist():
        r = res[win.segment == s]
        rms = r.square().mean((0, 1)).sqrt()
        out[log.segment_names[s]] = {"forward_mm": 1000 * float(rms[0]), "lateral_mm": 1000 * float(rms[1]),
                                     "yaw_mrad": 1000 * float(rms[2]), "windows": int(len(r))}  # fmt: skip
    return total, out


def servo_rate_dps(slew: float) -> float:
    """Inverse slew (s per rad) -> the effects' servo rate (degrees/s; 0 = unlimited: above 2000 degrees/s the servo
    crosses its whole range within a substep)."""
    rate = math.degrees(1.0 / max(slew, 1e-6))
    return 0.0 if rate > 2000.0 else rate
