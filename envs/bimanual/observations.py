"""State reads of a bimanual scene: what one control step reads back for observations (both arms, the object, the
fingers' contact forces)."""

from __future__ import annotations

import torch
from torch import Tensor

from envs.bimanual.control import BimanualController
from envs.bimanual.scene import BimanualScene


def read_state(bs: BimanualScene, ctrl: BimanualController) -> dict[str, Tensor]:
    """Privileged state, each entry with leading `num_envs`: joint positions and velocities `(N, 2, 9)`, TCP
    positions `(N, 2, 3)` and yaws `(N, 2)`, their targets, the object's pose `(N, 7)` and velocity `(N, 6)`, and the
    net contact force on each finger `(N, 2, 2, 3)`."""
    poses = ctrl.poses()
    contact = torch.stack([arm.get_links_net_contact_force() for arm in bs.arms], 1)  # (N, 2, links, 3)
    fingers = [bs.arms[0].get_link(name).idx_local for name in ("left_finger", "right_finger")]
    return {
        "qpos": torch.stack([arm.get_dofs_position() for arm in bs.arms], 1),
        "qvel": torch.stack([arm.get_dofs_velocity() for arm in bs.arms], 1),
        "tcp_pos": poses.pos,
        "tcp_yaw": poses.yaw,
        "target_pos": ctrl.target_pos.clone(),
        "target_yaw": ctrl.target_yaw.clone(),
        "object_pose": torch.cat([bs.object.get_pos(), bs.object.get_quat()], -1),
        "object_vel": torch.cat([bs.object.get_vel(), bs.object.get_ang()], -1),
        "finger_contact": contact[:, :, fingers],
    }
