"""The student model: camera frame + previous action + history -> action, z-hat and the explicit estimates.

`forward_window` trains on windows `(B, T, ...)`; `step` runs one frame at a time with explicit recurrent state
(the history encoder's buffer or hidden state), exactly what the car runs. `StudentPolicy` wraps a model for
batched envs: it owns the per-env state and resets it on `done`.

A student distilled with an auxiliary privileged-observation loss (`OutputSpec.privileged_dim` > 0) also has a
`privileged_head` that predicts the teacher's own observation from the features the policy head reads; only
`forward_window(..., privileged=True)` runs it, so the action path (`step`, the exported graphs) never does.

A frozen-head student (`--student.head frozen-teacher`, RMA's second phase) acts through the teacher's own trunk instead
of a free policy head: its privileged head estimates the teacher's normalized observation, its history encoder z, and
`student.teacher_head.FrozenTeacherHead` maps the two to the action (see that module). Its output spec holds the
teacher layout it expects (`teacher_head`); the trunk's weights are part of its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

import torch
from einops import rearrange
from tensordict import TensorDict
from torch import Tensor, nn

from adaptation.factor_estimator import EstimatorConfig, FactorEstimator
from adaptation.history_encoder import HistoryConfig, HistoryEncoder
from adaptation.odometry import OdometryTracker, PlanarOdometry
from envs.camera_model import CameraConfig
from envs.errors import ConfigError, check_range
from envs.task import EstimateSpec
from student.networks import EncoderConfig, ImageEncoder, PolicyHead, PrivilegedHead, scale_frames
from student.teacher_head import FrozenTeacherHead, TeacherHeadSpec, check_head
from teacher.policy import TeacherPolicy


@dataclass(frozen=True)
class StudentConfig:
    """Student architecture."""

    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    """image encoder"""
    history: HistoryConfig = field(default_factory=HistoryConfig)
    """history encoder (kind none = memoryless student)"""
    estimator: EstimatorConfig = field(default_factory=EstimatorConfig)
    """second-stage estimator of the latencies, friction and motor gain from the previous actions and the history
    encoder's motion estimates (used only with a history encoder)"""
    head: Literal["free", "frozen-teacher"] = "free"
    """the policy head: `free`, an MLP trained on the teacher's actions; `frozen-teacher`, the teacher's own trunk
    (frozen) fed the student's estimates of the teacher's normalized observation and z (RMA's second phase): DAgger's
    action loss trains the estimates through it, beside `--dagger.privileged-weight` (which must be above 0) and
    `--dagger.z-weight`. Needs a history encoder (z-hat); `head_hidden` and `head_dropout` do not apply"""
    head_hidden: tuple[int, ...] = (256, 128)
    """policy head widths (free head)"""
    head_dropout: float = 0.0
    """dropout before the policy head's output layer (free head)"""
    burn_in: int = 16
    """GRU only: steps of a training window that only build up the hidden state"""
    proprio: Literal["previous-action", "all"] = "previous-action"
    """what the student reads of the task's `proprio` group besides the camera: `previous-action`, its leading columns
    that hold the previous action; `all`, the whole group (an arm's joint positions, gripper widths and wrench estimate
    besides the previous action)"""

    def __post_init__(self) -> None:
        check_range("student.head_dropout", self.head_dropout, 0.0, 0.9)
        check_range("student.burn_in", self.burn_in, 1, 1000)

    @property
    def has_estimator(self) -> bool:
        return self.history.kind != "none" and self.estimator.kind != "none"

    @property
    def estimates_context(self) -> int:
        """Steps before a position that its latency, friction and motor-gain estimates depend on."""
        return self.context + (self.estimator.receptive_field - 1 if self.has_estimator else 0)

    @property
    def context(self) -> int:
        """Steps before a training position that its output depends on (its loss needs them in the window); a motion
        encoder reads one frame further back. The factor estimator's outputs read further back still
        (`estimates_context`); training windows are sized for the policy."""
        extra = 1 if self.encoder.motion else 0
        if self.history.kind == "tcn":
            return self.history.receptive_field - 1 + extra
        if self.history.kind == "gru":
            return self.burn_in + extra
        return extra


