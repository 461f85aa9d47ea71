"""Reports of a grading run (where they go: :mod:`grader.grading.results.store`):

* ``report.md`` and ``report.html`` per student (self-contained: inline CSS, inline SVG plot): per
  exercise the score, the smallest failing check with its error, integrity flags, and the speed table
  with a roofline plot;
* ``results.json`` per student: the Gradescope autograder format (``score``, ``tests[]`` with ``name``,
  ``score``, ``max_score``, ``status``, ``output``, ``visibility``);
* ``details.json`` (everything, for the instructor) and the worker's captured output per exercise;
* ``grades.csv``: the class gradebook, one row per student;
* a terminal summary table (rich).

A part that needs a regrade (a fault of the grader, not the student's) is said so everywhere: its lines
read "needs regrade" and carry no score, the totals say how many points wait for it, and the gradebook has
a ``needs_regrade`` column. Points this device cannot award (speed, graded on a CPU) are said so too: the
reports give the maximum here next to the course's, and why (the gradebook's ``speed_unavailable``). A
student's files are rewritten as soon as each of their exercises is graded.
"""

from __future__ import annotations

import csv
import io
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grader.checks import runtime
from grader.checks.text import escape as _e
from grader.grading.results import report_view, store
from grader.grading.results.report_view import REGRADE_NOTE, status_text, unavailable_note
from grader.grading.results.results import ExerciseResult, ungradable
from grader.grading.results.scoring import LINE_REGRADE, ExerciseScore
from grader.grading.results.scoring import points_text as _pts
from grader.speed import roofline
from grader.speed.credit import BenchmarkCredit


@dataclass
class StudentReport:
    student: str
    source: str
    kind: str
    problems: list[str]
    device: str  # description of where it was graded
    exercises: list[tuple[ExerciseScore, ExerciseResult]] = field(default_factory=list)
    elapsed_s: float = 0.0
    started: str = field(default_factory=lambda: time.strftime("%Y-%m-%d %H:%M:%S"))
    sandbox: str = ""  # where the student's code ran: "in a bubblewrap 0.8.0 sandbox", or WITHOUT one

    @property
    def ungradable(self) -> str | None:
        """Why nothing of this submission was graded (unreadable, or no exercise module), or None."""
        return ungradable(self.problems, [r for _, r in self.exercises])

    @property
    def graded_with(self) -> str:
        note = runtime.version_note(self.device)  # the Triton the workers ran, as the device's description names it
        where = f"{self.device}, {self.sandbox}" if self.sandbox else self.device
        return f"{where} (note: {note})" if note else where

    @property
    def score(self) -> float:
        return sum(s.score for s, _ in self.exercises)

    @property
    def max_score(self) -> float:
        return sum(s.max_score for s, _ in self.exercises)

    @property
    def pending(self) -> float:
        """Points waiting for a regrade."""
        return sum(s.pending for s, _ in self.exercises)

    @property
    def unavailable(self) -> float:
        """Points this device cannot award (left out of ``max_score``)."""
        return sum(s.unavailable_points for s, _ in self.exercises)

    def regrade_parts(self) -> list[str]:
        return [f"{r.exercise}/{name}" for _, r in self.exercises for name in r.regrade_parts()]



# ------------------------------------------------------------------------------------- gradescope


def gradescope(report: StudentReport) -> dict[str, Any]:
    tests = []
    for score, result in report.exercises:
        for line in score.lines:
            if line.status == LINE_REGRADE:  # no score and no status: neither 0 nor passed
                tests.append({"name": f"{line.name} (needs regrade)", "output": f"{REGRADE_NOTE}\n{line.output}",
                              "visibility": "visible"})
                continue
            tests.append({
                "name": line.name,
                "score": round(line.score, 4),
                "max_score": round(line.max_score, 4),
                "status": "passed" if line.passed else "failed",
                "output": line.output,
                "visibility": "visible",
            })
        if result.problems:
            tests.append({"name": f"{score.exercise}: problems while grading", "score": 0.0, "max_score": 0.0,
                          "status": "failed", "output": "\n\n".join(result.problems), "visibility": "visible"})
        if result.notes:
            tests.append({"name": f"{score.exercise}: notes", "output": "\n".join(result.notes),
                          "visibility": "visible"})
    output = [f"Graded with {report.graded_with}."] + [f"Submission problem: {p}" for p in report.problems]
    if note := unavailable_note(report):
        output.append(note)
    if report.pending > 0:
        output.insert(0, f"NEEDS REGRADE: {', '.join(report.regrade_parts())}. {REGRADE_NOTE}")
    return {
        "score": round(report.score, 4),
        "execution_time": round(report.elapsed_s, 1),
        "output": "\n".join(output),
        "visibility": "visible",
        "stdout_visibility": "hidden",
        "tests": tests,
    }


