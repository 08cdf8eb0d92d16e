"""Shared command-line plumbing: tyro presets, one-line errors for bad input, non-zero exit codes, and stages that a
script runs as other scripts in their own processes (no script imports another)."""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

import tyro
from rich.console import Console

from envs.errors import ConfigError, GapbridgeError

T = TypeVar("T")


def parse(presets: Mapping[str, tuple[str, T]], description: str, args: list[str] | None = None) -> T:
    """Parse `PRESET [--overrides ...]` (nerfstudio / tyro `overridable_config_cli` style); without a preset name
    the `default` preset is used."""
    args = list(sys.argv[1:] if args is None else args)
    if "default" in presets and (not args or (args[0].startswith("--") and args[0] != "--help")):
        args = ["default", *args]
    return tyro.extras.overridable_config_cli(dict(presets), description=description, args=args)


def run(main: Callable[[T], object], presets: Mapping[str, tuple[str, T]], description: str) -> None:
    """Parse the command line and run `main`; input errors print one line naming the problem and exit with 2."""
    console = Console(stderr=True)
    try:
        cfg = parse(presets, description)
        main(cfg)
    except GapbridgeError as err:
        console.print(f"[bold red]error:[/] {err}", highlight=False, soft_wrap=True)  # one line, even when piped
        sys.exit(2)
    except StageFailed as err:
        console.print(f"[bold red]error:[/] {err}", highlight=False, soft_wrap=True)
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]")
        sys.exit(130)


class StageFailed(Exception):
    """A stage (another script run in its own process) ended with a non-zero exit code."""

    def __init__(self, stage: str, module: str, returncode: int) -> None:
        super().__init__(f"{stage} (python -m {module}) failed with exit code {returncode}")
        self.stage, self.module, self.returncode = stage, module, returncode

    @property
    def exit_code(self) -> int:
        """The stage's own code (2: it refused its input), 1 when a signal ended it."""
        return self.returncode if 0 < self.returncode < 256 else 1


def run_stage(stage: str, module: str, args: Sequence[str]) -> None:
    """Run `python -m <module> <args>` in its own process, its output interleaved with ours, so that nothing one stage
    imports or initializes (Genesis, compiled kernels) reaches the next; raises `StageFailed` naming `stage` and the
    exit code when it fails."""
    sys.stdout.flush()
    sys.stderr.flush()
    returncode = subprocess.run([sys.executable, "-m", module, *args], check=False).returncode
    if returncode != 0:
        raise StageFailed(stage, module, returncode)


def stage_args(field: str, text: str) -> list[str]:
    """A stage given on the command line as one string, `"PRESET --flag value ..."`, as the stage's arguments;
    refused by the field's name when it is empty, badly quoted or does not start with a preset."""
    try:
        args = shlex.split(text)
    except ValueError as err:
        raise ConfigError(f"--{field.replace('_', '-')} {text!r}: {err}") from None
    if not args or args[0].startswith("-"):
        raise ConfigError(f"--{field.replace('_', '-')} {text!r}: give the stage's preset first, then its flags")
    return args