@dataclass(frozen=True)
class OutputSpec:
    """What the student reads and predicts, fixed by the task, teacher and env it is distilled from."""

    kind: str  # discrete | continuous
    num_outputs: int  # logits (discrete) or action means (continuous)
    latent_dim: int
    estimates: EstimateSpec
    latency_classes: dict[str, int]
    """classes (physics substeps) of each latency estimate, in `estimates.latencies` order"""
    proprio_dim: int = 2
    """leading columns of the `proprio` group the student reads (the previous action first)"""
    task: str = "racing"
    privileged_dim: int = 0
    """width of the teacher's privileged observation the student predicts as an auxiliary training target (0: no such
    head; students saved before the head existed read as 0)"""
    teacher_head: TeacherHeadSpec | None = None
    """the teacher a frozen-head student expects and its trunk's architecture (None: a free-head student)"""
    image_hw: tuple[int, int] = (120, 160)
    """camera frame height and width (students saved before tasks had other cameras read 120 x 160)"""
    previous_action_dim: int = 0
    """leading columns of what the student reads of `proprio` that hold the previous action (0: all `proprio_dim`
    of them, as for students that read the previous action alone)"""

    def __post_init__(self) -> None:
        if list(self.latency_classes) != list(self.estimates.latencies):
            raise ValueError(f"latency classes {list(self.latency_classes)} != latencies {self.estimates.latencies}")
        if not 0 <= self.previous_action_dim <= self.proprio_dim:
            raise ValueError(f"previous_action_dim {self.previous_action_dim} outside 0..{self.proprio_dim}")

    @property
    def action_columns(self) -> int:
        """How many leading columns of the student's proprio input are the previous action."""
        return self.previous_action_dim or self.proprio_dim

    def to_dict(self) -> dict:
        return {
            "kind": self.kind, "num_outputs": self.num_outputs, "latent_dim": self.latent_dim,
            "estimates": self.estimates.to_dict(), "latency_classes": dict(self.latency_classes),
            "proprio_dim": self.proprio_dim, "task": self.task, "privileged_dim": self.privileged_dim,
            "teacher_head": None if self.teacher_head is None else self.teacher_head.to_dict(),
            "image_hw": list(self.image_hw), "previous_action_dim": self.previous_action_dim,
        }  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict) -> OutputSpec:
        return cls(
            str(data["kind"]), int(data["num_outputs"]), int(data["latent_dim"]),
            EstimateSpec.from_dict(data["estimates"]), {k: int(v) for k, v in data["latency_classes"].items()},
            int(data["proprio_dim"]), str(data["task"]), int(data.get("privileged_dim", 0)),
            None if data.get("teacher_head") is None else TeacherHeadSpec.from_dict(data["teacher_head"]),
            tuple(int(v) for v in data.get("image_hw", (120, 160))), int(data.get("previous_action_dim", 0)),
        )  # fmt: skip


def previous_frames(camera: Tensor, mask: Tensor) -> Tensor:
    """`(B, T, ...)` frames -> each step's previous frame: the step before it, or the frame itself at a window's
    first step and at an episode's first (the step after padding), as a freshly reset deployment state pairs it."""
    prev = torch.cat([camera[:, :1], camera[:, :-1]], dim=1)
    start = torch.ones_like(mask)
    start[:, 1:] = ~mask[:, :-1]
    return torch.where(start.view(*mask.shape, *([1] * (camera.dim() - 2))), camera, prev)


