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
from grader.grading.results import store
from grader.grading.results.results import ExerciseResult, ungradable
from grader.grading.results.scoring import LINE_REGRADE, ExerciseScore
from grader.grading.results.scoring import points_text as _pts
from grader.speed import credit, roofline
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



def _total(score: float, max_score: float, pending: float) -> str:
    text = f"{_pts(score)} / {_pts(max_score)}"
    return text + (f" ({_pts(pending)} pending a regrade)" if pending > 0 else "")


REGRADE_NOTE = ("Some parts need a regrade: the grader failed while judging them (a fault of the grader, not of "
                "your code). They are not scored yet; the total will change when they are regraded.")


def unavailable_note(report: StudentReport) -> str:
    """Why the maximum is below the course's: the points this device cannot award, and the reason ("" if none)."""
    missing = report.unavailable
    if missing <= 0:
        return ""
    reasons = sorted({u.reason for s, _ in report.exercises for u in s.unavailable})
    return (f"The maximum here is {_pts(report.max_score)} points, not {_pts(report.max_score + missing)}: the "
            f"other {_pts(missing)} are speed points, not available in this run — " + "; ".join(reasons) + ".")


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
    out = [f"# Grade report: {report.student}", ""]
    out.append(f"**Total: {_total(report.score, report.max_score, report.pending)} points** — graded with "
               f"{report.graded_with}; {report.started}, {report.elapsed_s:.1f} s of grading (its exercises' times "
               f"added up). Submission: `{report.source}` ({report.kind}).")
    out.append("")
    if note := unavailable_note(report):
        out += [f"> {note}", ""]
    if report.pending > 0:
        out += [f"> **Needs regrade** ({', '.join(report.regrade_parts())}): {REGRADE_NOTE}", ""]
    for problem in report.problems:
        out.append(f"> Submission problem: {problem}")
    if report.problems:
        out.append("")
    out += ["| Exercise | Score | Status |", "|---|---:|---|"]
    for score, _ in report.exercises:
        out.append(f"| {score.exercise} | {_total(score.score, score.max_score, score.pending)} | "
                   f"{status_text(score)} |")
    for score, result in report.exercises:
        out += ["", f"## {score.exercise} — {score.title}: {_total(score.score, score.max_score, score.pending)}", ""]
        if score.status != "graded" and score.message:
            out += [f"**{score.status}**", "", _fence(score.message), ""]
        out += ["| Check | Points | Result |", "|---|---:|---|"]
        for line in score.lines:
            points = "–" if line.status == LINE_REGRADE else _pts(line.score)
            out.append(f"| {line.name} | {points} / {_pts(line.max_score)} | {line.status} |")
        for u in score.unavailable:
            out.append(f"| {score.exercise} / {u.part}: speed | – / {_pts(u.points)} (not counted) | not available: "
                       f"{u.reason} |")
        for part in result.parts:
            failure = part.first_failure()
            if part.status == "graded" and failure is not None:
                out += ["", f"**{part.name}: smallest failing check** ({failure.label}):", "", _fence(failure.message)]
                if hint := part.layout_hint():
                    out += ["", f"**{part.name}: hint** (from all its cases): {hint}"]
                if common := part.common_hint():
                    hint, n, of = common
                    out += ["", f"**{part.name}: hint** (from {n} of {of} failing checks): {hint}"]
                out += ["", f"**{part.name}: every check** — {part.passed_cases} of {len(part.correctness)} passed:",
                        ""]
                for kind, checks in part.checks_by_kind():
                    out.append(f"- {kind}, {sum(c.passed for c in checks)} of {len(checks)} passed:")
                    out += [f"  - {'passed' if c.passed else 'FAILED'} `{c.label}`"
                            + ("" if c.passed else f": {c.reason}") for c in checks]
            for flag in part.flags:
                out += ["", f"**Integrity flag `{flag['rule']}`** ({part.name}):", "", _fence(flag["message"])]
            rows = part.speed.rows
            if rows:
                out += ["", f"**{part.name}: speed** — {part.speed.message}", "", *_speed_md(rows)]
            elif part.speed.status != credit.NOT_GRADED:
                out += ["", f"{part.name}: speed {part.speed.message}"]
        if result.problems:
            out += ["", "**Problems while grading:**", "", _fence("\n\n".join(result.problems))]
        if result.notes:
            out += ["", "**Notes:**", "", *(f"- {n}" for n in result.notes)]
        out += ["", f"_{score.exercise} took {result.elapsed_s:.1f} s{ran_on(result)}._"]
    return "\n".join(out) + "\n"


def ran_on(result: ExerciseResult) -> str:
    """' on GPU 2 (NVIDIA H100, GPU-...)' and the GPUs that failed under it, if any; nothing on the CPU."""
    device = result.device
    if device.get("kind") != "cuda":
        return ""
    text = f" on GPU {device.get('index', '?')} ({device.get('name', '?')}, {device.get('uuid') or 'no UUID'})"
    if device.get("replaces"):
        text += f", graded again there after a GPU failed: {'; '.join(device['replaces'])}"
    return text


