"""The batch's summary table in the terminal (rich): one row per student, one cell per exercise."""

from __future__ import annotations

from grader.grading.results.reports import StudentReport, status_text
from grader.grading.results.scoring import points_text


def summary_table(reports: list[StudentReport], exercise_names: list[str], title: str = "Grades"):
    from rich.table import Table

    caption = ["time: a student's exercise runs added up (runs overlap: the batch's wall time follows the table)"]
    missing = max((r.unavailable for r in reports), default=0.0)
    if missing > 0:
        reasons = sorted({u.reason for r in reports for s, _ in r.exercises for u in s.unavailable})
        caption.append(f"total: out of the points available here; {points_text(missing)} speed points are not — "
                       + "; ".join(reasons))
    table = Table(title=title, caption="\n".join(caption))
    table.add_column("student")
    for name in exercise_names:
        table.add_column(name, justify="right")
    table.add_column("total", justify="right")
    table.add_column("time (sum)", justify="right")
    for report in sorted(reports, key=lambda r: r.student):
        by_name = {s.exercise: s for s, _ in report.exercises}
        cells = []
        for name in exercise_names:
            s = by_name.get(name)
            if s is None:
                cells.append("")
                continue
            full = s.score >= s.max_score - 1e-9 and s.max_score > 0
            style = "blue" if s.pending > 0 else "green" if full else ("yellow" if s.score > 0 else "red")
            note = "" if s.status == "graded" else f" ({status_text(s)})"
            cells.append(f"[{style}]{points_text(s.score)}/{points_text(s.max_score)}{note}[/]")
        table.add_row(report.student, *cells, f"{points_text(report.score)}/{points_text(report.max_score)}",
                      f"{report.elapsed_s:.0f} s")
    return table
