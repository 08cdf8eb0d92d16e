"""Checkpoint-selection rules and the rank correlation behind the transfer report."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from scipy.stats import spearmanr

from student.transfer import (
    pick_best,
    pick_consecutive_good,
    pick_last,
    rank,
    spearman,
    spearman_interval,
    split_half_reliability,
)


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


def test_spearman_interval_collapses_without_noise_and_widens_with_it():
    # Every episode of a checkpoint scores the same: each resample reproduces the means, so the interval is the point.
    x = [[0.1] * 5, [0.5] * 5, [0.9] * 5, [0.7] * 5]
    y = [[0.2] * 8, [0.4] * 8, [1.0] * 8, [0.9] * 8]
    assert spearman_interval(x, y) == pytest.approx((1.0, 1.0))
    # Lap completion of 0/1 episodes: true success rates 0.50..0.95; 20 vs 200 proxy episodes per checkpoint.
    rng = np.random.default_rng(1)
    rates = np.linspace(0.5, 0.95, 10)
    sim = [rng.binomial(1, p, 16).astype(float) for p in rates]
    few = [rng.binomial(1, p, 20).astype(float) for p in rates]
    many = [rng.binomial(1, p, 200).astype(float) for p in rates]
    lo_few, hi_few = spearman_interval(sim, few)
    lo_many, hi_many = spearman_interval(sim, many)
    point = spearman([e.mean() for e in sim], [e.mean() for e in few])
    assert lo_few <= point <= hi_few and -1.0 <= lo_few < hi_few <= 1.0
    assert hi_many - lo_many < hi_few - lo_few, "more proxy episodes, a tighter interval"
    with pytest.raises(ValueError, match="checkpoints"):
        spearman_interval(x, y[:3])


def test_split_half_reliability_is_one_without_noise_near_zero_for_pure_noise_and_steps_up():
    # Noise-free: every half reproduces the ranking exactly.
    exact = [[0.1] * 6, [0.5] * 6, [0.9] * 6, [0.7] * 6]
    assert split_half_reliability(exact) == pytest.approx({"split_half": 1.0, "full_length": 1.0})
    # Identical checkpoints (all true rates 0.8), 0/1 laps: the halves' rankings are unrelated.
    rng = np.random.default_rng(0)
    same = [rng.binomial(1, 0.8, 40).astype(float) for _ in range(12)]
    assert abs(split_half_reliability(same)["split_half"]) < 0.15
    # Distinct rates: more episodes per checkpoint, a more reproducible ranking; Spearman-Brown 2r / (1 + r).
    rates = np.linspace(0.5, 0.95, 12)
    few = split_half_reliability([rng.binomial(1, p, 20).astype(float) for p in rates])
    many = split_half_reliability([rng.binomial(1, p, 400).astype(float) for p in rates])
    assert 0.0 < few["split_half"] < many["split_half"] <= 1.0
    assert few["full_length"] == pytest.approx(2 * few["split_half"] / (1 + few["split_half"]))
    with pytest.raises(ValueError, match="same episode plan"):
        split_half_reliability([[1.0, 0.0], [1.0]])


def test_report_counts_the_checkpoints_the_proxy_cannot_tell_from_the_best():
    from student.transfer_report import indistinguishable_from_best

    rows = [{"proxy": {"lap_completion_ci_low": lo, "lap_completion_ci_high": hi}}
            for lo, hi in ((0.0, 0.2), (0.6, 0.95), (0.83, 1.0), (0.5, 0.82))]  # fmt: skip
    assert indistinguishable_from_best(rows, best=2) == 2  # itself and the one reaching 0.95 >= 0.83


def test_robust_summaries_rank_by_their_own_metric():
    from student.transfer import spearman_by_summary

    # Three checkpoints: progress rises, the worst direction falls, off-tracks fall (fewer is better).
    robust = [
        {"progress": 0.5, "lap_completion": 0.2, "offtrack_count": 9, "forward/progress": 0.9, "reverse/progress": 0.1},
        {"progress": 0.7, "lap_completion": 0.6, "offtrack_count": 5, "forward/progress": 0.7, "reverse/progress": 0.7},
        {"progress": 0.9, "lap_completion": 0.4, "offtrack_count": 1, "forward/progress": 1.0, "reverse/progress": 0.4},
    ]
    rho = spearman_by_summary(robust, [0.1, 0.5, 0.9])
    assert rho["progress (the robust score)"] == pytest.approx(1.0)
    assert rho["lap completion"] == pytest.approx(0.5)
    assert rho["worst direction's progress"] == pytest.approx(0.5)  # worst sides 0.1, 0.7, 0.4
    assert rho["fewest off-tracks"] == pytest.approx(1.0)
    # One direction evaluated: the worst direction is that one (forward progress 0.9, 0.7, 1.0; ranks 2, 1, 3).
    one_way = [{k: v for k, v in m.items() if not k.startswith("reverse/")} for m in robust]
    assert spearman_by_summary(one_way, [0.9, 0.5, 0.1])["worst direction's progress"] == pytest.approx(-0.5)


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

    from student.transfer_report import scatter_figure

    result = {
        "spearman_robust_vs_proxy": 0.9,
        "spearman_fixed_lap_vs_proxy": 0.3,
        "spearman_robust_vs_proxy_ci": (math.nan, math.nan),
        "spearman_fixed_lap_vs_proxy_ci": (math.nan, math.nan),
    }
    fig = scatter_figure([0.2, 0.8, 0.9], [0.5, 1.0, 1.0], [0.1, 0.7, 0.9], {2: "last", 1: "consecutive-good"}, result)
    try:
        assert [ax.get_xlabel() for ax in fig.axes] == ["robust sim score", "fixed-lap sim score"]
        assert [ax.get_title() for ax in fig.axes] == ["Spearman 0.900", "Spearman 0.300"]
        notes = {t.get_text(): t.xy for t in fig.axes[0].texts}
        assert notes == {"last": (0.9, 0.9), "consecutive-good": (0.8, 0.7)}
    finally:
        plt.close(fig)


def test_score_cache_reuses_an_evaluation_only_unchanged_and_with_its_own_settings(tmp_path):
    import os

    from experiments.select_checkpoint import PRESETS, score_cache

    cfg = PRESETS["smoke"][1]

    def cached(cfg):
        return score_cache(tmp_path / "scores.json", cfg)

    ckpt = tmp_path / "round_001.pt"
    ckpt.write_bytes(b"weights")
    cache = cached(cfg)
    cache.put(ckpt, "proxy", {"proxy": {"score": 0.5}, "proxy_episodes": [0.5], "proxy_seconds": 1.0})
    cache.put(ckpt, "robust", {"robust": {"score": 0.7}, "robust_episodes": [0.7], "robust_seconds": 1.0})
    got = cached(cfg).get(ckpt)
    assert got == {"proxy": {"score": 0.5}, "proxy_episodes": [0.5], "proxy_seconds": 1.0,
                   "robust": {"score": 0.7}, "robust_episodes": [0.7], "robust_seconds": 1.0}  # fmt: skip
    assert cached(replace(cfg, reuse_scores=False)).get(ckpt) == {}
    more_robust = replace(cfg, robust=replace(cfg.robust, repeats=cfg.robust.repeats + 1))
    assert set(cached(more_robust).get(ckpt)) == {"proxy", "proxy_episodes", "proxy_seconds"}
    noisier = replace(cfg, action_noise=0.2)
    assert "robust" not in cached(noisier).get(ckpt), "the noise changes robust episodes"
    other = replace(cfg, proxy=replace(cfg.proxy, seed=cfg.proxy.seed + 1))
    assert set(cached(other).get(ckpt)) == {"robust", "robust_episodes", "robust_seconds"}
    slower = replace(cfg, max_speed_percent=80.0)
    assert cached(slower).get(ckpt) == {}, "the car's speed setting changes every score"
    st = ckpt.stat()
    os.utime(ckpt, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert cached(cfg).get(ckpt) == {}, "a rewritten checkpoint is scored again"
    (tmp_path / "scores.json").write_text("{not json")
    assert cached(cfg).get(ckpt) == {}


def test_sim2sim_scores_the_robust_world_on_the_genesis_car_and_needs_its_flag():
    from envs.errors import ConfigError
    from envs.racing.config import EnvConfig
    from envs.racing.randomization import RandomizationConfig
    from envs.racing.transfer import robust_env_config, sim2sim_env_config
    from experiments.select_checkpoint import SelectConfig, selection_scores

    base = EnvConfig(camera="projective", randomization=RandomizationConfig(rear_grip=True))
    robust, s2s = robust_env_config(base, 0.1), sim2sim_env_config(base, 0.1)
    assert (robust.physics, s2s.physics) == ("bicycle", "genesis") and s2s.camera == "projective"
    assert s2s.randomization.action_noise and s2s.randomization.action_noise_max == 0.1
    assert not s2s.randomization.rear_grip, "the bicycle's axle grip balance has no meaning on the contact-wheel car"
    assert replace(s2s.randomization, rear_grip=True) == robust.randomization and s2s.dt_physics == robust.dt_physics
    with pytest.raises(ConfigError, match="--sim2sim"):
        SelectConfig(select_by="both")
    with pytest.raises(ConfigError, match="select_by"):
        SelectConfig(select_by="proxy", sim2sim=True)
    rows = [
        {"robust": {"score": 0.6}, "sim2sim": {"score": 0.8}},
        {"robust": {"score": 1.0}, "sim2sim": {"score": 0.5}},
    ]
    assert selection_scores(rows, "both") == pytest.approx([0.7, 0.75])
    assert selection_scores(rows, "sim2sim") == [0.8, 0.5]


def test_selection_finds_a_runs_checkpoints_but_not_its_refitted_estimators(tmp_path):
    from datasets.run_layout import estimator_path
    from experiments.select_checkpoint import SelectConfig, find_checkpoints

    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    for name in ("round_001.pt", "round_002.pt", "round_003.pt"):
        (ckpts / name).write_bytes(b"weights")
    estimator_path(ckpts / "round_003.pt").write_bytes(b"weights")
    assert [p.name for p in find_checkpoints(SelectConfig(run_dir=str(tmp_path)))] == [
        "round_001.pt", "round_002.pt", "round_003.pt"]  # fmt: skip
    assert [p.name for p in find_checkpoints(SelectConfig(run_dir=str(tmp_path), every=2))] == [
        "round_001.pt", "round_003.pt"]  # fmt: skip
