"""Reports of a grading run (where they go: :mod:`grader.grading.store`):

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
a ``needs_regrade`` column. A student's files are rewritten as soon as each of their exercises is graded.
"""

from __future__ import annotations

import csv
import html
import io
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grader.grading import store
from grader.grading.results import ExerciseResult
from grader.grading.scoring import LINE_REGRADE, ExerciseScore, round_points


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
    def graded_with(self) -> str:
        return f"{self.device}, {self.sandbox}" if self.sandbox else self.device

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

    def regrade_parts(self) -> list[str]:
        return [f"{r.exercise}/{name}" for _, r in self.exercises for name in r.regrade_parts()]


def _pts(value: float) -> str:
    return f"{round_points(value):g}"


def _total(score: float, max_score: float, pending: float) -> str:
    text = f"{_pts(score)} / {_pts(max_score)}"
    return text + (f" ({_pts(pending)} pending a regrade)" if pending > 0 else "")


REGRADE_NOTE = ("Some parts need a regrade: the grader failed while judging them (a fault of the grader, not of "
                "your code). They are not scored yet; the total will change when they are regraded.")


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
    output = [f"Graded with {report.graded_with}."] + [f"Submission problem: {p}" for p in report.problems]
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
               f"{report.graded_with}; {report.started}, {report.elapsed_s:.1f} s. Submission: `{report.source}` "
               f"({report.kind}).")
    out.append("")
    if report.pending > 0:
        out += [f"> **Needs regrade** ({', '.join(report.regrade_parts())}): {REGRADE_NOTE}", ""]
    for problem in report.problems:
        out.append(f"> Submission problem: {problem}")
    if report.problems:
        out.append("")
    out += ["| Exercise | Score | Status |", "|---|---:|---|"]
    for score, _ in report.exercises:
        out.append(f"| {score.exercise} | {_total(score.score, score.max_score, score.pending)} | "
                   f"{_status_text(score)} |")
    for score, result in report.exercises:
        out += ["", f"## {score.exercise} — {score.title}: {_total(score.score, score.max_score, score.pending)}", ""]
        if score.status != "graded" and score.message:
            out += [f"**{score.status}**", "", _fence(score.message), ""]
        out += ["| Check | Points | Result |", "|---|---:|---|"]
        for line in score.lines:
            points = "–" if line.status == LINE_REGRADE else _pts(line.score)
            out.append(f"| {line.name} | {points} / {_pts(line.max_score)} | {line.status} |")
        for part in result.parts:
            failure = part.first_failure()
            if part.status == "graded" and failure is not None:
                out += ["", f"**{part.name}: smallest failing check** ({failure.label}):", "", _fence(failure.message)]
            for flag in part.flags:
                out += ["", f"**Integrity flag `{flag['rule']}`** ({part.name}):", "", _fence(flag["message"])]
            rows = part.speed.rows
            if rows:
                out += ["", f"**{part.name}: speed** — {part.speed.message}", "", *_speed_md(rows)]
            elif part.speed.status != "not graded":
                out += ["", f"{part.name}: speed {part.speed.message}"]
        if result.problems:
            out += ["", "**Problems while grading:**", "", _fence("\n\n".join(result.problems))]
        out += ["", f"_{score.exercise} took {result.elapsed_s:.1f} s._"]
    return "\n".join(out) + "\n"


def _status_text(score: ExerciseScore) -> str:
    if score.pending > 0:
        return "needs regrade"
    if score.status == "graded":
        return "graded" if score.score >= score.max_score - 1e-9 else "graded (see below)"
    return score.status


SPEED_COLUMNS = (("label", "benchmark"), ("student_ms", "yours (ms)"), ("baseline_ms", "baseline (ms)"),
                 ("ratio", "ratio"), ("required_full", "full marks at"), ("required_partial", "partial from"),
                 ("gbps", "GB/s"), ("tflops", "TFLOP/s"), ("pct_roofline", "% of roofline"))


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return "" if value is None else str(value)


