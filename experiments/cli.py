"""Shared command-line plumbing: tyro presets, one-line errors for bad input, non-zero exit codes."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import TypeVar

import tyro
from rich.console import Console

from envs.errors import GapbridgeError

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
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]")
        sys.exit(130)
