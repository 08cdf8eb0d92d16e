import json
import math

import pytest
import torch

from envs.errors import ActionSpaceError, ConfigError
from envs.racing.car import ACTION_SPACES, ActionSpace, Calibration, CarSpec, interp1d, load_action_space


def test_default_action_space_is_five_angles_by_two_speeds():
    space = ACTION_SPACES["default"]
    assert space.kind == "discrete" and space.num_choices == 10 and space.num_actions == 1
    assert sorted({a for a, _ in space.choices}) == [-30.0, -15.0, 0.0, 15.0, 30.0]
    assert len({s for _, s in space.choices}) == 2


def test_metadata_round_trip(tmp_path):
    for name, space in ACTION_SPACES.items():
        path = tmp_path / f"{name}.json"
        space.save(path)
        data = json.loads(path.read_text())
        assert data["sensor"] == ["FRONT_FACING_CAMERA"]
        assert data["action_space_type"] == space.kind
        assert ActionSpace.load(path) == space


def test_discrete_and_continuous_commands():
    space = ACTION_SPACES["default"]
    steer, speed = space.to_commands(torch.tensor([[0.0], [9.0]]))
    assert steer.tolist() == pytest.approx([math.radians(-30.0), math.radians(30.0)])
    assert speed.tolist() == pytest.approx([space.choices[0][1], space.choices[9][1]])
    cont = ActionSpace(kind="continuous", steering_range=(-20.0, 30.0), speed_range=(1.0, 3.0))
    steer, speed = cont.to_commands(torch.tensor([[-1.0, -1.0], [1.0, 1.0], [0.0, 0.0], [5.0, -5.0]]))
    assert torch.rad2deg(steer).tolist() == pytest.approx([-20.0, 30.0, 5.0, 30.0], abs=1e-4)
    assert speed.tolist() == pytest.approx([1.0, 3.0, 2.0, 1.0])


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"action_space": [{"steering_angle": 0, "speed": 1}], "colour": 1}, "unknown keys"),
        ({"action_space": [{"steering_angle": 45, "speed": 1}]}, "outside ±30"),
        ({"action_space": []}, "non-empty"),
        ({"action_space": [{"steering_angle": 0, "speed": 9}]}, "speed 9"),
        ({"action_space": [{"steering_angle": 0, "speed": 1, "brake": 1}]}, r"action_space\[0\] has unknown keys"),
        ({"action_space": [{"steering_angle": "left", "speed": 1}]}, "not a finite number"),
        (
            {
                "action_space": {"steering_angle": {"low": 10, "high": -10}, "speed": {"low": 1, "high": 2}},
                "action_space_type": "continuous",
            },
            "steering_angle box",
        ),
        ({"sensor": ["FRONT_FACING_CAMERA"]}, "missing 'action_space'"),
    ],
)
def test_invalid_metadata_names_the_problem(tmp_path, data, message):
    path = tmp_path / "model_metadata.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ActionSpaceError, match=message) as err:
        ActionSpace.load(path)
    assert "model_metadata.json" in str(err.value)


def test_invalid_json_and_unknown_names(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    with pytest.raises(ActionSpaceError, match="invalid JSON"):
        ActionSpace.load(path)
    with pytest.raises(ConfigError, match="unknown action space"):
        load_action_space("turbo")


def test_calibration_interpolates_measured_values(tmp_path):
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"steering": {"command": [-30, 0, 30], "measured": [-24, 1, 28]},
                                "speed": {"command": [0, 2, 4], "measured": [0, 1.5, 3.5]}}))  # fmt: skip
    cal = Calibration.load(path)
    steer, speed = cal.apply(
        torch.deg2rad(torch.tensor([-30.0, -15.0, 15.0, 40.0])), torch.tensor([1.0, 2.0, 3.0, 5.0])
    )
    assert torch.rad2deg(steer).tolist() == pytest.approx([-24.0, -11.5, 14.5, 28.0], abs=1e-4)
    assert speed.tolist() == pytest.approx([0.75, 1.5, 2.5, 3.5])
    ident = Calibration()
    s, v = ident.apply(torch.tensor([0.1]), torch.tensor([2.0]))
    assert s.item() == pytest.approx(0.1) and v.item() == pytest.approx(2.0)
    path.write_text(json.dumps({"steering": {"command": [0, 0], "measured": [0, 1]}}))
    with pytest.raises(ActionSpaceError, match="strictly increasing"):
        Calibration.load(path)


def test_interp1d_hand_example():
    x = torch.tensor([-1.0, 0.0, 0.5, 2.0, 9.0])
    assert interp1d(x, (0.0, 1.0, 3.0), (0.0, 10.0, 20.0)).tolist() == pytest.approx([0.0, 0.0, 5.0, 15.0, 20.0])


def test_car_spec_validation():
    assert CarSpec().cg_to_rear == pytest.approx(0.082)
    with pytest.raises(ConfigError, match="car.max_steering_deg"):
        CarSpec(max_steering_deg=60.0)
