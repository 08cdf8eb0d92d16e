"""The cube handover: the success test on scripted counter-examples, the shaping terms and the expert's face yaws by
hand (pure tensors), the expert's stage read off hand-made states, config refusals by field name and the registration,
then one Genesis env (4 envs) in which the scripted expert hands the cube over at nominal settings and a fresh expert
taking over mid-episode acts as the one that ran from the start."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from envs.bimanual.config import RandomizationConfig
from envs.bimanual.handover import HandoverConfig
from envs.bimanual.handover_expert import STAGES, HandoverExpertConfig, face_yaw, infer_stage
from envs.bimanual.handover_success import (
    HandoverGoal,
    beyond_best,
    giver_released,
    handover_conditions,
    handover_success_over,
    handover_terms,
    in_goal,
)
from envs.errors import ConfigError

GOAL = HandoverGoal()
HOLD = 20
T = 40
IN_GOAL = (0.10, 0.0, 0.16)
ON_TABLE = (0.10, 0.0, 0.02)


def trajectory(pos=IN_GOAL, giver=(False, False), receiver=(True, True), giver_open=0.08, other=False):
    """One env's time-major trajectory `(T, 1, …)`: the cube's centre (one point, or a list of per-step points), each
    gripper's finger contacts, the giver's opening (m) and other contact."""
    points = pos if isinstance(pos, list) else [pos] * T
    p = torch.tensor(points, dtype=torch.float32)[:, None]
    fingers = torch.tensor([giver, receiver])[None, None].expand(len(p), 1, 2, 2)
    return p, fingers, torch.full((len(p), 1), giver_open), torch.full((len(p), 1), other)


def succeeds(p, fingers, opening, other) -> bool:
    return bool(handover_success_over(p, fingers, opening, other, GOAL, HOLD)[0])


def test_a_handover_held_for_the_hold_time_succeeds_and_a_break_restarts_it():
    assert succeeds(*trajectory())
    assert not succeeds(*trajectory([IN_GOAL] * 19 + [ON_TABLE] + [IN_GOAL] * 19)), "19 + 19 steps are no 20-step hold"
    assert succeeds(*trajectory([ON_TABLE] * 20 + [IN_GOAL] * 20)), "a hold of exactly the hold time"
    p, fingers, opening, other = (x[:39] for x in trajectory())
    fingers = fingers.clone()
    fingers[19, 0, 1, 0] = False  # the receiver's left finger slips off for one step between two 19-step holds
    assert not succeeds(p, fingers, opening, other), "the streak is broken by one step without the receiver's grip"
    fingers[19, 0, 1, 0] = True
    assert succeeds(p, fingers, opening, other)


def test_handover_counter_examples_never_succeed():
    assert not succeeds(*trajectory(receiver=(True, False))), "the receiver only touches the cube"
    assert not succeeds(*trajectory(giver=(True, True))), "the giver never lets go"
    assert not succeeds(*trajectory(giver=(False, True))), "the giver keeps one finger on it"
    assert not succeeds(*trajectory(giver_open=0.02)), "the giver off the cube but barely open"
    # thrown through the goal region: up through 0.10-0.25 m in a few steps and out, nobody holding it
    thrown = [(0.10, 0.0, 0.02 + 0.04 * t) for t in range(T)]
    assert not succeeds(*trajectory(thrown, receiver=(False, False)))
    assert not succeeds(*trajectory(thrown)), "even with the receiver's fingers on it as it flies through"
    assert not succeeds(*trajectory(giver=(True, True), receiver=(False, False))), "held by the giver only"
    assert not succeeds(*trajectory(ON_TABLE, other=True)), "resting on the table in the receiver's grip"
    assert not succeeds(*trajectory(ON_TABLE, receiver=(False, False), other=True)), "resting on the table untouched"
    assert not succeeds(*trajectory(other=True)), "in the region but touching the giver's hand, or an arm"
    assert not succeeds(*trajectory((0.10, 0.0, 0.08))), "held below the region"
    assert not succeeds(*trajectory((-0.05, 0.0, 0.16))), "held on the giver's side of the table"


def test_goal_region_and_release_by_hand():
    pos = torch.tensor([[0.0, -0.12, 0.10], [0.20, 0.12, 0.25], [0.21, 0.0, 0.16], [0.10, 0.0, 0.099]])
    assert in_goal(pos, GOAL).tolist() == [True, True, False, False], "edges count, beyond them does not"
    touch = torch.tensor([[False, False], [False, False], [True, False]])
    assert giver_released(touch, torch.tensor([0.03, 0.029, 0.08]), 0.03).tolist() == [True, False, False]
    assert GOAL.centre == pytest.approx((0.10, 0.0, 0.175))
    handed = torch.tensor([[False, False], [True, True]]).expand(2, 2, 2)
    ok = handover_conditions(torch.tensor([IN_GOAL, IN_GOAL]), handed, torch.tensor([0.08, 0.08]),
                             torch.tensor([False, True]), GOAL)  # fmt: skip
    assert ok.tolist() == [True, False]


def test_shaping_terms_by_hand():
    pos = torch.tensor([[-0.30, 0.0, 0.02], [0.10, 0.0, 0.175]])
    tcp = torch.tensor([[[-0.30, 0.0, 0.07], [0.3, 0.0, 0.4]], [[-0.2, 0.0, 0.2], [0.10, 0.0, 0.175]]])
    touch = torch.tensor([[[True, True], [False, False]], [[False, False], [True, True]]])
    terms = handover_terms(pos, tcp, touch, torch.tensor([0.0, 0.08]), GOAL, start_x=-0.30, rest_height=0.02,
                           reach_scale=0.05)  # fmt: skip
    assert set(terms) == {"reach", "grasp", "carry", "receiver_reach", "receiver_grasp", "release", "lift"}
    assert all(v.shape == (2,) for v in terms.values())
    # env 0: the giver grips the cube at its start, 5 cm above its centre; nothing carried or handed yet
    assert terms["reach"][0].item() == pytest.approx(math.exp(-1.0)) and terms["grasp"][0].item() == 1.0
    assert terms["carry"][0].item() == 0.0 and terms["receiver_reach"][0].item() == 0.0
    assert terms["release"][0].item() == 0.0 and terms["lift"][0].item() == 0.0
    # env 1: handed over at the goal's centre: the giver's terms stop paying, the receiver's all pay in full
    assert terms["reach"][1].item() == 0.0 and terms["grasp"][1].item() == 0.0
    for name in ("carry", "receiver_reach", "receiver_grasp", "release", "lift"):
        assert terms[name][1].item() == pytest.approx(1.0), name


def test_progress_beyond_the_best_pays_each_term_its_highest_value_once():
    values = torch.tensor([0.2, 0.5, 0.3, 0.5, 0.9, 0.1, 0.9])
    best, paid = torch.zeros(1, 1), []
    for v in values:
        rise, best = beyond_best(v.reshape(1, 1), best)
        paid.append(rise.item())
    assert paid == pytest.approx([0.2, 0.3, 0.0, 0.0, 0.4, 0.0, 0.0]), "falling back and regaining pay nothing"
    assert sum(paid) == pytest.approx(0.9) and best.item() == pytest.approx(0.9)


def test_with_the_progress_reward_letting_go_at_the_handoff_point_is_never_a_loss():
    """At the handoff point the shaped reward pays less per step once the receiver grips while the giver still holds
    (the giver's terms stop, the release has not come); progress beyond the best never pays less for going on."""
    from envs.bimanual.handover import HANDOVER_PROGRESS, HANDOVER_REWARD, progress_pay

    handoff, start = (0.05, 0.0, 0.15), (-0.30, 0.0, 0.02)
    giver_tcp, receiver_tcp, far = (0.05, 0.0, 0.15), (0.05, 0.0, 0.15), (0.4, 0.0, 0.4)
    states = [  # cube, giver's and receiver's TCP, fingers (giver, receiver), giver's opening
        (start, giver_tcp, far, ((True, True), (False, False)), 0.0),
        (handoff, giver_tcp, far, ((True, True), (False, False)), 0.0),  # carried to the handoff point
        (handoff, giver_tcp, receiver_tcp, ((True, True), (True, True)), 0.0),  # the receiver grips too
        (handoff, giver_tcp, receiver_tcp, ((False, False), (True, True)), 0.08),  # the giver has let go
    ]

    def terms_of(i):
        cube, g, r, touch, opening = states[i]
        return handover_terms(
            torch.tensor([cube]), torch.tensor([[g, r]]), torch.tensor([touch]), torch.tensor([opening]), GOAL,
            start_x=-0.30, rest_height=0.02, reach_scale=0.05,
        )  # fmt: skip

    shaped = [sum(HANDOVER_REWARD[k] * v.item() for k, v in terms_of(i).items()) for i in range(len(states))]
    assert shaped[2] < shaped[1], "the shaped reward's dip the progress reward removes"

    def pays(order):
        best, paid = torch.zeros(1, len(HANDOVER_PROGRESS)), []
        for i in order:
            pay, best = progress_pay(terms_of(i), best)
            paid.append(pay.item())
        return paid

    paid = pays(range(len(states)))
    assert min(paid) >= 0.0 and paid[2] > 0.0 and paid[3] > 0.0, paid
    stay = sum(pays((0, 1, 1, 1)))  # the giver keeps the cube at the handoff point: pays only what it first did
    assert sum(paid) > stay + 4.0, "handing over pays at least the release's weight more than holding on"


def test_face_yaws_turn_each_hand_square_to_the_cube():
    half = torch.tensor([0.3, 1.0, -0.9]) / 2
    quat = torch.stack([torch.cos(half), torch.zeros(3), torch.zeros(3), torch.sin(half)], -1)
    expected = torch.tensor([[0.3, 0.3], [1.0 - math.pi / 2] * 2, [-0.9 + math.pi / 2] * 2])
    assert torch.allclose(face_yaw(quat), expected, atol=1e-5)


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: HandoverGoal(z=(0.05, 0.20)), "goal.z"),
        (lambda: HandoverGoal(x=(-0.2, 0.1)), "goal.x"),
        (lambda: HandoverGoal(min_giver_open=0.01), "goal.min_giver_open"),
        (lambda: HandoverConfig(cube_size=0.03), "env.cube_size"),
        (lambda: HandoverConfig(start_x=0.1), "env.start_x"),
        (lambda: HandoverConfig(reward="sparse"), "env.reward"),
        (lambda: HandoverConfig(randomization=RandomizationConfig(com_shift=(-0.02, 0.02))), "randomization.com_shift"),
        (lambda: HandoverConfig(randomization=RandomizationConfig(action_latency=(0, 8))), "action_latency"),
        (lambda: HandoverConfig(episode_seconds=1.0), "goal.hold_seconds"),
        (lambda: HandoverExpertConfig(finger_force=-30.0), "expert.finger_force"),
    ],
)
def test_out_of_range_settings_are_refused_naming_the_field(make, field):
    with pytest.raises(ConfigError, match=field):
        make()


