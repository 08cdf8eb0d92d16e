"""The progress bar of every long loop, readable in a log too.

On a terminal it is rich's live bar. Anywhere else (`make demo > log`, a pipe, a job scheduler's output file) rich draws
nothing until the loop ends, so a run that takes an hour looks hung; there the bar prints a plain line instead — stage,
done/total, elapsed time, status — at most every `interval` seconds (and at the start), from rich's own refresh thread,
so a line comes even while one long step (a DAgger round, a PPO iteration) is still running.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.console import Console, RenderableType
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

LOG_INTERVAL_S = 30.0
"""seconds between two progress lines in a log"""


class LogProgress(Progress):
    """A rich `Progress` that, on a console that is not interactive, prints `plain_lines()` every `interval` s (each
    line named `stage`, or the task's description without one)."""

    def __init__(
        self, *columns, stage: str = "", interval: float = LOG_INTERVAL_S, clock: Callable[[], float] = time.monotonic,
        **kwargs,
    ) -> None:  # fmt: skip
        self.stage, self.interval, self.clock = stage, interval, clock
        self.plain, self._last_line = False, None  # rich renders once while it builds the bar
        super().__init__(*columns, get_time=clock, **kwargs)
        self.plain = not self.console.is_terminal or self.console.is_dumb_terminal

    def plain_lines(self) -> list[str]:
        """One line per visible task: `stage done/total elapsed h:mm:ss status`."""
        lines = []
        for task in self.tasks:
            if not task.visible:
                continue
            total = "?" if task.total is None else f"{task.total:g}"
            elapsed = int(task.elapsed or 0.0)
            clock = f"{elapsed // 3600}:{elapsed // 60 % 60:02d}:{elapsed % 60:02d}"
            status = str(task.fields.get("status", "")).strip()
            name = self.stage or task.description
            lines.append(f"{name} {task.completed:g}/{total} elapsed {clock} {status}".rstrip())
        return lines

    def get_renderable(self) -> RenderableType:
        # Called by every refresh (rich's refresh thread, `start`, `stop`); on a log, the place to print from.
        if self.plain:
            now = self.clock()
            lines = self.plain_lines() if self._last_line is None or now - self._last_line >= self.interval else []
            for line in lines:
                self.console.print(line, markup=False, highlight=False, soft_wrap=True)
            self._last_line = now if lines else self._last_line
        return super().get_renderable()


def stage_progress(
    stage: str,
    disable: bool = False,
    console: Console | None = None,
    interval: float = LOG_INTERVAL_S,
    clock: Callable[[], float] = time.monotonic,
) -> LogProgress:
    """The bar of one long stage: name, bar, done/total, elapsed, and the task's `status` field (`add_task(stage,
    total=..., status="")`, then `update(task, completed=..., status=...)`); plain lines when not on a terminal."""
    return LogProgress(
        TextColumn(f"[bold]{stage}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("{task.fields[status]}"),
        console=console, disable=disable, stage=stage, interval=interval, clock=clock,
    )  # fmt: skip