class StudentModel(nn.Module):
    def __init__(self, cfg: StudentConfig, spec: OutputSpec) -> None:
        super().__init__()
        self.cfg, self.spec = cfg, spec
        self.image_hw = tuple(spec.image_hw)
        self.encoder = ImageEncoder(cfg.encoder, self.image_hw)
        e, p = cfg.encoder.embed_dim, spec.proprio_dim
        if cfg.history.kind == "none":
            self.history = None
            head_in = e + p
        else:
            self.history = HistoryEncoder(
                cfg.history, e, spec.latent_dim, spec.latency_classes, len(spec.estimates.regressions), p
            )
            head_in = e + self.history.out_dim + p
        self.estimator = None
        if cfg.has_estimator:
            classes = spec.latency_classes
            if set(classes) != {"action_latency", "camera_latency"}:
                raise ConfigError(
                    f"student.estimator: the factor estimator is a vehicle's (action and camera latency, friction, "
                    f"motor gain); task {spec.task!r} estimates {spec.estimates.targets}: use --student.estimator.kind "
                    "none"
                )
            if spec.proprio_dim != spec.action_columns:
                raise ConfigError(
                    "student.estimator: the factor estimator reads the previous action alone; with --student.proprio "
                    "all use --student.estimator.kind none"
                )
            self.estimator = FactorEstimator(cfg.estimator, classes["action_latency"], classes["camera_latency"])
        frozen = check_head(cfg.head, cfg.history.kind, spec)
        self.head = None if frozen else PolicyHead(head_in, spec.num_outputs, cfg.head_hidden, cfg.head_dropout)
        # The privileged head reads what the policy head reads: the frame's embedding (the track geometry ahead, the
        # lateral offset and heading error are in the image, and the gradient reaches the image encoder directly,
        # not through the history encoder), the history features (speed and yaw rate, and the state the delayed
        # frame lags behind, need several frames) and the previous action. Built last, so the other modules start from
        # the same weights with or without it.
        self.privileged_head = PrivilegedHead(head_in, spec.privileged_dim) if spec.privileged_dim > 0 else None
        self.teacher_head = (
            FrozenTeacherHead(spec.teacher_head, spec.num_outputs, spec.action_columns) if spec.teacher_head else None
        )

    def adopt_teacher(self, teacher: TeacherPolicy) -> None:
        """Take what the student reads of its teacher: the privileged head's normalization (the teacher's observation
        normalizer) and a frozen head's trunk weights (a teacher of another layout is refused, naming both)."""
        if self.teacher_head is not None:
            self.teacher_head.copy_teacher(teacher)
        if self.privileged_head is not None:
            centre, scale = teacher.observation_scale()
            device = self.privileged_head.centre.device
            self.privileged_head.set_normalization(centre.to(device), scale.to(device))

    def trainable_parameters(self) -> Iterator[nn.Parameter]:
        """What the optimizer updates: every parameter but a frozen head's."""
        return (p for p in self.parameters() if p.requires_grad)

    def teacher_action(self, observation: Tensor, z: Tensor, prev_action: Tensor) -> Tensor:
        """A frozen-head student's outputs `(..., A)` from the teacher's normalized observation `(..., D)` (its
        previous-action columns are replaced by `prev_action` `(..., P)`) and z `(..., latent_dim)`."""
        observation = self.teacher_head.observation(observation, prev_action, self.privileged_head)
        return self.teacher_head(observation, z)

    def _previous(self, proprio: Tensor) -> Tensor:
        """The previous action: the leading columns of what the student reads of `proprio`."""
        return proprio[..., : self.spec.action_columns]

    def _act(self, features: Tensor, heads: dict[str, Tensor], prev_action: Tensor) -> tuple[Tensor, Tensor | None]:
        """The policy's outputs from the policy head's input `features`, and a frozen-head student's estimate of the
        teacher's normalized observation as its trunk reads it (None for a free head)."""
        if self.teacher_head is None:
            return self.head(features), None
        estimate = self.teacher_head.observation(self.privileged_head(features), prev_action, self.privileged_head)
        return self.teacher_head(estimate, heads["z_hat"]), estimate

    def forward_window(
        self,
        camera: Tensor,
        prev_action: Tensor,
        mask: Tensor,
        context_no_grad: int = 0,
        grad_stride: int = 1,
        privileged: bool = False,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """camera `(B, T, 1, H, W)`, prev_action `(B, T, P)` (what the student reads of `proprio`, the previous action
        first), mask `(B, T)` -> outputs `(B, T, A)`, heads.

        With `privileged`, the heads also hold `privileged` `(B, T, privileged_dim)`: the privileged head's normalized
        prediction of the teacher's observation (a student without that head refuses).

        The first `context_no_grad` frames of each window are encoded without gradients (they only feed the
        history of later steps), which saves two thirds of their cost in training. After them, only every
        `grad_stride`-th frame is encoded with gradients: the image encoder learns from a subset of the supervised
        frames (15 Hz neighbours are nearly the same image), while the history encoder and the policy head still
        read and train on every frame. The outputs are the same whatever the two settings; only which frames
        carry gradients into the encoder changes. A motion encoder pairs each frame with the one before it; at an
        episode's first frame (and the window's first) that is the frame itself."""
        b, t = camera.shape[:2]
        c = min(context_no_grad, t)
        previous = previous_frames(camera, mask) if self.encoder.motion else None

        def encode(idx: Tensor | slice) -> Tensor:
            frames = camera[:, idx]
            prev = None if previous is None else rearrange(previous[:, idx], "b t c h w -> (b t) c h w")
            emb = self.encoder(rearrange(frames, "b t c h w -> (b t) c h w"), prev)
            return rearrange(emb, "(b t) e -> b t e", b=b)

        if grad_stride > 1 and t - c > 1:
            pos = torch.arange(t, device=camera.device)
            with_grad = (pos >= c) & ((pos - c) % grad_stride == 0)
            grad_idx, rest_idx = pos[with_grad], pos[~with_grad]
            with torch.no_grad():
                rest = encode(rest_idx)
            # Put the two groups back in time order (indexing keeps the gradient of the encoded group).
            order = torch.argsort(torch.cat([rest_idx, grad_idx]))
            emb = torch.cat([rest, encode(grad_idx)], dim=1)[:, order]
        elif c > 0:
            with torch.no_grad():
                ctx = encode(slice(0, c))
            emb = torch.cat([ctx, encode(slice(c, t))], dim=1)
        else:
            emb = encode(slice(0, t))
        prev_action = prev_action * mask.unsqueeze(-1)
        if privileged and self.privileged_head is None:
            raise ConfigError("this student has no privileged head (its output spec's privileged_dim is 0)")
        if self.history is None:
            features, heads = torch.cat([emb, prev_action], -1), {}
        else:
            h = self.history(torch.cat([emb, prev_action], -1), mask)
            heads = self.history.heads(h)
            if self.estimator is not None and not self.estimator.reads_odometry:  # odometry is not in the window
                heads = FactorEstimator.merge(
                    heads, self.estimator(FactorEstimator.inputs(self._previous(prev_action), heads["estimates"]), mask)
                )
            features = torch.cat([emb, h, prev_action], -1)
        outputs, estimate = self._act(features, heads, prev_action)
        if privileged:
            heads = {**heads, "privileged": self.privileged_head(features) if estimate is None else estimate}
        return outputs, heads

    def _state_parts(self) -> list[torch.Size]:
        """Per-env shapes of the deployment state's parts: history state, factor estimator inputs (if any), previous
        frame and `seen` flag (motion encoders)."""
        hist = (1, 1) if self.history is None else self.history.init_state(1, "meta").shape[1:]
        parts = [torch.Size(hist)]
        if self.estimator is not None:
            parts.append(self.estimator.init_state(1, "meta").shape[1:])
        if self.encoder.motion:
            parts.append(torch.Size((self.image_hw[0] * self.image_hw[1] + 1,)))
        return parts

    def init_state(self, n: int, device: torch.device | str = "cpu") -> Tensor:
        """Zeros (a reset state). With more than one part the state is flat, the parts in `_state_parts` order; a
        motion encoder's part is `[previous frame (scaled), seen]`, where `seen` = 0 marks an episode start (the frame
        is paired with itself), so zeroing still resets it."""
        parts = self._state_parts()
        if len(parts) == 1:
            return torch.zeros(n, *parts[0], device=device)
        return torch.zeros(n, sum(p.numel() for p in parts), device=device)

    def step(
        self, camera: Tensor, prev_action: Tensor, state: Tensor, motion: Tensor | None = None
    ) -> tuple[Tensor, dict[str, Tensor], Tensor]:
        """One frame: camera `(N, 1, H, W)`, prev_action `(N, P)`, state -> outputs `(N, A)`, heads, new state.

        A factor estimator that reads odometry takes `motion` `(N, 3)`: the normalized body velocities the odometry
        measured between the previous frame and this one (`adaptation.odometry.OdometryTracker`); without it the
        estimator is not run (its state part is kept as it was) and the heads are the history encoder's own."""
        n, parts = camera.shape[0], self._state_parts()
        if len(parts) == 1:
            pieces = [state]
        else:
            sizes = [p.numel() for p in parts]
            pieces = [x.reshape(n, *p) for x, p in zip(torch.split(state, sizes, dim=1), parts)]
        hist, new = pieces[0], []
        if self.encoder.motion:
            (hgt, wid), motion = self.image_hw, pieces[-1]
            frame = scale_frames(camera)
            seen = motion[:, -1:].view(n, 1, 1, 1) > 0.5
            previous = torch.where(seen, motion[:, :-1].view(n, 1, hgt, wid), frame)
            emb = self.encoder(frame, previous)
        else:
            emb = self.encoder(camera)
        if self.history is None:
            features, heads = torch.cat([emb, prev_action], -1), {}
        else:
            h, hist = self.history.step(torch.cat([emb, prev_action], -1), hist)
            features, heads = torch.cat([emb, h, prev_action], -1), self.history.heads(h)
        outputs = self._act(features, heads, prev_action)[0]
        new.append(hist)
        if self.estimator is not None:
            if not self.estimator.reads_odometry:
                inputs = FactorEstimator.inputs(self._previous(prev_action), heads["estimates"])
            elif motion is not None:
                inputs = torch.cat([self._previous(prev_action), motion.to(prev_action.dtype)], -1)
            else:
                inputs = None
            if inputs is None:
                new.append(pieces[1])
            else:
                ours, est_state = self.estimator.step(inputs, pieces[1])
                heads = FactorEstimator.merge(heads, ours)
                new.append(est_state)
        if self.encoder.motion:
            ones = torch.ones(n, 1, device=state.device, dtype=state.dtype)
            new.append(torch.cat([frame.flatten(1).to(state.dtype), ones], dim=1))
        if len(new) == 1:
            return outputs, heads, new[0]
        return outputs, heads, torch.cat([x.flatten(1) for x in new], dim=1)

    def actions(self, outputs: Tensor) -> Tensor:
        """Deterministic actions: the most likely index `(…, 1)` or the clamped means `(…, A)`."""
        if self.spec.kind == "discrete":
            return outputs.argmax(-1, keepdim=True).float()
        return outputs.clamp(-1.0, 1.0)  # a box policy's means, in the box [-1, 1] its env maps onto the commands


class StudentPolicy:
    """A student driving batched envs: owns the per-env recurrent state (reset on done).

    A student whose factor estimator reads odometry gets its motion from an `OdometryTracker` over the camera frames
    when `optics` (the env's calibrated camera) and the control period `dt` are given; without them it drives the
    same and its heads are the history encoder's own (DAgger's rollouts need no estimates and skip the odometry's
    cost)."""

    def __init__(
        self,
        model: StudentModel,
        num_envs: int,
        device: torch.device | str = "cpu",
        optics: CameraConfig | None = None,
        dt: float | None = None,
    ) -> None:
        self.model, self.device = model, torch.device(device)
        self.state = model.init_state(num_envs, self.device)
        self.last_heads: dict[str, Tensor] = {}
        self.last_outputs: Tensor | None = None
        self.tracker: OdometryTracker | None = None
        if model.estimator is not None and model.estimator.reads_odometry and optics is not None:
            if dt is None:
                raise ValueError("StudentPolicy: the odometry needs the control period dt")
            self.tracker = OdometryTracker(PlanarOdometry(optics), dt, num_envs, self.device)

    @torch.no_grad()
    def act(self, obs: TensorDict) -> Tensor:
        was_training = self.model.training
        self.model.eval()
        motion = None
        if self.tracker is not None:
            motion = self.tracker.estimator_inputs(obs["camera"].to(self.device))
        proprio = obs["proprio"][:, : self.model.spec.proprio_dim]
        outputs, heads, self.state = self.model.step(obs["camera"], proprio, self.state, motion)
        self.model.train(was_training)
        self.last_outputs, self.last_heads = outputs, heads
        return self.model.actions(outputs)

    def reset(self, dones: Tensor) -> None:
        """Clear the history of envs whose episode ended (their next frame starts a new episode)."""
        if bool(dones.any()):
            self.state[dones.to(self.state.device)] = 0.0
            if self.tracker is not None:
                self.tracker.reset(dones)

    def resize(self, num_envs: int) -> None:
        self.state = self.model.init_state(num_envs, self.device)
        if self.tracker is not None:
            self.tracker.resize(num_envs, self.device)
