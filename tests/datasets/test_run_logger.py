"""The W&B run logger's login check and its flags for a stage run in its own process."""

from __future__ import annotations

import pytest

from datasets.run_logger import WandbConfig, WandbLoginError, check_login, wandb_credentials, wandb_flags


def test_online_needs_a_key_or_a_netrc_entry_for_the_wandb_host(tmp_path, monkeypatch):
    for var in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    netrc = tmp_path / "netrc"
    netrc.write_text("machine example.com\n  login user\n  password secret\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    monkeypatch.setenv("HOME", str(tmp_path))
    assert wandb_credentials() == ""
    with pytest.raises(WandbLoginError, match=r"wandb login.*WANDB_API_KEY.*--wandb.mode offline"):
        check_login(WandbConfig(mode="online"))
    check_login(WandbConfig(mode="offline"))  # offline and disabled runs need no login
    check_login(WandbConfig(mode="disabled"))
    netrc.write_text("machine api.wandb.ai\n  login user\n  password 0123456789\n")  # what `wandb login` writes
    assert wandb_credentials() == str(netrc)
    check_login(WandbConfig(mode="online"))
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.org")  # a key for another host does not count
    assert wandb_credentials() == ""
    monkeypatch.setenv("WANDB_API_KEY", "0123456789")
    assert wandb_credentials() == "WANDB_API_KEY"


def test_wandb_flags_reach_a_scripts_config_unchanged():
    from experiments import train_teacher
    from experiments.cli import parse

    for cfg in (WandbConfig(), WandbConfig(mode="disabled", entity="team", group="ablation-student", tags=("a", "b"))):
        assert parse(train_teacher.PRESETS, "", ["smoke", *wandb_flags(cfg), "--run-dir", "/tmp/r"]).wandb == cfg
