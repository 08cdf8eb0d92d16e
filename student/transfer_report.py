"""The transfer report of a run: per-checkpoint table, rule picks, rank correlations, gap split; Markdown and PNGs."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt

from envs.config_io import write_text_atomic


def _fmt(x: float, pct: bool = False) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:.0%}" if pct else f"{x:.3f}"


def _ci(result: dict, key: str) -> tuple[float, float]:
    """The bootstrap interval stored next to a correlation (nan, nan when no resample had a defined correlation)."""
    lo, hi = result[f"{key}_ci"]
    return lo, hi


def _interval(result: dict, key: str) -> str:
    lo, hi = _ci(result, key)
    return "" if math.isnan(lo) else f" (95% interval {_fmt(lo)} to {_fmt(hi)} over resampled episodes)"


def _reliability_lines(result: dict) -> list[str]:
    """How reproducibly each score ranks the checkpoints (split halves of its own episodes), and the rank correlation
    that this much noise allows between the robust score and the proxy."""
    rel = result["reliability"]
    r, p = rel["robust"]["full_length"], rel["proxy"]["full_length"]
    if math.isnan(r) and math.isnan(p):  # fewer than 3 checkpoints or 2 episodes each
        return []
    bound = math.sqrt(r * p) if r > 0 and p > 0 else math.nan
    return [
        f"- reproducibility of the ranking (split-half Spearman stepped up to the whole evaluation): robust sim "
        f"{_fmt(r)}, proxy {_fmt(p)}; so the robust-vs-proxy correlation can reach about {_fmt(bound)} with this "
        "many episodes per checkpoint"
    ]


def indistinguishable_from_best(rows: list[dict], best: int) -> int:
    """How many checkpoints' proxy lap-completion intervals overlap the best checkpoint's (the best included): the
    checkpoints the proxy cannot tell apart, among which no sim score can be expected to rank."""
    lo = rows[best]["proxy"].get("lap_completion_ci_low", math.nan)
    return sum(r["proxy"].get("lap_completion_ci_high", math.nan) >= lo for r in rows)


def scatter_figure(robust, fixed, proxy, labels: dict[int, str], result: dict):
    """Proxy score against the robust and the fixed-lap sim score, one point per checkpoint, the picks named."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, xs, axis_label, key in (
        (axes[0], robust, "robust sim score", "spearman_robust_vs_proxy"),
        (axes[1], fixed, "fixed-lap sim score", "spearman_fixed_lap_vs_proxy"),
    ):
        rho = result[key]
        ax.scatter(xs, proxy, c=range(len(xs)), cmap="viridis")
        for index, pick_label in labels.items():
            ax.annotate(pick_label, (xs[index], proxy[index]), fontsize=7, xytext=(4, 4), textcoords="offset points")
        ax.set_xlabel(axis_label)
        ax.set_ylabel("reality-proxy score")
        lo, hi = _ci(result, key)
        ax.set_title(f"Spearman {_fmt(rho)}" + ("" if math.isnan(lo) else f" [{_fmt(lo)}, {_fmt(hi)}]"))
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def write_report(result: dict, out: Path) -> list[Path]:
    """transfer.md, transfer_scatter.png and transfer_by_checkpoint.png in `out`; returns the paths."""
    out.mkdir(parents=True, exist_ok=True)
    rows = result["checkpoints"]
    names = [r["name"] for r in rows]
    robust = [r["robust"]["score"] for r in rows]
    fixed = [r["fixed_lap"]["score"] for r in rows]
    proxy = [r["proxy"]["score"] for r in rows]
    picks = result["picks"]
    labels: dict[int, str] = {}
    for rule, p in picks.items():  # one label per picked checkpoint, naming every rule that chose it
        labels[p["index"]] = f"{labels[p['index']]}, {rule}" if p["index"] in labels else rule

    fig = scatter_figure(robust, fixed, proxy, labels, result)
    scatter = out / "transfer_scatter.png"
    fig.savefig(scatter, dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(11, 4))
    for ys, label in ((robust, "robust sim"), (fixed, "fixed-lap sim"), (proxy, "reality proxy")):
        ax.plot(range(len(ys)), ys, marker="o", label=label)
    for index, label in labels.items():
        ax.axvline(index, ls=":", color="gray")
        ax.text(index, 0.02, label, rotation=90, fontsize=7, va="bottom")
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=7)
    ax.set_ylabel("score (mean progress, one lap = 1)")
    ax.set_ylim(0, 1.05)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    by_ckpt = out / "transfer_by_checkpoint.png"
    fig.savefig(by_ckpt, dpi=110)
    plt.close(fig)

    tied = indistinguishable_from_best(rows, result["best_proxy"]["index"])
    pct = result["max_speed_percent"]
    speed = f"; the car at {pct:g}% of its top speed in every evaluation" if pct != 100.0 else ""
    lines = [
        f"# Transfer report: {result.get('run') or 'checkpoints'}",
        "",
        f"Reality proxy: variant `{result['reality']['variant']}`, physics `{result['reality']['physics']}` "
        f"(substeps {result['reality']['substeps']}), camera `{result['reality']['camera']}` "
        f"(lens `{result['reality']['lens']}`){speed}.",
        "",
        f"- Spearman, robust sim score vs proxy score: **{_fmt(result['spearman_robust_vs_proxy'])}**"
        + _interval(result, "spearman_robust_vs_proxy"),
        f"- Spearman, fixed-lap sim score vs proxy score: **{_fmt(result['spearman_fixed_lap_vs_proxy'])}**"
        + _interval(result, "spearman_fixed_lap_vs_proxy"),
        *[
            f"- Spearman, {label} vs proxy score: **{_fmt(result[key])}**" + _interval(result, key)
            for key, label in (
                ("spearman_sim2sim_vs_proxy", "robust score on the second physics engine (sim2sim)"),
                ("spearman_both_vs_proxy", "mean of the robust and sim2sim scores"),
            )
            if key in result
        ],
        *([f"- the rules below pick by the `{result['select_by']}` score"] if result["select_by"] != "robust" else []),
        f"- best checkpoint in the proxy: {names[result['best_proxy']['index']]} "
        f"(score {_fmt(result['best_proxy']['score'])}); {tied} of {len(rows)} checkpoints have 95% lap-completion "
        "intervals in the proxy that overlap its interval",
        *_reliability_lines(result),
        "",
        "| rule | pick | robust score | proxy score | proxy laps | vs best in proxy |",
        "|---|---|---|---|---|---|",
    ]
    for rule, p in picks.items():
        lines.append(
            f"| {rule} | {p['checkpoint']} | {_fmt(p['robust_score'])} | {_fmt(p['proxy_score'])} | "
            f"{_fmt(p['proxy_lap_completion'], True)} | {_fmt(p['proxy_vs_best'], True)} |"
        )
    summaries = result["spearman_by_robust_summary"]
    if summaries:
        lines += ["", "Spearman vs the proxy score of other summaries of the same robust episodes: " + "; ".join(
            f"{name} {_fmt(rho)}" for name, rho in summaries.items()) + "."]  # fmt: skip
    s2s = all("sim2sim" in r for r in rows)
    extra = ("sim2sim | ", "---|") if s2s else ("", "")
    head = f"| checkpoint | robust | fixed lap | {extra[0]}proxy | proxy laps (fwd / rev) | proxy lap / optimal |"
    lines += ["", head, f"|---|---|---|{extra[1]}---|---|---|"]
    for r in rows:
        p = r["proxy"]
        lines.append(
            f"| {r['name']} | {_fmt(r['robust']['score'])} | {_fmt(r['fixed_lap']['score'])} | "
            + (f"{_fmt(r['sim2sim']['score'])} | " if s2s else "")
            + f"{_fmt(p['score'])} | "
            f"{_fmt(p['forward/lap_completion'], True)} / {_fmt(p['reverse/lap_completion'], True)} | "
            f"{_fmt(p['lap_time_ratio'])} |"
        )
    if "gap" in result:
        g = result["gap"]
        lines += [
            "",
            f"## Gap split for {Path(g['checkpoint']).stem}",
            "",
            "| world | score | laps | lap / optimal |",
            "|---|---|---|---|",
        ]
        for part, label in (("none", "training sim, nominal"), ("dynamics", "proxy dynamics + training camera"),
                            ("perception", "training dynamics + proxy camera"), ("all", "reality proxy")):  # fmt: skip
            m = g[part]
            lines.append(f"| {label} | {_fmt(m['score'])} | {_fmt(m['lap_completion'], True)} | "
                         f"{_fmt(m['lap_time_ratio'])} |")  # fmt: skip
        gap = g["gap"]
        lines += ["", f"Total gap {_fmt(gap['total'])}: dynamics part {_fmt(gap['dynamics'])}, perception part "
                      f"{_fmt(gap['perception'])} (score points)."]  # fmt: skip
    if "agreement" in result:
        a = result["agreement"]
        lines += ["", f"Action agreement at identical poses, training camera vs proxy camera: "
                      f"**{_fmt(a['agreement'], True)}** over {a['steps']} steps."]  # fmt: skip
    lines += ["", "![scores](transfer_scatter.png)", "", "![by checkpoint](transfer_by_checkpoint.png)", ""]
    if (out / "transfer_frames.png").is_file():
        lines += ["![training vs proxy camera at identical poses](transfer_frames.png)", ""]
    md = out / "transfer.md"
    write_text_atomic(md, "\n".join(lines))
    return [md, scatter, by_ckpt]
