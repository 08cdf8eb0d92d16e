"""A long stage's progress bar prints plain lines when its output is a log, not a terminal."""

from __future__ import annotations

import io

from rich.console import Console

from envs.progress import stage_progress


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def log_console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=False, width=200), out


def test_a_log_gets_a_line_at_the_start_and_after_every_interval():
    console, out = log_console()
    clock = FakeClock()
    progress = stage_progress("DAgger", console=console, interval=30.0, clock=clock)
    assert progress.plain
    with progress:
        task = progress.add_task("dagger", total=10, completed=2, status="")
        progress.refresh()
        clock.t += 20.0
        progress.update(task, completed=3, status="lap_completion 40%  agree 0.81")
        progress.refresh()  # 20 s after the last line: nothing yet
        clock.t += 15.0
        progress.refresh()
    lines = [line for line in out.getvalue().splitlines() if " elapsed " in line]
    assert lines == [
        "DAgger 2/10 elapsed 0:00:00",
        "DAgger 3/10 elapsed 0:00:35 lap_completion 40%  agree 0.81",
    ]


def test_interval_zero_prints_every_refresh():
    console, out = log_console()
    clock = FakeClock()
    with stage_progress("teacher", console=console, interval=0.0, clock=clock) as progress:
        task = progress.add_task("train", total=3, status="")
        for i in range(3):
            clock.t += 3725.0
            progress.update(task, completed=i + 1, status=f"reward {0.1 * i:.3f}")
            progress.refresh()
    lines = out.getvalue().splitlines()
    for i, elapsed in enumerate(("1:02:05", "2:04:10", "3:06:15")):
        assert f"teacher {i + 1}/3 elapsed {elapsed} reward {0.1 * i:.3f}" in lines


def test_a_terminal_gets_the_live_bar_only():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100)
    with stage_progress("teacher", console=console, interval=0.0, clock=FakeClock()) as progress:
        progress.add_task("train", total=3, status="")
        progress.refresh()
        assert not progress.plain
    assert " elapsed " not in out.getvalue()


def test_a_disabled_bar_prints_nothing():
    console, out = log_console()
    with stage_progress("teacher", console=console, disable=True, interval=0.0, clock=FakeClock()) as progress:
        progress.add_task("train", total=3, status="")
        progress.refresh()
    assert out.getvalue() == ""