def test_the_task_is_registered_with_its_config_and_expert():
    import yaml

    from envs.config_io import from_dict, to_yaml
    from envs.task import get_task, task_names, task_of_config

    cfg = HandoverConfig(cube_size=0.045, goal=HandoverGoal(z=(0.12, 0.2)))
    assert from_dict(HandoverConfig, yaml.safe_load(to_yaml(cfg))) == cfg, "the config survives its YAML"

    task = get_task("bimanual-handover")
    assert "bimanual-handover" in task_names() and task_of_config(HandoverConfig()) is task
    assert task.expert is not None and task.factor_bounds["object_size"] == (0.035, 0.05)
    assert task.latency_classes(HandoverConfig()) == {"action_latency": 3}


# --------------------------------------------------------------------------------------------- Genesis env
N = 4


@pytest.fixture(scope="module")
def env():
    from envs.bimanual.handover import HandoverEnv, nominal_handover

    env = HandoverEnv(nominal_handover(HandoverConfig(num_envs=N, seed=3)))
    yield env
    env.close()


def stage_of(cube=(-0.28, 0.0, 0.02), giver=(-0.35, 0.05, 0.10), receiver=(0.13, 0.0, 0.024), touch=(0, 0, 0, 0),
             told=(2.0, 2.0), width=(0.08, 0.08), giver_yaw=0.0) -> str:  # fmt: skip
    """The expert's stage of one hand-made state: the cube's centre (a 4 cm cube, at rest at z 0.02, square to the
    table), the giver's and receiver's TCPs, the four finger contacts (giver's two, receiver's two), the finger forces
    last told (N), the grippers' openings (m) and the giver's yaw target (rad)."""
    lo, hi = -6.0, 2.0
    prev = torch.zeros(1, 10)
    prev[0, 4], prev[0, 9] = (2.0 * (torch.tensor(told) - lo) / (hi - lo) - 1.0).tolist()
    ctrl = SimpleNamespace(
        cfg=SimpleNamespace(finger_force_range=(lo, hi)), target_yaw=torch.tensor([[giver_yaw, 0.0]])
    )
    env = SimpleNamespace(
        rest_height=0.02, object_size=0.04, prev_action=prev, num_envs=1, cfg=SimpleNamespace(goal=GOAL), ctrl=ctrl
    )
    qpos = torch.zeros(1, 2, 9)
    qpos[0, :, -2:] = torch.tensor(width)[:, None] / 2
    s = {
        "object_pose": torch.tensor([[*cube, 1.0, 0.0, 0.0, 0.0]]),
        "tcp_pos": torch.tensor([[giver, receiver]]),
        "finger_touch": torch.tensor(touch, dtype=torch.bool).view(1, 2, 2),
        "qpos": qpos,
        "giver_open": torch.tensor([width[0]]),
    }
    return STAGES[int(infer_stage(env, s, HandoverExpertConfig())[0])]


