"""What a planar ground vehicle's history encoder estimates online: the estimate set shared by car tasks and by the
vehicle estimators in `adaptation/` (the second-stage factor estimator, the visual odometry's motion inputs).

Latencies are classified in physics substeps; friction and motor gain are per-episode factors; the body velocities
(speed, lateral speed, yaw rate) are dense per-frame targets that teach the encoder the vehicle's motion, which is
what reveals friction (slip at a given speed and steering) and motor gain (speed reached for a command).
"""

from __future__ import annotations

from envs.task import EstimateSpec

VEHICLE_ESTIMATES = EstimateSpec(
    latencies=("action_latency", "camera_latency"),
    regressions=("friction", "motor_gain", "speed", "lateral_speed", "yaw_rate"),
    scale={
        "friction": (1.0, 0.3),
        "motor_gain": (1.0, 0.15),
        "speed": (2.0, 1.5),
        "lateral_speed": (0.0, 0.08),
        "yaw_rate": (0.0, 1.5),
    },
    factors=("friction", "motor_gain"),
)
"""latencies in seconds, speeds in m/s, yaw rate in rad/s; (centre, scale) normalize each regressed estimate"""

MOTION = ("speed", "lateral_speed", "yaw_rate")
"""the body velocities among the regressions, in this order wherever motion is an input"""
