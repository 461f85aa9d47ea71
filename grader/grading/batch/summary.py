"""A batch's result on stdout: the grades table and where the class report is, and the submissions that had nothing
gradable on stderr."""

from __future__ import annotations

from typing import TYPE_CHECKING

from grader.grading.batch.context import Context
from grader.grading.results import store, terminal

if TYPE_CHECKING:
    from grader.grading.batch.pipeline import Batch


def summary(ctx: Context, batch: Batch, title: str) -> None:
    """The batch's result on stdout (the table, and where the class report is), so that it can be piped or saved
    apart from the progress and diagnostics, which go to stderr."""
    from rich.console import Console

    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=160)  # logs: no wrapping of the table
    names = list(store.read_run(ctx.out)["exercises"])
    console.print(terminal.summary_table(batch.reports, names, title=f"{title} ({batch.device})"))
    console.print(f"graded {batch.graded} exercise run(s) in {batch.elapsed_s:.1f} s ({ctx.settings.random_cases} "
                  f"random case(s) per part); class report: {ctx.out / store.CLASS_REPORT_HTML}")
    ungradable = [(r.student, r.ungradable) for r in batch.reports if r.ungradable]
    if ungradable:
        errors = Console(stderr=True, highlight=False, soft_wrap=True)  # a reason is never cut into lines
        errors.print(f"[red]{len(ungradable)} submission(s) had nothing that could be graded:[/]")
        for student, reason in ungradable:
            errors.print(f"  {student}: {reason}", markup=False)