def _speed_md(rows: list[dict]) -> list[str]:
    lines = ["| " + " | ".join(h for _, h in SPEED_COLUMNS) + " |", "|" + "---|" * len(SPEED_COLUMNS)]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(k)) for k, _ in SPEED_COLUMNS) + " |")
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
svg text{font-family:inherit}
"""


def _e(text: Any) -> str:
    return html.escape(str(text))


def render_html(report: StudentReport) -> str:
    h = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
         f"<title>Grade report: {_e(report.student)}</title><style>{_CSS}</style></head><body>",
         f'<h1 id="student">Grade report: {_e(report.student)}</h1>',
         f'<p class="total" id="total">Total: <b>{_e(_total(report.score, report.max_score, report.pending))}</b> '
         "points</p>",
         f'<p class="meta">Graded with {_e(report.graded_with)}; {_e(report.started)}, {report.elapsed_s:.1f} s. '
         f"Submission: <code>{_e(report.source)}</code> ({_e(report.kind)}).</p>"]
    if report.pending > 0:
        h.append(f'<p class="regrade" id="needs-regrade"><b>Needs regrade</b> '
                 f"({_e(', '.join(report.regrade_parts()))}): {_e(REGRADE_NOTE)}</p>")
    for problem in report.problems:
        h.append(f'<p class="problem">Submission problem: {_e(problem)}</p>')
    h.append('<table id="summary"><tr><th>Exercise</th><th>Score</th><th>Status</th></tr>')
    for score, _ in report.exercises:
        h.append(f'<tr><td><a href="#ex-{_e(score.exercise)}">{_e(score.exercise)}</a></td>'
                 f'<td class="num">{_e(_total(score.score, score.max_score, score.pending))}</td>'
                 f"<td>{_e(_status_text(score))}</td></tr>")
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
        h.append("</table>")
        for part in result.parts:
            failure = part.first_failure()
            if part.status == "graded" and failure is not None:
                h.append(f"<h3>{_e(part.name)}: smallest failing check</h3><p><code>{_e(failure.label)}</code></p>"
                         f'<pre class="failure">{_e(failure.message)}</pre>')
            for flag in part.flags:
                h.append(f'<div class="flag"><b>Integrity flag <code>{_e(flag["rule"])}</code></b> '
                         f"({_e(part.name)})<pre>{_e(flag['message'])}</pre></div>")
            speed = part.speed
            rows = speed.rows
            if rows:
                h.append(f"<h3>{_e(part.name)}: speed</h3><p>{_e(speed.message)}</p>")
                h.append(_speed_html(rows))
                roof = speed.roofline
                peaks = [v for v in (roof.get("matmul_tflops") or {}).values() if _num(v)]
                h.append(roofline_svg(rows, title=f"{score.exercise} / {part.name}",
                                      peak_gbps=_num(roof.get("copy_gbps")), peak_tflops=max(peaks) if peaks else None))
            elif speed.status != "not graded":
                h.append(f'<p class="meta">{_e(part.name)}: speed {_e(speed.message)}</p>')
        if result.problems:
            h.append('<h3>Problems while grading</h3><pre class="problem">'
                     f"{_e(chr(10).join(p + chr(10) for p in result.problems))}</pre>")
        h.append(f'<p class="meta">{_e(score.exercise)} took {result.elapsed_s:.1f} s.</p></section>')
    h.append("</body></html>")
    return "\n".join(h)


def _speed_html(rows: list[dict]) -> str:
    out = ['<table class="speed"><tr>' + "".join(f"<th>{_e(hd)}</th>" for _, hd in SPEED_COLUMNS) + "</tr>"]
    for row in rows:
        out.append("<tr>" + "".join(f'<td class="num">{_e(_cell(row.get(k)))}</td>' for k, _ in SPEED_COLUMNS)
                   + "</tr>")
    out.append("</table>")
    return "".join(out)


def _num(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number > 0 else None


def roofline_svg(rows: list[dict], *, title: str = "", peak_gbps: float | None = None,
                 peak_tflops: float | None = None) -> str:
    """A log-log roofline plot (FLOP/byte vs TFLOP/s) of the benchmarks, drawn as inline SVG.

    Each benchmark is a filled dot at its achieved throughput and a ring at what the roofline allows
    at its intensity (achieved ÷ % of roofline). With the GPU's peaks the roof itself is drawn. Rows
    without FLOP counts (pure bandwidth kernels) are shown as bars of % of roofline instead.
    """
    points = []
    for row in rows:
        gbps, tflops = _num(row.get("gbps")), _num(row.get("tflops"))
        if gbps and tflops:
            pct = _num(row.get("pct_roofline"))
            attainable = tflops / (pct / 100) if pct else None
            points.append((str(row.get("label", "")), 1e3 * tflops / gbps, tflops, attainable))
    if not points:
        return _pct_bars(rows, title)
    width, height, left, bottom, top, right = 560, 340, 64, 44, 28, 16
    xs = [p[1] for p in points]
    ys = [v for p in points for v in (p[2], p[3]) if v]
    if peak_tflops:
        ys.append(peak_tflops)
    x0, x1 = math.floor(math.log10(min(xs))) - 0.5, math.ceil(math.log10(max(xs))) + 0.5
    y0, y1 = math.floor(math.log10(min(ys))) - 0.3, math.ceil(math.log10(max(ys))) + 0.3

    def sx(x: float) -> float:
        return left + (math.log10(x) - x0) / (x1 - x0) * (width - left - right)

    def sy(y: float) -> float:
        return height - bottom - (math.log10(y) - y0) / (y1 - y0) * (height - bottom - top)

    svg = [f'<svg class="roofline" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="roofline plot {_e(title)}">',
           f'<rect x="0" y="0" width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2}" y="16" text-anchor="middle" font-size="13">Roofline: {_e(title)}</text>']
    for k in range(math.ceil(x0), math.floor(x1) + 1):
        x = sx(10.0**k)
        svg.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{height - bottom}" stroke="#eee"/>'
                   f'<text x="{x:.1f}" y="{height - bottom + 14}" text-anchor="middle" font-size="10">1e{k}</text>')
    for k in range(math.ceil(y0), math.floor(y1) + 1):
        y = sy(10.0**k)
        svg.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" stroke="#eee"/>'
                   f'<text x="{left - 6}" y="{y + 3:.1f}" text-anchor="end" font-size="10">1e{k}</text>')
    svg.append(f'<rect x="{left}" y="{top}" width="{width - left - right}" height="{height - top - bottom}" '
               'fill="none" stroke="#888"/>')
    svg.append(f'<text x="{(left + width - right) / 2}" y="{height - 8}" text-anchor="middle" font-size="11">'
               "arithmetic intensity (FLOP/byte)</text>")
    svg.append(f'<text x="14" y="{(top + height - bottom) / 2}" text-anchor="middle" font-size="11" '
               f'transform="rotate(-90 14 {(top + height - bottom) / 2})">TFLOP/s</text>')
    if peak_gbps and peak_tflops:
        ridge = 1e3 * peak_tflops / peak_gbps
        xa, xb = 10.0**x0, 10.0**x1
        roof = [(xa, min(peak_tflops, peak_gbps * xa / 1e3)), (max(min(ridge, xb), xa), peak_tflops),
                (xb, peak_tflops)]
        pts = " ".join(f"{sx(x):.1f},{sy(max(y, 10.0**y0)):.1f}" for x, y in roof)
        svg.append(f'<polyline points="{pts}" fill="none" stroke="#444" stroke-width="2"/>')
    for label, x, achieved, attainable in points:
        if attainable:
            svg.append(f'<line x1="{sx(x):.1f}" y1="{sy(achieved):.1f}" x2="{sx(x):.1f}" y2="{sy(attainable):.1f}" '
                       'stroke="#99b" stroke-dasharray="3,3"/>'
                       f'<circle cx="{sx(x):.1f}" cy="{sy(attainable):.1f}" r="5" fill="none" stroke="#336"/>')
        svg.append(f'<circle class="point" cx="{sx(x):.1f}" cy="{sy(achieved):.1f}" r="4.5" fill="#1f77b4">'
                   f"<title>{_e(label)}: {achieved:.3g} TFLOP/s at {x:.3g} FLOP/byte</title></circle>"
                   f'<text x="{sx(x) + 7:.1f}" y="{sy(achieved) - 6:.1f}" font-size="10">{_e(label)}</text>')
    svg.append("</svg>")
    return "".join(svg)


def _pct_bars(rows: list[dict], title: str) -> str:
    bars = [(str(r.get("label", "")), _num(r.get("pct_roofline"))) for r in rows]
    bars = [(label, pct) for label, pct in bars if pct]
    if not bars:
        return ""
    width, row_h, left = 560, 22, 180
    height = 34 + row_h * len(bars)
    svg = [f'<svg class="roofline" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="percent of roofline {_e(title)}">',
           f'<text x="{width / 2}" y="16" text-anchor="middle" font-size="13">% of roofline: {_e(title)}</text>']
    for i, (label, pct) in enumerate(bars):
        y = 26 + i * row_h
        w = (width - left - 60) * min(pct, 100.0) / 100.0
        svg.append(f'<text x="{left - 6}" y="{y + 13}" text-anchor="end" font-size="11">{_e(label)}</text>'
                   f'<rect x="{left}" y="{y}" width="{width - left - 60}" height="{row_h - 6}" fill="#eee"/>'
                   f'<rect class="point" x="{left}" y="{y}" width="{w:.1f}" height="{row_h - 6}" fill="#1f77b4"/>'
                   f'<text x="{left + w + 4:.1f}" y="{y + 13}" font-size="11">{pct:.0f}%</text>')
    svg.append("</svg>")
    return "".join(svg)


# ---------------------------------------------------------------------------------------- gradebook


def gradebook_csv(reports: list[StudentReport], exercise_names: list[str]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["student", "total", "max_total", *exercise_names, *(f"{n}_status" for n in exercise_names),
                     "pending_regrade", "needs_regrade", "source", "problems"])
    for report in sorted(reports, key=lambda r: r.student):
        by_name = {s.exercise: s for s, _ in report.exercises}
        scores = [_pts(by_name[n].score) if n in by_name else "" for n in exercise_names]
        statuses = [_status_text(by_name[n]) if n in by_name else "pending" for n in exercise_names]
        problems = "; ".join(report.problems + [
            f"{s.exercise}: {r.problems[0].splitlines()[0]}" for s, r in report.exercises if r.problems
        ])
        writer.writerow([report.student, _pts(report.score), _pts(report.max_score), *scores, *statuses,
                         _pts(report.pending), "; ".join(report.regrade_parts()), report.source, problems])
    return buf.getvalue()


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


# ----------------------------------------------------------------------------------------- terminal


def summary_table(reports: list[StudentReport], exercise_names: list[str], title: str = "Grades"):
    from rich.table import Table

    table = Table(title=title)
    table.add_column("student")
    for name in exercise_names:
        table.add_column(name, justify="right")
    table.add_column("total", justify="right")
    table.add_column("time", justify="right")
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
            note = "" if s.status == "graded" else f" ({_status_text(s)})"
            cells.append(f"[{style}]{_pts(s.score)}/{_pts(s.max_score)}{note}[/]")
        table.add_row(report.student, *cells, f"{_pts(report.score)}/{_pts(report.max_score)}",
                      f"{report.elapsed_s:.0f} s")
    return table
