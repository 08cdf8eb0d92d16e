"""The deployment loop's watchdog on its own period, with a fake clock (no real sleeps) and a fake runtime."""

from __future__ import annotations

import numpy as np
import pytest

from envs.errors import ConfigError
from envs.racing.deploy import Command
from student.deploy import LoopConfig, drive

PERIOD = 1.0 / 15.0


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += max(0.0, s)


class FreshFrames:
    """A camera that always has a fresh frame."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock

    def read(self) -> tuple[np.ndarray, float]:
        return np.full((120, 160), 100, np.uint8), self.clock.t


class SlowRuntime:
    """Inference that takes `costs[i]` seconds of the fake clock at step i (0 after the list), then drives forward."""

    def __init__(self, clock: FakeClock, costs: list[float]) -> None:
        self.clock, self.costs, self.i = clock, costs, 0

    def infer(self, camera: np.ndarray) -> dict[str, np.ndarray]:
        self.clock.t += self.costs[self.i] if self.i < len(self.costs) else 0.0
        self.i += 1
        return {"action_logits": np.zeros((1, 2), np.float32)}

    def command(self, outputs: dict[str, np.ndarray]) -> Command:
        return Command(5.0, 1.0, 1)

    def stop(self) -> Command:
        return Command(0.0, 0.0, -1, safe_stop=True)


class EventLog:
    def __init__(self) -> None:
        self.events: list[str] = []
        self.inference_ms = 0.0

    def event(self, now: float, message: str) -> None:
        self.events.append(message)

    def step(self, *args, **kwargs) -> None:
        pass


def run(costs: list[float], max_steps: int) -> tuple[dict, list[Command], EventLog]:
    clock, sent, log = FakeClock(), [], EventLog()
    cfg = LoopConfig(stale_after=0.5, max_steps=max_steps)
    counts = drive(SlowRuntime(clock, costs), FreshFrames(clock), sent.append, cfg, log, clock, clock.sleep)
    return counts, sent, log


def test_a_steady_loop_has_no_overruns():
    counts, sent, log = run([0.01] * 10, max_steps=10)
    assert counts["steps"] == 10 and counts["overruns"] == counts["stalls"] == counts["stopped"] == 0
    assert counts["max_period_ms"] == pytest.approx(1000 * PERIOD, abs=0.1)
    assert not log.events and not any(c.safe_stop for c in sent)


def test_overruns_below_stale_after_are_counted_and_logged_but_do_not_stop():
    # Steps 3 and 6 take 0.2 s and 0.4 s of inference: periods of one control period more (0.27 s and 0.47 s), both
    # under stale_after (0.5 s).
    counts, sent, log = run([0.0, 0.0, 0.2, 0.0, 0.0, 0.4], max_steps=10)
    assert counts["steps"] == 10 and counts["overruns"] == 2
    assert counts["stalls"] == 0 and counts["stopped"] == 0
    assert counts["max_period_ms"] == pytest.approx(1000 * (PERIOD + 0.4), abs=0.1)
    assert len(sent) == 10 and not any(c.safe_stop for c in sent)
    assert [e.split(":")[0] for e in log.events] == ["loop overrun", "loop overrun"]
    assert "467 ms since the last command (control period 67 ms)" in log.events[1]


def test_a_loop_stall_past_stale_after_stops_the_car_and_is_counted():
    # The camera keeps delivering; the loop itself stalls for 0.6 s in its fourth inference.
    counts, sent, log = run([0.0, 0.0, 0.0, 0.6], max_steps=10)
    assert counts["stalls"] == 1 and counts["overruns"] == 1 and counts["stopped"] == 1
    assert counts["steps"] == 3, "the stalled step's command is not sent: the car gets the stop instead"
    assert sent[-1] == Command(0.0, 0.0, -1, safe_stop=True) and len(sent) == 4
    assert log.events == ["loop stalled: car stopped: 667 ms since the last command (control period 67 ms)"]


def test_overrun_tolerance_is_checked():
    with pytest.raises(ConfigError, match="loop.overrun_tolerance"):
        LoopConfig(overrun_tolerance=-0.1)
