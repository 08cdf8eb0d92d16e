"""A calibrated training world from a dynamics fit: the env YAML sections (nominal values at the fit, randomization
ranges narrowed to its spread) and the fit's report rows."""

from __future__ import annotations

from envs.racing.dynamics_calibration import NOT_WRITTEN, NUISANCE, DynamicsFit, servo_rate_dps
from envs.racing.effects import EffectsConfig, mean_jitter_ms

SESSION_MINUTES = 10.0
"""driving time whose battery sag the calibrated motor-gain range covers (the fit's gain is the full battery's), down to
the effects' default battery floor"""


def calibrated_sections(
    fit: DynamicsFit, camera_latency_ms: float, dt_physics: float, widen: float = 2.0, jitter_ms: float = 0.0
) -> tuple[dict, list[str]]:
    """The env YAML sections of a calibrated training world (the key layout of `to_yaml(EnvConfig)`), and notes:
    nominal values at the fit (the car's lags, the effects' trim, deadband, slew rate and throttle map, the action
    latency) and randomization ranges `widen` times the fit's spread either side of it (at least a small floor). The
    effects are written at their fitted values for every env (`effects.randomize` off: a preset that draws each
    effect between off and its value, with a random trim sign, would centre the world elsewhere), with a latency
    jitter of `jitter_ms`. The log shows the loop latency only, the mean jitter inside it: the action latency is the
    loop latency less `camera_latency_ms` and the written jitter's mean. A battery that sagged during the log widens
    the motor gain's range down to what `SESSION_MINUTES` of driving leave (at most to the battery floor)."""
    v, s = fit.values, fit.spread
    half = lambda name, floor: max(widen * s.get(name, 0.0), floor)  # noqa: E731
    around = lambda name, floor: [round(v[name] - half(name, floor), 4), round(v[name] + half(name, floor), 4)]  # noqa: E731
    notes = []
    action = fit.latency_ms - camera_latency_ms - mean_jitter_ms(jitter_ms, dt_physics)
    if action < 0:
        notes.append(f"loop latency {fit.latency_ms:.0f} ms is below the camera latency {camera_latency_ms:.0f} ms "
                     "and the mean jitter: action latency set to 0")  # fmt: skip
        action = 0.0
    lat_half = max(widen * fit.latency_spread_ms, 1000.0 * dt_physics)
    rnd = {
        "motor_gain": True, "motor_gain_range": around("motor_gain", 0.01),
        "steering_gain": True, "steering_gain_range": around("steering_gain", 0.01),
        "steering_offset": True, "steering_offset_deg": round(half("steering_offset_deg", 0.1), 4),
        "action_latency": True,
        "action_latency_ms": [round(max(0.0, action - lat_half), 2), round(action + lat_half, 2)],
        "nominal_action_latency_ms": round(action, 2),
        "camera_latency": False, "nominal_camera_latency_ms": round(camera_latency_ms, 2),
    }  # fmt: skip
    if "friction" in fit.identified:
        rnd |= {"friction": True, "friction_range": around("friction", 0.02)}
    else:
        notes.append("friction not identified: its randomization range is left as it was")
    sag = v.get("battery_sag_per_minute", 0.0)
    if "battery_sag_per_minute" in fit.identified and sag > 0.005:
        drained = max(1.0 - sag * SESSION_MINUTES, EffectsConfig().battery_floor)
        low = round(min(rnd["motor_gain_range"][0], v["motor_gain"] * drained), 4)
        rnd["motor_gain_range"] = [low, rnd["motor_gain_range"][1]]
        notes.append(f"the battery sagged {sag:.3f} of the speed gain per minute: motor_gain is the full battery's, "
                     f"its range reaches down to {low} ({SESSION_MINUTES:.0f} minutes of driving)")  # fmt: skip
    unwritten = [n for n in NOT_WRITTEN if n in fit.identified]
    if unwritten:
        notes.append("fitted but not written (they describe this car's tyres and drivetrain beside the gains; the last "
                     f"{len(NUISANCE)} are not in the training sim): "
                     + ", ".join(f"{n} {v[n]:.4g}" for n in unwritten))  # fmt: skip
    car = {"motor_time_constant": round(v["motor_time_constant"], 4),
           "steering_time_constant": round(v["steering_time_constant"], 4)}  # fmt: skip
    effects = {
        "steering_offset_deg": round(v["steering_offset_deg"] / v["steering_gain"], 4),  # command space, before gain
        "throttle_exponent": round(v["throttle_exponent"], 4),
        "latency_jitter_ms": round(jitter_ms, 2),
        "randomize": False,
    }
    if "steering_deadband_deg" in fit.identified:
        deadband = v["steering_deadband_deg"]
        effects["steering_deadband_deg"] = round(deadband, 4) if deadband >= 0.05 else 0.0  # below: none
    if "servo_slew" in fit.identified:
        effects["servo_rate_dps"] = round(servo_rate_dps(v["servo_slew"]), 2)
    return {"car": car, "randomization": rnd, "effects": effects}, notes


def report_rows(fit: DynamicsFit) -> list[tuple[str, float, float, float | None]]:
    """(quantity, fitted, spread, true or None) per reported quantity, in the units the drive protocol talks in."""
    t = fit.truth or {}
    rows = []
    for name in fit.identified:
        value, spread, true = fit.values[name], fit.spread.get(name, 0.0), t.get(name)
        if name == "servo_slew":
            rate = servo_rate_dps(value)
            spread = abs(servo_rate_dps(max(value - spread, 1e-3)) - rate) if rate else 0.0
            rows.append(("servo_rate_dps", rate, spread, t.get("servo_rate_dps")))
            continue
        rows.append((name, value, spread, true))
    rows.append(("loop_latency_ms", fit.latency_ms, fit.latency_spread_ms, t.get("loop_latency_ms")))
    return rows
