"""The consoles the scripts print through: on a terminal rich fits its width; anywhere else (`make demo > log`, a
pipe, a subprocess) rich would assume 80 columns and cut table cells to `reinve…`, so the width is left unbounded
there and a log keeps every table whole."""

from __future__ import annotations

from rich.console import Console
from rich.rule import Rule

LOG_WIDTH = 1000
"""columns when the output is not a terminal: wider than any table the scripts print, so none is cut or wrapped"""
RULE_WIDTH = 100
"""a section rule's width in a log (a rule fills the console's width)"""


def make_console(stderr: bool = False) -> Console:
    """A rich console on stdout (or stderr) that never cuts a line when its output is not a terminal."""
    console = Console(stderr=stderr)
    if not console.is_terminal:
        console.width = LOG_WIDTH
    return console


def rule(console: Console, title: str) -> None:
    """A section rule: the terminal's width, or `RULE_WIDTH` in a log."""
    console.print(Rule(title), width=min(console.width, RULE_WIDTH))