DOWN = (0.03, 0.0, 0.024)  # a TCP down at the handoff point
HELD = {"touch": (1, 1, 0, 0), "told": (-5.0, 2.0), "width": (0.04, 0.08)}  # the giver holds the cube
HANDED = {"touch": (0, 0, 1, 1), "told": (2.0, -5.0), "width": (0.08, 0.04)}  # the receiver holds it, the giver let go
STAGE_CASES = [
    ({}, "approach"),
    ({"giver": (-0.28, 0.0, 0.08)}, "descend"),
    ({"giver": (-0.28, 0.0, 0.08), "giver_yaw": 0.5}, "approach"),  # over the cube, not turned to its faces
    ({"giver": (-0.28, 0.0, 0.024)}, "close"),
    ({"giver": (-0.28, 0.0, 0.03), "told": (-2.0, 2.0), "width": (0.06, 0.08)}, "close"),  # still closing
    ({"giver": (-0.28, 0.0, 0.03), "told": (-5.0, 2.0), "width": (0.01, 0.08)}, "descend"),  # shut on nothing: again
    ({"giver": (-0.28, 0.0, 0.03), **HELD}, "carry"),
    ({"giver": (-0.28, 0.0, 0.03), **HELD, "told": (-1.0, 2.0)}, "close"),  # not yet squeezed: no hold
    ({"cube": (-0.1, 0.0, 0.06), "giver": (-0.1, 0.0, 0.045), **HELD, "touch": (1, 0, 0, 0)}, "close"),  # one finger
    ({"cube": (0.03, 0.0, 0.06), "giver": (0.03, 0.0, 0.045), **HELD}, "lower"),
    ({"cube": (0.03, 0.0, 0.04), "giver": DOWN, **HELD}, "release"),  # held high in the fingers: dropped from there
    ({"cube": (0.03, 0.0, 0.02), "giver": DOWN, "touch": (1, 0, 0, 0), "width": (0.05, 0.08)}, "release"),  # opening
    ({"cube": (0.03, 0.0, 0.02), "giver": (-0.1, 0.0, 0.05)}, "swap"),
    ({"cube": (0.03, 0.0, 0.02), "giver": (-0.1, 0.0, 0.05), "receiver": DOWN}, "receive"),
    ({"cube": (0.03, 0.0, 0.02), "giver": (-0.1, 0.0, 0.05), "receiver": DOWN, **HANDED}, "deliver"),
    ({"cube": (0.1, 0.0, 0.15), "giver": (-0.1, 0.0, 0.05), "receiver": (0.1, 0.0, 0.135), **HANDED}, "deliver"),
    ({"cube": (0.1, 0.0, 0.15), **HELD, "giver": (0.1, 0.0, 0.13), "touch": (1, 1, 1, 1)}, "carry"),  # both hold it
    ({"cube": (0.12, 0.05, 0.02), "giver": (-0.1, 0.0, 0.05)}, "approach"),  # dropped off the handoff point
]


