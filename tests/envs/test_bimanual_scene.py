"""Two-arm scene: the control math by hand, then one Genesis scene (4 envs) for IK, setter isolation and the grasp."""

from __future__ import annotations

import math

import pytest
import torch

from envs.bimanual.control import (
    ActionDelay,
    clamp_norm,
    dls_step,
    grasp_points,
    grasp_yaw,
    quat_mul,
    quat_rotate,
    rotation_error,
    top_down_quat,
    top_down_yaw,
)


def test_quaternions_by_hand():
    quarter_z = torch.tensor([math.cos(math.pi / 4), 0.0, 0.0, math.sin(math.pi / 4)])
    assert torch.allclose(quat_rotate(quarter_z, torch.tensor([1.0, 0.0, 0.0])), torch.tensor([0.0, 1.0, 0.0]),
                          atol=1e-6)  # fmt: skip
    assert torch.allclose(quat_mul(quarter_z, quarter_z), torch.tensor([0.0, 0.0, 0.0, 1.0]), atol=1e-6)
    assert torch.allclose(top_down_quat(torch.tensor(0.0)), torch.tensor([0.0, 1.0, 0.0, 0.0]))
    yaw = torch.tensor([-1.0, 0.3, 2.0])
    assert torch.allclose(top_down_yaw(top_down_quat(yaw)), yaw, atol=1e-6)
    err = rotation_error(top_down_quat(torch.tensor(0.2)), top_down_quat(torch.tensor(0.0)))
    assert torch.allclose(err, torch.tensor([0.0, 0.0, 0.2]), atol=1e-6)  # a yaw about world z


def test_dls_step_and_clamp_by_hand():
    # J = diag(2, 1) on two joints, λ = 0: dq = J⁻¹ e
    jac = torch.zeros(6, 2)
    jac[0, 0], jac[1, 1] = 2.0, 1.0
    dq = dls_step(jac, torch.tensor([0.2, 0.1, 0, 0, 0, 0]), damping=1e-6)
    assert torch.allclose(dq, torch.tensor([0.1, 0.1]), atol=1e-5)
    # damping shrinks the step: 2·0.2 / (4 + 1) for λ = 1
    assert dls_step(jac, torch.tensor([0.2, 0, 0, 0, 0, 0]), damping=1.0)[0].item() == pytest.approx(0.08)
    assert torch.allclose(clamp_norm(torch.tensor([0.03, 0.04, 0.0]), 0.01), torch.tensor([0.006, 0.008, 0.0]))
    assert torch.allclose(clamp_norm(torch.tensor([0.003, 0.004, 0.0]), 0.01), torch.tensor([0.003, 0.004, 0.0]))


def test_action_delay_reads_each_envs_own_lag():
    delay = ActionDelay(num_envs=3, width=1, max_delay=2)
    delay.set_delay(torch.tensor([0, 1, 2]), torch.arange(3))
    delay.fill(torch.zeros(3, 1), torch.arange(3))
    out = [delay.push(torch.full((3, 1), float(t + 1)))[:, 0].tolist() for t in range(4)]
    assert out == [[1, 0, 0], [2, 1, 0], [3, 2, 1], [4, 3, 2]]


def test_grasp_points_and_yaws():
    pts = grasp_points(torch.tensor([[0.0, 0.0, 0.02]]), torch.tensor([math.pi]), 0.30, 0.05)
    assert torch.allclose(pts[0, 0], torch.tensor([-0.10, 0.0, 0.02]), atol=1e-6), "arm 0 takes the -x end"
    assert torch.allclose(grasp_yaw(torch.tensor([0.0, 0.4])), torch.tensor([[0.0, 0.0], [0.4, 0.4]]), atol=1e-6)


# --------------------------------------------------------------------------------------------- Genesis scene
N = 4


@pytest.fixture(scope="module")
def rig():
    from envs.bimanual.control import BimanualController
    from envs.bimanual.scene import SceneConfig, build_scene

    bs = build_scene(SceneConfig(num_envs=N, batch_dofs_info=True))
    yield bs, BimanualController(bs)
    bs.close()


def reset(rig):
    bs, ctrl = rig
    everyone = torch.arange(N)
    bs.reset(everyone, torch.tensor([[0.0, 0.0, bs.cfg.object_extent[2] / 2]]).expand(N, -1), torch.zeros(N))
    ctrl.reset(everyone)


