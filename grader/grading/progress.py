"""Progress of a batch on stderr: a rich progress bar on a terminal; one plain line per finished task
otherwise (logs stay readable)."""

from __future__ import annotations

import sys


class Progress:
    def __init__(self, total: int, description: str):
        from rich.console import Console

        self.console = Console(stderr=True)
        self.total, self.done = total, 0
        self.bar = None
        if self.console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as Bar

            self.bar = Bar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                           console=self.console, transient=False)
            self.task = self.bar.add_task(description, total=total)
            self.bar.start()
        else:
            print(description, file=sys.stderr, flush=True)

    def advance(self, message: str) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.console.log(message)
            self.bar.advance(self.task)
        else:
            print(f"[{self.done}/{self.total}] {message}", file=sys.stderr, flush=True)

    def note(self, message: str) -> None:
        if self.bar is not None:
            self.bar.console.log(message)
        else:
            print(message, file=sys.stderr, flush=True)

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