def status_text(score: ExerciseScore) -> str:
    if score.pending > 0:
        return "needs regrade"
    if score.status == "graded":
        return "graded" if score.score >= score.max_score - 1e-9 else "graded (see below)"
    return score.status


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
    h = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
         f"<title>Grade report: {_e(report.student)}</title><style>{_CSS}</style></head><body>",
         f'<h1 id="student">Grade report: {_e(report.student)}</h1>',
         f'<p class="total" id="total">Total: <b>{_e(_total(report.score, report.max_score, report.pending))}</b> '
         "points</p>",
         f'<p class="meta">Graded with {_e(report.graded_with)}; {_e(report.started)}, {report.elapsed_s:.1f} s of '
         f"grading (its exercises' times added up). Submission: <code>{_e(report.source)}</code> "
         f"({_e(report.kind)}).</p>"]
    if note := unavailable_note(report):
        h.append(f'<p class="unavailable" id="speed-unavailable">{_e(note)}</p>')
    if report.pending > 0:
        h.append(f'<p class="regrade" id="needs-regrade"><b>Needs regrade</b> '
                 f"({_e(', '.join(report.regrade_parts()))}): {_e(REGRADE_NOTE)}</p>")
    for problem in report.problems:
        h.append(f'<p class="problem">Submission problem: {_e(problem)}</p>')
    h.append('<table id="summary"><tr><th>Exercise</th><th>Score</th><th>Status</th></tr>')
    for score, _ in report.exercises:
        h.append(f'<tr><td><a href="#ex-{_e(score.exercise)}">{_e(score.exercise)}</a></td>'
                 f'<td class="num">{_e(_total(score.score, score.max_score, score.pending))}</td>'
                 f"<td>{_e(status_text(score))}</td></tr>")
    h.append("</table>")
    for score, result in report.exercises:
        h.append(f'<section id="ex-{_e(score.exercise)}"><h2>{_e(score.exercise)} — {_e(score.title)}: '
                 f"{_e(_total(score.score, score.max_score, score.pending))}</h2>")
        if score.status != "graded" and score.message:
            h.append(f"<p><b>{_e(score.status)}</b></p><pre>{_e(score.message)}</pre>")
        h.append("<table><tr><th>Check</th><th>Points</th><th>Result</th></tr>")
        for line in score.lines:
            mark = {"passed": "passed", "failed": "failed"}.get(line.status, "regrade")
            points = "–" if line.status == LINE_REGRADE else _pts(line.score)
            h.append(f"<tr><td>{_e(line.name)}</td><td class=\"num\">{points} / {_pts(line.max_score)}"
                     f'</td><td class="{mark}">{_e(line.status)}</td></tr>')
        for u in score.unavailable:
            h.append(f"<tr><td>{_e(score.exercise)} / {_e(u.part)}: speed</td><td class=\"num\">– / "
                     f"{_pts(u.points)} (not counted)</td><td>not available: {_e(u.reason)}</td></tr>")
        h.append("</table>")
        for part in result.parts:
            failure = part.first_failure()
            if part.status == "graded" and failure is not None:
                h.append(f"<h3>{_e(part.name)}: smallest failing check</h3><p><code>{_e(failure.label)}</code></p>"
                         f'<pre class="failure">{_e(failure.message)}</pre>')
                if hint := part.layout_hint():
                    h.append(f'<p class="hint"><b>Hint</b> (from all its cases): {_e(hint)}</p>')
                if common := part.common_hint():
                    hint, n, of = common
                    h.append(f'<p class="hint"><b>Hint</b> (from {n} of {of} failing checks): {_e(hint)}</p>')
                h.append(f'<h3>{_e(part.name)}: every check</h3><p>{part.passed_cases} of {len(part.correctness)} '
                         f'passed</p><ul class="checks" id="checks-{_e(score.exercise)}-{_e(part.name)}">')
                for kind, checks in part.checks_by_kind():
                    items = "".join(f'<li class="{"passed" if c.passed else "failed"}">'
                                    f'{"passed" if c.passed else "FAILED"} <code>{_e(c.label)}</code>'
                                    + ("" if c.passed else f": {_e(c.reason)}") + "</li>" for c in checks)
                    h.append(f"<li>{_e(kind)}, {sum(c.passed for c in checks)} of {len(checks)} passed:"
                             f"<ul>{items}</ul></li>")
                h.append("</ul>")
            for flag in part.flags:
                h.append(f'<div class="flag"><b>Integrity flag <code>{_e(flag["rule"])}</code></b> '
                         f"({_e(part.name)})<pre>{_e(flag['message'])}</pre></div>")
            speed = part.speed
            rows = speed.rows
            if rows:
                h.append(f"<h3>{_e(part.name)}: speed</h3><p>{_e(speed.message)}</p>")
                h.append(_speed_html(rows))
                gbps, tflops = roofline.peaks(speed.roofline)
                h.append(roofline.roofline_svg([r.to_dict() for r in rows], title=f"{score.exercise} / {part.name}",
                                               peak_gbps=gbps, peak_tflops=tflops))
            elif speed.status != credit.NOT_GRADED:
                h.append(f'<p class="meta">{_e(part.name)}: speed {_e(speed.message)}</p>')
        if result.problems:
            h.append('<h3>Problems while grading</h3><pre class="problem">'
                     f"{_e(chr(10).join(p + chr(10) for p in result.problems))}</pre>")
        if result.notes:
            h.append("<h3>Notes</h3><ul>" + "".join(f"<li>{_e(n)}</li>" for n in result.notes) + "</ul>")
        h.append(f'<p class="meta">{_e(score.exercise)} took {result.elapsed_s:.1f} s{_e(ran_on(result))}.</p>'
                 "</section>")
    h.append("</body></html>")
    return "\n".join(h)


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