@pytest.mark.parametrize(("state", "stage"), STAGE_CASES)
def test_the_expert_reads_its_stage_off_the_state(state, stage):
    assert stage_of(**state) == stage


@pytest.mark.genesis
def test_the_scripted_expert_hands_the_cube_over_at_nominal_settings(env):
    from envs.bimanual.env import FACTOR_NAMES
    from envs.bimanual.handover_expert import HandoverExpert
    from envs.bimanual.task import BimanualEvalConfig, run_episodes, summarize

    obs = env.get_observations()
    assert obs["env_factors"].shape == (N, len(FACTOR_NAMES))
    size = obs["env_factors"][:, FACTOR_NAMES.index("object_size")]
    assert torch.allclose(size, torch.full((N,), -1.0 / 3.0)), "a 4 cm cube, a third of the way from 3.5 to 5 cm"
    start = obs["teacher"][:, :3]
    assert (start[:, 0] < -0.2).all() and torch.allclose(start[:, 2], torch.full((N,), 0.02), atol=1e-3)
    records = run_episodes(HandoverExpert(env), env, BimanualEvalConfig(episodes=N, seed=11))
    metrics = summarize(records)
    assert metrics["success"] == 1.0, records
    assert metrics["error_episodes"] == 0.0 and metrics["max_height"] >= GOAL.z[0]


