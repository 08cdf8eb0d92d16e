"""`experiments.ablate` over the tiny student: each variant runs once as its own script, a stopped one continues,
and each scores in the reality proxy once."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from envs.errors import ConfigError
from tests.student.tiny import DAGGER, EVAL, STUDENT

ABLATION_ARGS = (
    "smoke --student.encoder.channels 8 8 8 --student.encoder.embed-dim 16 --dagger.envs 3 --dagger.steps-per-round 12 "
    "--dagger.labels-per-window 3 --dagger.bf16 off --dagger.estimator-fit-steps 5"
)
"""the distill_student flags of this file's tiny student and DAgger, as an ablation's base run"""


def test_ablation_runs_each_variant_once_and_continues_a_stopped_one(teacher_path, tmp_path, monkeypatch):
    import yaml

    from datasets.run_logger import WandbConfig
    from experiments import ablate, distill_student
    from experiments.cli import StageFailed, parse, stage_args

    smoke = distill_student.PRESETS["smoke"][1]
    base = parse(distill_student.PRESETS, "", stage_args("student_args", ABLATION_ARGS))
    assert base == replace(smoke, student=STUDENT, dagger=DAGGER)
    cfg = ablate.AblateConfig(
        stage="student", variants=("base", "beta-zero"), teacher=str(teacher_path), student_args=ABLATION_ARGS,
        out_dir=str(tmp_path), wandb=WandbConfig(mode="disabled"),
    )  # fmt: skip
    calls = []
    real_run_stage = ablate.run_stage

    def spy(stage, module, args):  # each variant trains in its own process
        run_dir = Path(args[args.index("--run-dir") + 1])
        calls.append((module, run_dir.name, args[args.index("--resume") + 1] if "--resume" in args else ""))
        real_run_stage(stage, module, args)

    monkeypatch.setattr(ablate, "run_stage", spy)
    first = ablate.main(cfg)
    script = "experiments.distill_student"
    assert calls == [(script, "base", ""), (script, "beta-zero", "")]
    betas = [yaml.safe_load((tmp_path / v / "config.yaml").read_text())["dagger"]["beta"] for v in cfg.variants]
    assert betas == ["lbc", "zero"]
    assert 0.0 <= first["beta-zero"]["lap_completion"] <= 1.0
    assert first["base"]["dagger_minutes"] > 0.0
    table = (tmp_path / "ablation.md").read_text()
    assert "| base |" in table and "| beta-zero |" in table and "2 DAgger rounds each" in table

    # Finished variants are read back; one whose summary is missing resumes from its latest checkpoint.
    calls.clear()
    (tmp_path / "beta-zero" / "eval.json").unlink()
    again = ablate.main(cfg)
    assert calls == [(script, "beta-zero", str(tmp_path / "beta-zero"))]
    assert json.dumps(again["base"]) == json.dumps(first["base"])  # (NaN lap-time ratios when nobody finishes)
    assert json.loads((tmp_path / "ablation.json").read_text())["base"].keys() == first["base"].keys()

    # Another budget in the same directory is refused, naming the variant.
    with pytest.raises(ConfigError, match="variant 'base'.*another configuration"):
        ablate.main(replace(cfg, student_args=ABLATION_ARGS + " --dagger.rounds 3"))
    with pytest.raises(ConfigError, match="unknown student variants"):
        ablate.main(replace(cfg, variants=("base", "no-such-variant")))
    # A variant whose run fails stops the ablation, naming it and the run's exit code (2: it refused its input).
    with pytest.raises(StageFailed, match=r"variant 'base' \(python -m experiments.distill_student\) failed with exit"):
        ablate.main(replace(cfg, student_args="smoke --dagger.rounds 0", out_dir=str(tmp_path / "bad")))
    assert calls[-1][1] == "base" and not (tmp_path / "bad" / "ablation.json").exists()


def test_ablation_scores_each_variant_in_the_reality_proxy_once(teacher_path, tmp_path, monkeypatch):
    from datasets.run_logger import WandbConfig
    from envs.racing.reality import RealityConfig
    from experiments import ablate

    # A proxy without Genesis (bicycle physics, projective camera) keeps the test fast; the mechanism is the same.
    reality = RealityConfig(physics="bicycle", camera="projective", lens="pinhole", friction=0.8)
    cfg = ablate.AblateConfig(
        stage="student", variants=("base",), teacher=str(teacher_path), out_dir=str(tmp_path),
        student_args=ABLATION_ARGS + " --dagger.rounds 1",
        wandb=WandbConfig(mode="disabled"), proxy=True, proxy_reality=reality, proxy_eval=EVAL,
    )  # fmt: skip
    worlds = []
    real_evaluate_one = ablate.evaluate_one

    def spy(policy, env_cfg, eval_cfg):
        worlds.append(env_cfg)
        return real_evaluate_one(policy, env_cfg, eval_cfg)

    monkeypatch.setattr(ablate, "evaluate_one", spy)
    first = ablate.main(cfg)["base"]
    assert len(worlds) == 1 and worlds[0].randomization.friction_range[0] == pytest.approx(0.8 * (1 - reality.spread))
    assert worlds[0].physics == "bicycle" and worlds[0].substeps == reality.substeps, (
        "the proxy's world, not training's"
    )
    assert set(ablate.PROXY_KEYS) == {k.removeprefix("proxy/") for k in first if k.startswith("proxy/")}
    assert 0.0 <= first["proxy/lap_completion"] <= 1.0
    saved = json.loads((tmp_path / "base" / "proxy.json").read_text())
    assert saved["key"]["checkpoint"] == "round_001.pt" and json.dumps(saved["row"]) == json.dumps(
        {k: first[k] for k in saved["row"]}
    )
    assert "proxy/lap_completion" in (tmp_path / "ablation.md").read_text()

    ablate.main(cfg)  # same checkpoint, same proxy: read back
    assert len(worlds) == 1
    ablate.main(replace(cfg, proxy_reality=replace(reality, friction=0.6)))  # another proxy: evaluated again
    assert len(worlds) == 2 and worlds[1].randomization.friction_range[1] == pytest.approx(0.6 * (1 + reality.spread))