@pytest.mark.genesis
def test_ik_reaches_targets_with_both_arms(rig):
    bs, ctrl = rig
    reset(rig)
    start = ctrl.poses()
    goal = start.pos + torch.tensor([[0.08, 0.05, -0.15], [-0.05, -0.08, -0.10]])
    goal_yaw = torch.tensor([[0.4, -0.3]]).expand(N, -1)
    for _ in range(40):
        ctrl.step(goal - ctrl.target_pos, goal_yaw - ctrl.target_yaw, torch.zeros(N, 2))
    end = ctrl.poses()
    assert (end.pos - goal).norm(dim=-1).max() < 0.005
    assert (end.yaw - goal_yaw).abs().max() < 0.02
    tilt = quat_rotate(end.quat, torch.tensor([0.0, 0.0, 1.0]).expand(N, 2, 3))[..., 2]
    assert (tilt < -0.999).all(), "the hands stay pointing down"


@pytest.mark.genesis
def test_a_step_moves_the_tcp_at_most_one_centimetre(rig):
    bs, ctrl = rig
    reset(rig)
    for _ in range(3):
        before = ctrl.poses().pos
        ctrl.step(torch.tensor([0.0, 0.0, -0.3]).expand(N, 2, 3), torch.zeros(N, 2), torch.zeros(N, 2))
    moved = (ctrl.poses().pos - before).norm(dim=-1)
    assert moved.max() < 0.012 and moved.min() > 0.007


@pytest.mark.genesis
def test_per_env_setters_touch_only_their_env(rig):
    bs, ctrl = rig
    friction, mass, com, kp = bs.friction(), bs.object_mass(), bs.object_com_shift(), bs.arm_kp()
    k = torch.tensor([2])
    try:
        bs.set_friction(torch.tensor([0.33]), k)
        bs.set_object_mass(torch.tensor([0.77]), k)
        bs.set_object_com_shift(torch.tensor([[0.05, 0.0, 0.01]]), k)
        bs.set_arm_gains(torch.tensor([0.5]), torch.tensor([0.5]), k)
        others = torch.tensor([0, 1, 3])
        assert torch.equal(bs.friction()[others], friction[others]) and bs.friction()[2].item() == pytest.approx(0.33)
        assert torch.equal(bs.object_mass()[others], mass[others]) and bs.object_mass()[2].item() == pytest.approx(0.77)
        assert torch.equal(bs.object_com_shift()[others], com[others])
        assert torch.allclose(bs.object_com_shift()[2], torch.tensor([0.05, 0.0, 0.01]), atol=1e-6)
        assert torch.equal(bs.arm_kp()[others], kp[others])
        assert torch.allclose(bs.arm_kp()[2], kp[2] * 0.5)
        # the dynamics: the arms move from the same state with the same commands; only env 2 (softer servos) lags
        reset(rig)
        for _ in range(4):
            ctrl.step(torch.tensor([0.0, 0.0, -0.01]).expand(N, 2, 3), torch.zeros(N, 2), torch.zeros(N, 2))
        q = torch.stack([a.get_dofs_position(bs.arm_dofs) for a in bs.arms], 1)
        assert torch.allclose(q[0], q[1], atol=1e-6) and torch.allclose(q[0], q[3], atol=1e-6)
        assert (q[2] - q[0]).abs().max() > 1e-3
    finally:
        everyone = torch.arange(N)
        bs.set_friction(torch.full((N,), bs.cfg.friction), everyone)
        bs.set_object_mass(torch.full((N,), bs.cfg.object_mass), everyone)
        bs.set_object_com_shift(torch.zeros(N, 3), everyone)
        bs.set_arm_gains(torch.ones(N), torch.ones(N), everyone)


@pytest.mark.genesis
def test_scripted_grasp_lifts_the_bar_at_nominal_settings(rig):
    from envs.bimanual.control import GraspScript, ScriptedGrasp

    bs, ctrl = rig
    reset(rig)
    pos = bs.object.get_pos()
    yaw = torch.tensor([0.0, 0.2, -0.2, 0.1])
    pos = pos + torch.tensor([[0.0, 0.0, 0.0], [0.03, -0.03, 0.0], [-0.02, 0.04, 0.0], [0.0, 0.0, 0.0]])
    bs.reset(torch.arange(N), pos, yaw)
    ctrl.reset(torch.arange(N))
    script = GraspScript(approach_steps=40, hold_steps=20)
    driver = ScriptedGrasp(script, grasp_points(pos, yaw, bs.cfg.object_extent[0], script.end_margin),
                           grasp_yaw(yaw), torch.full((N,), bs.cfg.finger_force))  # fmt: skip
    for k in range(script.total_steps):
        ctrl.step(*driver.command(k, ctrl.target_pos, ctrl.target_yaw))
    lifted = bs.object.get_pos()[:, 2] - pos[:, 2]
    assert (lifted > 0.12).all(), lifted
    assert not bs.solver.get_error_envs_mask().any()
