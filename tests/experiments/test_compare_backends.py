"""The backend comparison's step-response reading: rise times of known responses."""

from __future__ import annotations

import math

import numpy as np
import pytest

from experiments.research.compare_backends import rise_times


def test_rise_times_of_a_first_order_lag():
    """A first-order lag of 60 ms sampled every 1/120 s reaches 10 / 50 / 90% at tau * ln(1 / (1 - q)), rounded up to
    the next sample; the value before the step sets the baseline."""
    dt, tau = 1 / 120, 0.06
    t = np.arange(1, 241) * dt
    signal = np.concatenate([[2.0], 2.0 + 0.5 * (1 - np.exp(-t / tau))])
    got = rise_times(signal, 1, dt)
    for q, ms in zip((0.1, 0.5, 0.9), got, strict=True):
        exact = -tau * math.log(1 - q) * 1000
        assert exact <= ms < exact + dt * 1000 + 1e-9


def test_rise_times_see_a_dead_time_and_a_falling_step():
    dt = 0.01
    signal = np.concatenate([np.full(5, 1.0), np.full(3, 1.0), np.full(50, -1.0)])  # 30 ms dead time, then down
    assert rise_times(signal, 5, dt) == pytest.approx([40.0, 40.0, 40.0])
    assert all(math.isnan(x) for x in rise_times(np.ones(20), 5, dt))  # no change at all: never