def test_the_handover_teacher_presets_build_for_their_task():
    """`train_teacher --task bimanual-handover`: each preset is the handover's, warm-started from its expert."""
    from envs.task import task_of_config
    from experiments.train_teacher import HANDOVER_PRESETS

    assert set(HANDOVER_PRESETS) == {"default", "smoke"}
    for _, cfg in HANDOVER_PRESETS.values():
        assert task_of_config(cfg.env).name == "bimanual-handover"
        assert cfg.warm_start.expert_steps > 0 and not cfg.env.observations.camera


@pytest.mark.genesis
def test_a_fresh_expert_taking_over_mid_episode_acts_as_the_one_that_ran_from_the_start(env):
    # the stage is the state's, not the expert's memory: DAgger's expert labels a clone's states this way
    from envs.bimanual.handover_expert import HandoverExpert

    env.generator.manual_seed(5)
    obs, _ = env.reset()
    expert = HandoverExpert(env)
    seen = set()
    for t in range(110):
        action = expert.act(obs)
        seen.update(expert.stage.tolist())
        if t % 10 == 9:
            fresh = HandoverExpert(env)
            assert torch.equal(fresh.act(obs), action), t
            assert torch.equal(fresh.stage, expert.stage)
        obs, *_ = env.step(action)
    assert {STAGES.index(k) for k in ("approach", "carry", "swap")} <= seen, seen


@pytest.mark.genesis
def test_the_progress_reward_keeps_each_envs_best_since_its_reset(env):
    from envs.bimanual.env import REACH_SCALE
    from envs.bimanual.handover import HANDOVER_PROGRESS
    from envs.bimanual.handover_expert import HandoverExpert

    assert env.cfg.reward == "progress"
    obs, _ = env.reset()
    expert, best = HandoverExpert(env), torch.zeros(N, len(HANDOVER_PROGRESS))
    for _ in range(60):
        obs, _, dones, _ = env.step(expert.act(obs))
        assert not dones.any()
        s = env._state
        terms = handover_terms(s["object_pose"][:, :3], s["tcp_pos"], s["finger_touch"], s["giver_open"], env.cfg.goal,
                               env.carry_start_x, env.rest_height, REACH_SCALE)  # fmt: skip
        best = torch.maximum(best, torch.stack([terms[k] for k in HANDOVER_PROGRESS], -1))
    assert torch.allclose(env.best, best) and (best[:, list(HANDOVER_PROGRESS).index("carry")] > 0.3).all()
    saved = env.state_dict()
    env._reset_idx(torch.tensor([0]))
    assert (env.best[0] == 0).all() and torch.equal(env.best[1:], best[1:]), "a masked reset clears only its env"
    env.load_state_dict(saved)
    assert torch.equal(env.best, best)
