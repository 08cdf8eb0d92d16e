"""The `bimanual-handover` task: one Franka arm hands a cube to the other, registered through the task contract.

Everything but the env, its ranges, the estimates' scales and the expert is the bar lift's entry. The estimate
targets are those of the bar lift (the action latency, classified in physics steps, and the per-episode
cube mass, centre-of-mass offset, friction and each arm's gain scale), scaled to the cube's ranges. The action spec is
the lift's box of 10 values. Evaluation reuses the lift's: one fixed-seed episode per env, ranked by success (the
handover held for the hold time), reported with its Wilson interval; an episode's `max_height` is the cube's. The
reality proxy is the bar lift's (`envs/bimanual/reality.py`), with the cube's own ranges.
"""

from __future__ import annotations

from dataclasses import replace

from envs.bimanual.handover import HANDOVER_FACTOR_BOUNDS, HandoverConfig, HandoverEnv, nominal_handover
from envs.bimanual.handover_expert import HandoverExpert
from envs.bimanual.task import TASK as LIFT
from envs.bimanual.task import BimanualEvalConfig
from envs.task import EstimateSpec, register_task

ESTIMATES = EstimateSpec(
    latencies=("action_latency",),
    regressions=("object_mass", "com_shift", "friction", "gain_arm0", "gain_arm1"),
    scale={
        "object_mass": (0.15, 0.1),
        "com_shift": (0.0, 0.005),
        "friction": (0.8, 0.4),
        "gain_arm0": (1.0, 0.1),
        "gain_arm1": (1.0, 0.1),
    },
    factors=("object_mass", "com_shift", "friction", "gain_arm0", "gain_arm1"),
)
"""latency in seconds, mass in kg, offset in m; (centre, scale) normalize each regressed estimate"""


def make_eval_env(env_cfg: HandoverConfig, eval_cfg: BimanualEvalConfig) -> HandoverEnv:
    cfg = replace(env_cfg, num_envs=eval_cfg.episodes, seed=eval_cfg.seed)
    return HandoverEnv(cfg if eval_cfg.randomize else nominal_handover(cfg))


TASK = register_task(
    replace(
        LIFT,
        name="bimanual-handover",
        config_cls=HandoverConfig,
        make_env=HandoverEnv,
        factor_bounds=HANDOVER_FACTOR_BOUNDS,
        estimates=ESTIMATES,
        make_eval_env=make_eval_env,
        expert=lambda env: HandoverExpert(env),
        description="one Franka arm hands a 4 cm cube to the other, which holds it in a goal region, from one 96x96 "
        "grayscale camera",
    )
)
