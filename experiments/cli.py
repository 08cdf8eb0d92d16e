"""Shared command-line plumbing: tyro presets per task, `--task`, `--env-file`, one-line errors for bad input, non-zero
exit codes, and stages that a script runs as other scripts in their own processes (no script imports another)."""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import is_dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import tyro
import yaml
from rich.console import Console

from envs.config_io import from_dict, to_dict
from envs.errors import ConfigError, GapbridgeError
from envs.task import UnknownTaskError, check_task, get_task, task_names, task_of_config

T = TypeVar("T")

DEFAULT_TASK = "racing"
"""the task a script runs without `--task`"""

_current_task = DEFAULT_TASK


def current_task() -> str:
    """The task the running script was given (`--task`, default `racing`): what its `main` passes on to the stages it
    launches."""
    return _current_task


def split_task(args: Sequence[str]) -> tuple[str, list[str]]:
    """`--task NAME` (or `--task=NAME`), wherever it is in `args`, taken out of them: `(task, the other args)`; without
    one the task is `racing`. An unknown name, a missing one or two different ones are refused with the known tasks."""
    names, rest, i = [], [], 0
    while i < len(args):
        if args[i] == "--task":
            if i + 1 == len(args) or args[i + 1].startswith("-"):
                raise ConfigError(f"--task needs a task name; known tasks: {', '.join(task_names())}")
            names.append(args[i + 1])
            i += 2
            continue
        if args[i].startswith("--task="):
            names.append(args[i].partition("=")[2])
        else:
            rest.append(args[i])
        i += 1
    if len(set(names)) > 1:
        raise ConfigError(f"--task given as {' and '.join(map(repr, dict.fromkeys(names)))}; give one")
    task = names[0] if names else DEFAULT_TASK
    get_task(task)  # refuses an unknown name, listing the known ones
    return task, rest


def split_env_file(args: Sequence[str]) -> tuple[str, list[str]]:
    """`--env-file FILE` (or `--env-file=FILE`) taken out of `args`: `(file, the other args)`, the file empty without
    one; a missing file name or two different ones are refused."""
    files, rest, i = [], [], 0
    while i < len(args):
        if args[i] == "--env-file":
            if i + 1 == len(args) or args[i + 1].startswith("-"):
                raise ConfigError("--env-file needs a YAML file (e.g. calibrated.yaml from experiments.calibrate)")
            files.append(args[i + 1])
            i += 2
            continue
        if args[i].startswith("--env-file="):
            files.append(args[i].partition("=")[2])
        else:
            rest.append(args[i])
        i += 1
    if len(set(files)) > 1:
        raise ConfigError(f"--env-file given as {' and '.join(map(repr, dict.fromkeys(files)))}; give one")
    return (files[0] if files else ""), rest


def read_env_file(path: str) -> dict:
    """The sections of an env YAML file (the key layout of the env config's own YAML); a missing file, bad YAML or
    anything but a mapping is refused naming the file."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"--env-file {path}: no such file")
    try:
        data = yaml.safe_load(file.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"--env-file {path}: not valid YAML ({' '.join(str(err).split())})") from None
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"--env-file {path}: expected a mapping of env sections (e.g. optics:), got {data!r}")
    return data


def _merge(base: dict, over: dict, prefix: str, path: str) -> dict:
    merged = dict(base)
    for key, value in over.items():
        name = f"{prefix}{key}"
        if key not in base:
            raise ConfigError(f"--env-file {path}: unknown key {name!r} (the env config has no such field)")
        old = base[key]
        if isinstance(old, dict):
            if not isinstance(value, dict):
                raise ConfigError(f"--env-file {path}: {name!r} is a section; give it as a mapping, got {value!r}")
            merged[key] = _merge(old, value, f"{name}.", path)
            continue
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        wrong_bool = isinstance(old, bool) and not isinstance(value, bool)
        wrong_number = isinstance(old, (int, float)) and not isinstance(old, bool) and not number
        if wrong_bool or wrong_number:
            raise ConfigError(f"--env-file {path}: {name}={value!r}; expected {type(old).__name__} like {old!r}")
        merged[key] = value
    return merged


def env_with_file(env: Any, data: dict, path: str) -> Any:
    """`env` (an env config) with the file's sections over it: nested sections merge field by field; an unknown key
    or a bad value is refused naming the key and the file."""
    merged = _merge(to_dict(env), data, "", path)
    try:
        return from_dict(type(env), merged, "env")
    except (ConfigError, TypeError, ValueError) as err:
        raise ConfigError(f"--env-file {path}: {err}") from None


def presets_with_env_file(presets: Mapping[str, tuple[str, Any]], path: str) -> dict[str, tuple[str, Any]]:
    """Every preset whose config has an `env` with the env file over it (the command-line flags still win); a script
    without an env config is refused."""
    data = read_env_file(path)
    out = dict(presets)
    for name, (text, config) in presets.items():
        if is_dataclass(getattr(config, "env", None)):
            out[name] = (text, replace(config, env=env_with_file(config.env, data, path)))
    if all(out[name] is presets[name] for name in presets):
        raise ConfigError(f"--env-file {path}: this script has no env config")
    return out


def presets_by_task(presets: Mapping[str, Any]) -> dict[str, Mapping[str, tuple[str, Any]]]:
    """A script's presets keyed by task (task name -> preset name -> `(description, config)`); a flat mapping of
    presets is the default task's."""
    flat = any(isinstance(value, tuple) for value in presets.values())
    return {DEFAULT_TASK: presets} if flat else dict(presets)