# --------------------------------------------------------------------------------------- markdown


def _fence(text: str) -> str:
    text = text.rstrip()
    fence = "```"
    while fence in text:
        fence += "`"
    return f"{fence}text\n{text}\n{fence}"


def markdown(report: StudentReport) -> str:
    v = report_view.view(report)
    out = [f"# Grade report: {v.student}", ""]
    out.append(f"**Total: {v.total} points** — graded with {v.graded_with}; {v.started}, {v.elapsed_s:.1f} s of "
               f"grading (its exercises' times added up). Submission: `{v.source}` ({v.kind}).")
    out.append("")
    if v.unavailable:
        out += [f"> {v.unavailable}", ""]
    if v.regrade:
        out += [f"> **Needs regrade** ({v.regrade}): {REGRADE_NOTE}", ""]
    out += [f"> Submission problem: {problem}" for problem in v.problems] + ([""] if v.problems else [])
    out += ["| Exercise | Score | Status |", "|---|---:|---|"]
    out += [f"| {exercise} | {total} | {status} |" for exercise, total, status in v.summary]
    for ex in v.exercises:
        out += ["", f"## {ex.exercise} — {ex.title}: {ex.total}", ""]
        if ex.status_message:
            out += [f"**{ex.status_message[0]}**", "", _fence(ex.status_message[1]), ""]
        out += ["| Check | Points | Result |", "|---|---:|---|"]
        out += [f"| {line.name} | {line.points} | {line.result} |" for line in ex.lines]
        for part in ex.parts:
            out += _part_md(part)
        if ex.problems:
            out += ["", "**Problems while grading:**", "", _fence("\n\n".join(ex.problems))]
        if ex.notes:
            out += ["", "**Notes:**", "", *(f"- {n}" for n in ex.notes)]
        out += ["", f"_{ex.exercise} took {ex.took}._"]
    return "\n".join(out) + "\n"


def _part_md(part: report_view.PartView) -> list[str]:
    out = []
    if part.failure is not None:
        out += ["", f"**{part.name}: smallest failing check** ({part.failure[0]}):", "", _fence(part.failure[1])]
        for where, hint in part.hints:
            out += ["", f"**{part.name}: hint** (from {where}): {hint}"]
    if part.checks is not None:
        c = part.checks
        out += ["", f"**{part.name}: every check** — {c.passed} of {c.total} passed:", ""]
        for kind, found in c.kinds:
            out.append(f"- {kind}, {sum(ok for ok, _, _ in found)} of {len(found)} passed:")
            out += [f"  - {'passed' if ok else 'FAILED'} `{label}`" + ("" if ok else f": {reason}")
                    for ok, label, reason in found]
    for rule, message in part.flags:
        out += ["", f"**Integrity flag `{rule}`** ({part.name}):", "", _fence(message)]
    if part.speed_rows:
        out += ["", f"**{part.name}: speed** — {part.speed}", "", *_speed_md(part.speed_rows)]
    elif part.speed is not None:
        out += ["", f"{part.name}: speed {part.speed}"]
    return out


SPEED_COLUMNS = (("label", "benchmark"), ("student_ms", "yours (ms)"), ("reference_ms", "reference (ms)"),
                 ("yardstick", "× reference"), ("baseline_ms", "baseline (ms)"),
                 ("ratio", "× baseline"), ("required_full", "full marks at"), ("required_partial", "partial from"),
                 ("gbps", "GB/s"), ("tflops", "TFLOP/s"), ("pct_roofline", "% of roofline"))


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return "" if value is None else str(value)


def _speed_md(rows: list[BenchmarkCredit]) -> list[str]:
    lines = ["| " + " | ".join(h for _, h in SPEED_COLUMNS) + " |", "|" + "---|" * len(SPEED_COLUMNS)]
    for row in rows:
        lines.append("| " + " | ".join(_cell(getattr(row, k)) for k, _ in SPEED_COLUMNS) + " |")
    return lines


