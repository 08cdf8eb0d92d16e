"""Checkpoint loading refuses files that hold pickled objects, and says so without advising to lift the protection."""

from __future__ import annotations

import pytest
import torch

from datasets.checkpoints import CheckpointError, load_checkpoint, save_atomic


class MotorGain:
    """A plain Python object: unpickling it needs its class, which `weights_only` loading refuses."""

    def __init__(self, value: float) -> None:
        self.value = value


def test_a_checkpoint_with_a_pickled_object_is_refused_without_advising_weights_only_false(tmp_path):
    path = save_atomic({"kind": "teacher", "actor": {"w": torch.zeros(2)}, "gain": MotorGain(1.5)}, tmp_path / "c.pt")
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(path, kind="teacher")
    message = str(caught.value)
    assert message.startswith(f"{path}: holds objects other than tensors and plain data")
    assert "MotorGain" in message and "is not loaded" in message
    assert "weights_only" not in message and "\n" not in message


def test_a_checkpoint_of_tensors_and_plain_data_loads(tmp_path):
    payload = {"kind": "teacher", "actor": {"w": torch.arange(3.0)}, "iteration": 7, "config": "a: 1\n"}
    data = load_checkpoint(save_atomic(payload, tmp_path / "c.pt"), kind="teacher", required=("actor",))
    assert torch.equal(data["actor"]["w"], torch.arange(3.0)) and data["iteration"] == 7
