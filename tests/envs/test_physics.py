import math

import pytest
import torch

from envs.racing.car import CarSpec
from envs.racing.physics_bicycle import GRAVITY, BicyclePhysics, CarState, bicycle_step


def drive(steer: float, speed: float, friction: float = 1.0, seconds: float = 6.0, n: int = 1) -> BicyclePhysics:
    spec = CarSpec()
    phys = BicyclePhysics(n, spec, dt=1 / 60)
    phys.state.vx[:] = speed
    phys.params.friction[:] = friction
    steer_t, speed_t = torch.full((n,), steer), torch.full((n,), speed)
    for _ in range(int(seconds * 60)):
        phys.step(steer_t, speed_t)
    return phys


@pytest.mark.parametrize(("steer", "speed"), [(0.3, 0.5), (-0.4, 0.4), (0.15, 0.6)])
def test_low_speed_turning_radius_is_kinematic(steer, speed):
    """Rear-axle turning radius of the kinematic bicycle: R = L / tan(delta)."""
    spec = CarSpec()
    s = drive(steer, speed).state
    r_cg = s.speed / s.yaw_rate.abs()  # radius of the centre of gravity's circle
    r_rear = torch.sqrt(r_cg**2 - spec.cg_to_rear**2)
    assert r_rear.item() == pytest.approx(spec.wheelbase / math.tan(abs(steer)), rel=0.02)


def test_straight_line_speed_follows_motor_gain():
    phys = BicyclePhysics(2, CarSpec(), dt=1 / 60)
    phys.params.motor_gain[:] = torch.tensor([1.0, 0.8])
    for _ in range(240):
        phys.step(torch.zeros(2), torch.full((2,), 2.0))
    assert phys.state.vx.tolist() == pytest.approx([2.0, 1.6], rel=1e-3)
    assert phys.state.y.abs().max() < 1e-6 and phys.state.yaw.abs().max() < 1e-6


def test_lateral_acceleration_is_friction_limited_and_the_car_slides():
    grip = drive(0.5, 3.0, friction=0.3).state
    lat_acc = (grip.vx * grip.yaw_rate).abs().item()
    assert lat_acc <= 0.3 * GRAVITY * 1.02
    r = grip.speed.item() / grip.yaw_rate.abs().item()
    assert r > 3 * CarSpec().wheelbase / math.tan(0.5), (
        "at low friction the car slides far wide of its kinematic circle"
    )
    high = drive(0.5, 3.0, friction=1.0).state
    assert (high.vx * high.yaw_rate).abs().item() > lat_acc


def test_rear_grip_sets_the_limit_behaviour_and_nothing_below_it():
    """Beyond the grip limit the balanced car washes out wide of its kinematic circle (front saturates), one with
    less rear grip spins inside it and loses speed (the rear breaks away); well inside the limit both follow the
    same circle."""
    spec = CarSpec()
    kinematic = math.hypot(spec.wheelbase / math.tan(0.3), spec.cg_to_rear)
    phys = BicyclePhysics(2, spec, dt=1 / 60)
    phys.params.rear_grip[:] = torch.tensor([1.0, 0.8])
    phys.state.vx[:] = 3.0
    for _ in range(240):
        phys.step(torch.full((2,), 0.3), torch.full((2,), 3.0))  # 3 m/s on a 0.55 m circle: ~16 m/s^2 > g
    s = phys.state
    radius = s.speed / s.yaw_rate.abs()
    assert radius[0] > 1.2 * kinematic and s.speed[0] > 2.4, "understeer: wide, speed kept"
    assert radius[1] < kinematic and s.speed[1] < 1.5, "oversteer: the car spins and scrubs off speed"
    slow = BicyclePhysics(2, spec, dt=1 / 60)
    slow.params.rear_grip[:] = torch.tensor([1.0, 0.8])
    slow.state.vx[:] = 1.0
    for _ in range(240):
        slow.step(torch.full((2,), 0.3), torch.full((2,), 1.0))  # 1.8 m/s^2, a fifth of the grip
    r = slow.state.speed / slow.state.yaw_rate.abs()
    assert r[0].item() == pytest.approx(r[1].item(), rel=0.02)
    assert r[0].item() == pytest.approx(kinematic, rel=0.03)


def test_servo_is_an_exact_first_order_lag():
    spec = CarSpec()
    state = CarState.zeros(1)
    state.vx[:] = 1.0
    params = BicyclePhysics(1, spec, 0.01).params
    nxt = bicycle_step(state, torch.tensor([0.4]), torch.tensor([1.0]), params, spec, 0.01)
    assert nxt.steer.item() == pytest.approx(0.4 * (1 - math.exp(-0.01 / spec.steering_time_constant)), rel=1e-5)


def test_stable_and_finite_for_random_commands():
    gen = torch.Generator().manual_seed(0)
    n = 512
    phys = BicyclePhysics(n, CarSpec(), dt=1 / 60)
    phys.params.friction[:] = 0.2 + torch.rand(n, generator=gen)
    for _ in range(600):
        steer = (torch.rand(n, generator=gen) - 0.5) * 1.0
        speed = torch.rand(n, generator=gen) * 4.0
        s = phys.step(steer, speed)
    for v in (s.x, s.y, s.vx, s.vy, s.yaw_rate):
        assert torch.isfinite(v).all()
    assert s.speed.max() < 5.0 and s.yaw_rate.abs().max() < 40.0


def test_reset_only_touches_the_given_envs():
    phys = drive(0.2, 1.0, n=4, seconds=1.0)
    before = phys.state.clone()
    ids = torch.tensor([1, 3])
    phys.reset(ids, torch.tensor([5.0, 6.0]), torch.tensor([1.0, 2.0]), torch.tensor([0.0, 1.0]), torch.zeros(2))
    assert phys.state.x[ids].tolist() == [5.0, 6.0] and phys.state.vx[ids].tolist() == [0.0, 0.0]
    for name in ("x", "y", "yaw", "vx", "vy", "yaw_rate", "steer"):
        assert torch.equal(getattr(phys.state, name)[[0, 2]], getattr(before, name)[[0, 2]])