# ------------------------------------------------------------------------------------------- html

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:72rem;color:#222;
padding:0 1rem}
h1{margin-bottom:.2rem}h2{border-bottom:1px solid #ddd;padding-bottom:.2rem;margin-top:2rem}
table{border-collapse:collapse;margin:.6rem 0}th,td{border:1px solid #ccc;padding:.25rem .6rem;text-align:left}
th{background:#f4f4f4}td.num{text-align:right;font-variant-numeric:tabular-nums}
.passed{color:#176f2c;font-weight:600}.failed{color:#b00020;font-weight:600}
.total{font-size:1.3rem}.meta{color:#666}.flag{background:#fff3f3;border-left:4px solid #b00020;padding:.4rem .8rem}
pre{background:#f7f7f7;padding:.6rem;overflow-x:auto;white-space:pre-wrap;font-size:.85rem}
.problem{background:#fff8e1;border-left:4px solid #f0a000;padding:.4rem .8rem}
.regrade{background:#eef3ff;border-left:4px solid #3557b7;padding:.4rem .8rem;color:#3557b7;font-weight:600}
.unavailable{background:#f4f4f4;border-left:4px solid #888;padding:.4rem .8rem}
svg text{font-family:inherit}
"""



def render_html(report: StudentReport) -> str:
    v = report_view.view(report)
    h = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
         f"<title>Grade report: {_e(v.student)}</title><style>{_CSS}</style></head><body>",
         f'<h1 id="student">Grade report: {_e(v.student)}</h1>',
         f'<p class="total" id="total">Total: <b>{_e(v.total)}</b> points</p>',
         f'<p class="meta">Graded with {_e(v.graded_with)}; {_e(v.started)}, {v.elapsed_s:.1f} s of grading (its '
         f"exercises' times added up). Submission: <code>{_e(v.source)}</code> ({_e(v.kind)}).</p>"]
    if v.unavailable:
        h.append(f'<p class="unavailable" id="speed-unavailable">{_e(v.unavailable)}</p>')
    if v.regrade:
        h.append(f'<p class="regrade" id="needs-regrade"><b>Needs regrade</b> ({_e(v.regrade)}): '
                 f"{_e(REGRADE_NOTE)}</p>")
    h += [f'<p class="problem">Submission problem: {_e(problem)}</p>' for problem in v.problems]
    h.append('<table id="summary"><tr><th>Exercise</th><th>Score</th><th>Status</th></tr>')
    h += [f'<tr><td><a href="#ex-{_e(exercise)}">{_e(exercise)}</a></td><td class="num">{_e(total)}</td>'
          f"<td>{_e(status)}</td></tr>" for exercise, total, status in v.summary]
    h.append("</table>")
    for ex in v.exercises:
        h.append(f'<section id="ex-{_e(ex.exercise)}"><h2>{_e(ex.exercise)} — {_e(ex.title)}: {_e(ex.total)}</h2>')
        if ex.status_message:
            h.append(f"<p><b>{_e(ex.status_message[0])}</b></p><pre>{_e(ex.status_message[1])}</pre>")
        h.append("<table><tr><th>Check</th><th>Points</th><th>Result</th></tr>")
        h += [f'<tr><td>{_e(line.name)}</td><td class="num">{_e(line.points)}</td>'
              + (f'<td class="{line.css}">' if line.css else "<td>") + f"{_e(line.result)}</td></tr>"
              for line in ex.lines]
        h.append("</table>")
        for part in ex.parts:
            h += _part_html(ex.exercise, part)
        if ex.problems:
            h.append('<h3>Problems while grading</h3><pre class="problem">'
                     f"{_e(chr(10).join(p + chr(10) for p in ex.problems))}</pre>")
        if ex.notes:
            h.append("<h3>Notes</h3><ul>" + "".join(f"<li>{_e(n)}</li>" for n in ex.notes) + "</ul>")
        h.append(f'<p class="meta">{_e(ex.exercise)} took {_e(ex.took)}.</p></section>')
    h.append("</body></html>")
    return "\n".join(h)


def _part_html(exercise: str, part: report_view.PartView) -> list[str]:
    h = []
    if part.failure is not None:
        h.append(f"<h3>{_e(part.name)}: smallest failing check</h3><p><code>{_e(part.failure[0])}</code></p>"
                 f'<pre class="failure">{_e(part.failure[1])}</pre>')
        h += [f'<p class="hint"><b>Hint</b> (from {_e(where)}): {_e(hint)}</p>' for where, hint in part.hints]
    if part.checks is not None:
        c = part.checks
        h.append(f"<h3>{_e(part.name)}: every check</h3><p>{c.passed} of {c.total} passed</p>"
                 f'<ul class="checks" id="checks-{_e(c.exercise)}-{_e(part.name)}">')
        for kind, found in c.kinds:
            items = "".join(f'<li class="{"passed" if ok else "failed"}">{"passed" if ok else "FAILED"} '
                            f"<code>{_e(label)}</code>" + ("" if ok else f": {_e(reason)}") + "</li>"
                            for ok, label, reason in found)
            h.append(f"<li>{_e(kind)}, {sum(ok for ok, _, _ in found)} of {len(found)} passed:<ul>{items}</ul></li>")
        h.append("</ul>")
    h += [f'<div class="flag"><b>Integrity flag <code>{_e(rule)}</code></b> ({_e(part.name)})<pre>{_e(message)}</pre>'
          "</div>" for rule, message in part.flags]
    if part.speed_rows:
        h.append(f"<h3>{_e(part.name)}: speed</h3><p>{_e(part.speed)}</p>")
        h.append(_speed_html(part.speed_rows))
        gbps, tflops = roofline.peaks(part.roofline)
        h.append(roofline.roofline_svg([r.to_dict() for r in part.speed_rows], title=f"{exercise} / {part.name}",
                                       peak_gbps=gbps, peak_tflops=tflops))
    elif part.speed is not None:
        h.append(f'<p class="meta">{_e(part.name)}: speed {_e(part.speed)}</p>')
    return h


def _speed_html(rows: list[BenchmarkCredit]) -> str:
    out = ['<table class="speed"><tr>' + "".join(f"<th>{_e(hd)}</th>" for _, hd in SPEED_COLUMNS) + "</tr>"]
    for row in rows:
        out.append("<tr>" + "".join(f'<td class="num">{_e(_cell(getattr(row, k)))}</td>' for k, _ in SPEED_COLUMNS)
                   + "</tr>")
    out.append("</table>")
    return "".join(out)


# ---------------------------------------------------------------------------------------- gradebook


def gradebook_csv(reports: list[StudentReport], exercise_names: list[str]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["student", "total", "max_total", *exercise_names, *(f"{n}_status" for n in exercise_names),
                     "pending_regrade", "needs_regrade", "source", "problems", "speed_unavailable"])
    for report in sorted(reports, key=lambda r: r.student):
        by_name = {s.exercise: s for s, _ in report.exercises}
        scores = [_pts(by_name[n].score) if n in by_name else "" for n in exercise_names]
        statuses = [_csv_status(by_name[n]) if n in by_name else "pending" for n in exercise_names]
        problems = "; ".join(report.problems + [
            f"{s.exercise}: {r.problems[0].splitlines()[0]}" for s, r in report.exercises if r.problems
        ])
        writer.writerow([report.student, _pts(report.score), _pts(report.max_score), *scores, *statuses,
                         _pts(report.pending), "; ".join(report.regrade_parts()), report.source, problems,
                         _pts(report.unavailable)])
    return buf.getvalue()


def _csv_status(score: ExerciseScore) -> str:
    """A status for a spreadsheet: "graded", whatever the score ("see below" points nowhere in a CSV)."""
    return "graded" if score.status == "graded" and score.pending <= 0 else status_text(score)


def details(report: StudentReport) -> dict[str, Any]:
    return {
        "student": report.student, "source": report.source, "kind": report.kind, "problems": report.problems,
        "device": report.device, "sandbox": report.sandbox, "score": report.score, "max_score": report.max_score,
        "pending": report.pending,
        "exercises": [{"score": s.to_dict(), "result": {k: v for k, v in r.to_dict().items() if k != "log"}}
                      for s, r in report.exercises],
    }


def write_student(out: Path, report: StudentReport) -> None:
    folder = store.student_dir(out, report.student)
    store.write_atomic(folder / "results.json", json.dumps(gradescope(report), indent=2) + "\n")
    store.write_atomic(folder / "report.md", markdown(report))
    store.write_atomic(folder / "report.html", render_html(report))
    store.write_atomic(folder / "details.json", json.dumps(details(report), indent=2, default=str) + "\n")
    for _, result in report.exercises:
        if result.log:
            store.write_atomic(folder / "logs" / f"{result.exercise}.log", result.log)