def task_help(tasks: Sequence[str]) -> str:
    """The `--help` line of the `--task` flag (tyro does not know it: `parse` takes it out first)."""
    return (
        f"--task NAME  the task (default {DEFAULT_TASK}; this script: {', '.join(tasks)}; "
        f"known tasks: {', '.join(task_names())})"
    )


ENV_FILE_HELP = (
    "--env-file FILE  YAML of env sections over the preset's env (e.g. calibrated.yaml from experiments.calibrate: "
    "optics:); the --env.* flags still win"
)


def check_env_task(cfg: object, task: str) -> None:
    """Refuse a config whose `env` is another task's env config, naming both tasks."""
    env = getattr(cfg, "env", None)
    if env is None or not is_dataclass(env):
        return
    try:
        owner = task_of_config(env).name
    except UnknownTaskError:  # an `env` field that is no task's env config
        return
    check_task(f"--task {task}: the config's env ({type(env).__name__})", owner, task)


def parse_task(presets: Mapping[str, Any], description: str, args: list[str] | None = None) -> tuple[str, Any]:
    """Parse `[--task NAME] [--env-file FILE] PRESET [--overrides ...]` (nerfstudio / tyro `overridable_config_cli`
    style) into `(task, config)`: `presets` maps each task the script runs to its presets (see `presets_by_task`);
    without a preset name the task's `default` preset is used. `--task` may stand anywhere; a task the script has no
    presets for is refused naming the script's tasks. `--env-file` may stand anywhere too: its sections go over the
    presets' `env` before the flags are read, so a flag still wins."""
    task, args = split_task(sys.argv[1:] if args is None else args)
    env_file, args = split_env_file(args)
    by_task = presets_by_task(presets)
    if task not in by_task:
        raise ConfigError(f"--task {task}: this script has no presets for it; its tasks: {', '.join(by_task)}")
    chosen = dict(by_task[task])
    if env_file:
        chosen = presets_with_env_file(chosen, env_file)
    if "default" in chosen and (not args or (args[0].startswith("--") and args[0] != "--help")):
        args = ["default", *args]
    line = task_help(list(by_task))
    if any(is_dataclass(getattr(config, "env", None)) for _, config in chosen.values()):
        line += f"\n\n{ENV_FILE_HELP}"
    if args and args[0] in chosen and {"-h", "--help"} & set(args):  # a preset's help shows its own description
        text, config = chosen[args[0]]
        chosen[args[0]] = (f"{text}\n\n{line}", config)
    full = f"{(description or '').rstrip()}\n\n{line}"
    cfg = tyro.extras.overridable_config_cli(chosen, description=full, args=args)
    check_env_task(cfg, task)
    return task, cfg


def parse(presets: Mapping[str, Any], description: str, args: list[str] | None = None) -> Any:
    """`parse_task`'s config alone."""
    return parse_task(presets, description, args)[1]


def run(main: Callable[[T], object], presets: Mapping[str, Any], description: str) -> None:
    """Parse the command line (`parse_task`) and run `main` on the config, the task available to it as
    `current_task()`; input errors print one line naming the problem and exit with 2."""
    global _current_task
    console = Console(stderr=True)
    try:
        _current_task, cfg = parse_task(presets, description)
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
