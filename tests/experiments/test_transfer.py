"""Checkpoint-selection rules and the rank correlation behind the transfer report."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import spearmanr

from experiments.transfer import pick_best, pick_consecutive_good, pick_last, rank, spearman


def test_rank_averages_ties():
    assert rank(np.array([0.3, 0.1, 0.3, 0.9])).tolist() == [2.5, 1.0, 2.5, 4.0]


def test_spearman_hand_example_and_scipy():
    # ranks x: 1 2 3 4 5, ranks y: 2 1 4 3 5 -> d^2 = 1+1+1+1+0 = 4, rho = 1 - 6*4 / (5*24) = 0.8
    assert spearman([1, 2, 3, 4, 5], [20, 10, 40, 30, 50]) == pytest.approx(0.8)
    rng = np.random.default_rng(0)
    for _ in range(20):
        x = rng.integers(0, 5, 12).astype(float)  # many ties
        y = x + rng.normal(0, 1.5, 12)
        assert spearman(x, y) == pytest.approx(spearmanr(x, y).statistic, abs=1e-12)
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))


def test_consecutive_good_takes_the_middle_of_the_longest_run():
    scores = [0.2, 0.5, 0.97, 0.6, 0.93, 0.95, 0.96, 0.94, 0.5, 0.99, 0.7]
    pick = pick_consecutive_good(scores, margin=0.06)
    # good (>= 0.93): indices 2, 4, 5, 6, 7, 9 -> the longest run is 4..7, its middle is 6 (upper middle)
    assert pick.index == 6 and "4..7" in pick.detail
    assert pick_best(scores).index == 9 and pick_last(scores).index == 10


def test_consecutive_good_prefers_the_later_run_on_a_tie_and_falls_back_to_the_best():
    assert pick_consecutive_good([0.9, 0.9, 0.1, 0.9, 0.9], margin=0.01).index == 4
    fallback = pick_consecutive_good([0.1, 0.9, 0.2, 0.8], margin=0.05, min_run=2)
    assert fallback.index == 1 and "best single" in fallback.detail


def test_cli_without_a_preset_name_uses_default():
    from experiments.cli import parse
    from experiments.select_checkpoint import PRESETS

    assert parse(PRESETS, "", []).proxy.start_points == PRESETS["default"][1].proxy.start_points
    assert parse(PRESETS, "", ["--good-margin", "0.1"]).good_margin == 0.1
    assert parse(PRESETS, "", ["smoke"]).reality.physics == "bicycle"


def test_scatter_axes_name_the_sim_score_and_picks_name_their_point():
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    from experiments.transfer_report import scatter_figure

    result = {"spearman_robust_vs_proxy": 0.9, "spearman_fixed_lap_vs_proxy": 0.3}
    fig = scatter_figure([0.2, 0.8, 0.9], [0.5, 1.0, 1.0], [0.1, 0.7, 0.9], {2: "last", 1: "consecutive-good"}, result)
    try:
        assert [ax.get_xlabel() for ax in fig.axes] == ["robust sim score", "fixed-lap sim score"]
        assert [ax.get_title() for ax in fig.axes] == ["Spearman 0.900", "Spearman 0.300"]
        notes = {t.get_text(): t.xy for t in fig.axes[0].texts}
        assert notes == {"last": (0.9, 0.9), "consecutive-good": (0.8, 0.7)}
    finally:
        plt.close(fig)
