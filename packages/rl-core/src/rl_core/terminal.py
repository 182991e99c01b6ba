"""The rich consoles rl-core prints its tables with: full width in a log file.

A rich ``Console`` that writes to a pipe or a file (``rl-core train ... > run.log``, ``ray job
submit``'s log) is 80 columns wide, and the summary's tables are then cut ("offloa…",
"judge=…"). A log has no width to fit, so off a terminal the tables get :data:`LOG_WIDTH` columns
(rich still takes ``COLUMNS`` from the environment when it is set); on a terminal, its width.
"""

from __future__ import annotations

import os

from rich.console import Console

__all__ = ["LOG_WIDTH", "make_console"]

#: columns of a table written to a file or a pipe: wider than any of rl-core's tables
LOG_WIDTH = 250


def make_console(*, stderr: bool = False) -> Console:
    """A console on stdout (or ``stderr``) that cuts no table short when it is not a terminal."""
    console = Console(stderr=stderr)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(stderr=stderr, width=LOG_WIDTH)
    return console
