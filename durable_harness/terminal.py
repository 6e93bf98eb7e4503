"""Terminal output (CLI, demo, crash matrix) through ``rich``: colour and live progress on a
tty only, ``NO_COLOR`` honoured, data lines never wrapped, every text through
:func:`durable_harness.display.visible` first (``design/cli.md``, "Output")."""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from durable_harness.display import visible

if TYPE_CHECKING:  # rich is imported by what prints: a --json command never loads it
    from rich.console import Console
    from rich.progress import TaskID
    from rich.text import Text


def console(*, stderr: bool = False) -> Console:
    """A console on stdout (or stderr) as it is now (a redirected stream is seen as such)."""
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, markup=False, emoji=False, soft_wrap=True)


def say(text: str, style: str | None = None, *, stderr: bool = False) -> None:
    """Print ``text`` in ``style`` (a ``rich`` style) when colour is on; newlines, tabs kept."""
    from rich.text import Text

    console(stderr=stderr).print(Text(visible(text, multiline=True), style=style or ""))


def styled(*parts: tuple[str, str | None] | str) -> Text:
    """A line of ``text`` or ``(text, style)`` parts, each through ``visible`` (one line)."""
    from rich.text import Text

    line = Text()
    for part in parts:
        text, style = (part, None) if isinstance(part, str) else part
        line.append(visible(text), style=style or "")
    return line


def say_parts(*parts: tuple[str, str | None] | str, stderr: bool = False) -> None:
    """Print one line made of :func:`styled` parts."""
    console(stderr=stderr).print(styled(*parts))


def error_line(code: str, message: str) -> None:
    """Print ``error[CODE]: message`` on stderr (the code in red on a terminal)."""
    say_parts((f"error[{code}]:", "bold red"), f" {message}", stderr=True)


class _Cell(Protocol):
    """What progress needs of a crash-matrix cell."""

    @property
    def status(self) -> str: ...
    @property
    def scenario(self) -> str: ...
    @property
    def label(self) -> str: ...
    @property
    def backend(self) -> str: ...


PROGRESS_EVERY_ENV = "DURABLE_HARNESS_PROGRESS_EVERY"
"""Seconds between the crash matrix's plain progress lines (default 10; tests set it small)."""


class MatrixProgress:
    """Progress of the crash matrix, a context manager passed as ``run_matrix(progress=...)``.

    Live on stderr when it is a terminal (cells done of total, failures, time elapsed and left,
    the last cell). When stdout is not a terminal (CI, a log file), a plain line on ``plain``
    (default: stdout) at the start, every :data:`PROGRESS_EVERY_ENV` seconds (default 10, from
    a timer thread, so a long cell does not silence it) and at the end:
    ``crash-test: 37/120 cells, 0 failed, 41 s`` (``?`` for the total while baselines run).
    """

    def __init__(
        self, out: Console | None = None, *, plain: TextIO | None = None, every: float | None = None
    ) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.console = out or console(stderr=True)
        self.failures = 0
        self.started = time.monotonic()
        self.plain = plain if plain is not None else (None if console().is_terminal else sys.stdout)
        self.every = every or float(os.environ.get(PROGRESS_EVERY_ENV) or 10.0)
        self._done, self._total = 0, 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._progress = Progress(
            TextColumn("crash matrix"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("cells"),
            TextColumn("{task.fields[failed]}"),
            TimeElapsedColumn(),
            TextColumn("left"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[cell]}"),
            console=self.console,
            disable=not self.console.is_terminal,
            transient=False,
        )
        self._task: TaskID | None = None

    @property
    def enabled(self) -> bool:
        """True when progress is drawn (stderr is a terminal)."""
        return self.console.is_terminal

    def __enter__(self) -> MatrixProgress:
        from rich.text import Text

        self.started = time.monotonic()
        self._progress.start()
        # elapsed time counts from here; the total is known at the first finished cell
        self._task = self._progress.add_task(
            "matrix", total=None, failed=Text("0 failed", style="green"), cell="starting"
        )
        if self.plain is not None:
            self.line()
            self._ticker = threading.Thread(target=self._tick, name="matrix-progress", daemon=True)
            self._ticker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()
        if self._ticker is not None:
            self._stop.set()
            self._ticker.join()
            self._ticker = None
            self.line()

    def _tick(self) -> None:
        while not self._stop.wait(self.every):
            self.line()

    def line(self) -> None:
        """Write the plain progress line now (when there is a plain stream)."""
        if self.plain is None:
            return
        with self._lock:
            seconds = int(time.monotonic() - self.started)
            if self._total:
                text = f"crash-test: {self._done}/{self._total} cells, {self.failures} failed"
            else:  # the cells are known once the scenarios' crash-free runs are traced
                text = "crash-test: running the crash-free baselines"
            text += f", {seconds} s"
        self.plain.write(text + "\n")
        self.plain.flush()

    def __call__(self, cell: _Cell, done: int, total: int) -> None:
        """Record that ``cell`` finished, ``done`` of ``total`` cells."""
        from rich.text import Text

        with self._lock:
            if cell.status != "pass":
                self.failures += 1
            self._done, self._total = done, total
        failed: Any = Text(
            f"{self.failures} failed", style="bold red" if self.failures else "green"
        )
        where = f"{cell.backend} {cell.scenario} {cell.label}"
        if self._task is None:  # used without ``with``
            self._task = self._progress.add_task("matrix", total=total, failed=failed, cell=where)
        self._progress.update(self._task, completed=done, total=total, failed=failed, cell=where)
        if cell.status != "pass" and self.enabled:
            self._progress.console.print(
                styled((f"{cell.status.upper()}", "bold red"), f" {where}")
            )


__all__ = [
    "PROGRESS_EVERY_ENV",
    "MatrixProgress",
    "console",
    "error_line",
    "say",
    "say_parts",
    "styled",
]
