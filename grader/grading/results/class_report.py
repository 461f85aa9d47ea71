"""The class report of a batch: one self-contained HTML page (inline CSS and SVG, nothing fetched) and a
CSV of the same numbers, for the instructor.

* score distribution per exercise and per part (statistics and a histogram of the share of points earned);
* the checks the class failed most: how many students failed each, with one example message;
* the speed ratio (baseline time ÷ the student's time, measured by the grader) per benchmark;
* a verified speed leaderboard: the geometric mean of each student's measured ratios over every benchmark
  the class was timed on, with the GPU named. Students appear under the ``display_name`` they opted into
  (``student.toml`` or the notebook's metadata), else under an anonymous id that only the batch's salt links
  to them. Parts zeroed by an integrity flag or awaiting a regrade are not ranked;
* integrity flags, grader errors and parts that need a regrade, work not graded yet, GPUs taken out;
* submissions of which nothing could be graded (an unreadable zip or notebook, no exercise module), with the
  reason: listed apart and left out of the score statistics, where they would read as ordinary zeros.

The CSV is long-form: ``section, exercise, part, item, student, value, max, detail``.
"""

from __future__ import annotations

import csv
import hashlib
import io
import math
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from grader.checks.spec import Exercise
from grader.checks.text import escape as _e
from grader.checks.text import positive_number as _num
from grader.grading.results.class_report_plots import histogram_svg, strip_svg
from grader.grading.results.reports import StudentReport
from grader.grading.results.results import FAILED, ExerciseResult
from grader.grading.results.scoring import LINE_REGRADE
from grader.speed import credit

TOP_CHECKS = 20

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:76rem;color:#222;
padding:0 1rem}
h2{border-bottom:1px solid #ddd;padding-bottom:.2rem;margin-top:2rem}
table{border-collapse:collapse;margin:.6rem 0}th,td{border:1px solid #ccc;padding:.25rem .6rem;text-align:left;
vertical-align:top}th{background:#f4f4f4}td.num{text-align:right;font-variant-numeric:tabular-nums}
.meta{color:#666}pre{background:#f7f7f7;padding:.4rem;white-space:pre-wrap;font-size:.8rem;margin:0;max-width:40rem}
.plots{display:flex;flex-wrap:wrap;gap:1rem}svg text{font-family:inherit}
"""


def _f(value: float | None, digits: int = 2) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def anonymous_id(student: str, salt: str) -> str:
    return "anon-" + hashlib.sha256(f"{salt}\x1f{student}".encode()).hexdigest()[:6]


def _stats(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"n": 0, "mean": None, "median": None, "min": None, "max": None}
    return {"n": len(values), "mean": statistics.fmean(values), "median": statistics.median(values),
            "min": min(values), "max": max(values)}


class _Table:
    """The CSV rows, collected while the page is written."""

    def __init__(self) -> None:
        self.rows: list[list[Any]] = []

    def add(self, section: str, exercise: str = "", part: str = "", item: str = "", student: str = "",
            value: Any = "", max_value: Any = "", detail: str = "") -> None:
        self.rows.append([section, exercise, part, item, student, value, max_value, detail])

    def text(self) -> str:
        buf = io.StringIO()
        writer = csv.writer(buf)
        writer.writerow(["section", "exercise", "part", "item", "student", "value", "max", "detail"])
        writer.writerows(self.rows)
        return buf.getvalue()


def _part_points(report: StudentReport) -> dict[tuple[str, str], tuple[float, float]]:
    points: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for score, _ in report.exercises:
        for line in score.lines:
            if line.status != LINE_REGRADE:
                points[(line.exercise, line.part)][0] += line.score
            points[(line.exercise, line.part)][1] += line.max_score
    return {k: (v[0], v[1]) for k, v in points.items()}


def _first_line(text: str, limit: int = 300) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[:limit] + " …"


def _speed_rows(result: ExerciseResult):
    """(part, row) for every benchmark the grader timed and that may be ranked."""
    for part in result.parts:
        if part.speed.status != credit.MEASURED or part.flags or part.needs_regrade:
            continue
        for row in part.speed.rows:
            if isinstance(row.ratio, int | float) and row.ratio > 0:
                yield part, row


def render(students: list[StudentReport], *, run: Mapping[str, Any], display_names: Mapping[str, str | None],
           gpu_failures: Sequence[Mapping[str, Any]], all_exercises: Sequence[Exercise]) -> tuple[str, str]:
    """The page and the CSV."""
    names = list(run.get("exercises", []))
    table = _Table()
    ungradable = {r.student: why for r in students if (why := r.ungradable)}
    graded = [r for r in students if r.student not in ungradable]
    ratios = _ratios(graded)
    unread_note = f'; <a href="#ungradable">{len(ungradable)} could not be graded</a>' if ungradable else ""
    h = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8"><title>Class report</title>',
         f"<style>{_CSS}</style></head><body>", '<h1 id="title">Class report</h1>',
         f'<p class="meta" id="meta"><span id="n-students">{len(students)}</span> student(s); exercises '
         f"{_e(', '.join(names))}; graded on {_e(run.get('device', '?'))}; started {_e(run.get('started', '?'))}"
         f"{'; last updated ' + _e(run['updated']) if run.get('updated') else ''}"
         f"{unread_note}.</p>"]
    h += _scores(graded, names, {e.name: e for e in all_exercises}, table)
    h += _failed_checks(graded, table)
    h += _speed(ratios, table)
    h += _leaderboard(graded, ratios, display_names, str(run.get("secret_salt", "")), table)
    h += _ungradable(ungradable, table)
    h += _problems(students, names, gpu_failures, table)
    h.append("</body></html>")
    return "\n".join(h), table.text()


def _scores(students: list[StudentReport], names: list[str], by_name: Mapping[str, Exercise],
            table: _Table) -> list[str]:
    """Statistics per exercise and part (students awaiting a regrade left out), and histograms."""
    totals = [r.score for r in students if r.exercises]
    total_max = max((r.max_score for r in students), default=0.0)
    rows: list[tuple[str, str, list[float], float, int]] = [("total", "", totals, total_max, 0)]
    plots = [histogram_svg([t / total_max for t in totals], title="total: share of points", ident="total")
             if totals and total_max > 0 else ""]
    for name in names:
        per_ex, per_part, max_ex, regrade = [], defaultdict(list), 0.0, 0
        part_max: dict[str, float] = {}
        for report in students:
            score = next((s for s, _ in report.exercises if s.exercise == name), None)
            if score is None:
                continue
            if score.pending > 0:
                regrade += 1
                continue
            per_ex.append(score.score)
            max_ex = max(max_ex, score.max_score)  # a part not timed (no GPU) has no speed line: take the largest
            for (ex, part), (got, most) in _part_points(report).items():
                if ex == name:
                    per_part[part].append(got)
                    part_max[part] = max(part_max.get(part, 0.0), most)
        rows.append((name, "", per_ex, max_ex, regrade))
        parts = [p.name for p in by_name[name].parts] if name in by_name else sorted(per_part)
        rows += [(name, p, per_part[p], part_max.get(p, 0.0), 0) for p in parts if p in per_part]
        if per_ex and max_ex > 0:
            plots.append(histogram_svg([v / max_ex for v in per_ex], title=f"{name}: share of points", ident=name))
    h = ['<h2 id="scores">Scores</h2><table id="score-table"><tr><th>exercise / part</th><th>students</th>'
         "<th>max</th><th>mean</th><th>median</th><th>min</th><th>highest</th><th>full marks</th>"
         "<th>zero</th><th>needs regrade</th></tr>"]
    keys = ["n", "max", "mean", "median", "min", "highest", "full", "zero", "regrade"]
    for ex, part, values, most, regrade in rows:
        st = _stats(values)
        full = sum(v >= most - 1e-9 for v in values) if most > 0 else 0
        cells = [st["n"], _f(most), _f(st["mean"]), _f(st["median"]), _f(st["min"]), _f(st["max"]), full,
                 sum(v <= 1e-9 for v in values), regrade]
        ident = f"{ex}{'.' + part if part else ''}"
        label = _e(f"{ex} / {part}") if part else f"<b>{_e(ex)}</b>"
        h.append(f"<tr><td>{label}</td>" + "".join(f'<td class="num" id="stat-{_e(ident)}-{k}">{_e(c)}</td>'
                                                  for k, c in zip(keys, cells)) + "</tr>")
        for k, c in zip(keys, cells):
            table.add("score", ex, part, k, value=c, max_value=_f(most))
    h.append(f'</table><div class="plots">{"".join(plots)}</div>')
    return h


def _failed_checks(students: list[StudentReport], table: _Table) -> list[str]:
    """Each check failed by someone: how many students, and the first one's message."""
    failed: dict[tuple[str, str], list[tuple[str, str, str]]] = defaultdict(list)
    for report in sorted(students, key=lambda r: r.student):
        for _, result in report.exercises:
            seen = set()
            for part in result.parts:
                for check in part.checks:
                    key = (result.exercise, check.id)
                    if check.status == FAILED and key not in seen:
                        seen.add(key)
                        failed[key].append((report.student, check.label, check.reason))
    ranked = sorted(failed.items(), key=lambda kv: (-len(kv[1]), kv[0]))[:TOP_CHECKS]
    h = [f'<h2 id="failed-checks">Checks the class failed most</h2><p class="meta">{len(failed)} check(s) failed '
         f"by at least one student; the {len(ranked)} most failed, with one example message.</p>",
         '<table id="failed-table"><tr><th>exercise</th><th>check</th><th>students</th><th>example</th></tr>']
    for (exercise, check_id), who in ranked:
        _, label, message = who[0]
        named = "" if label in check_id else f'<br><span class="meta">{_e(label)}</span>'  # an example's id has it
        h.append(f'<tr><td>{_e(exercise)}</td><td><code>{_e(check_id)}</code>{named}'
                 f'</td><td class="num" data-check="{_e(exercise)}:{_e(check_id)}">{len(who)}</td>'
                 f"<td><pre>{_e(_first_line(message))}</pre></td></tr>")
    for (exercise, check_id), who in sorted(failed.items()):
        table.add("failed_check", exercise, check_id.split(".", 1)[0], check_id, value=len(who),
                  detail=_first_line(who[0][2]))
    h.append("</table>")
    return h


Ratios = dict[tuple[str, str, str], list[tuple[str, float, dict]]]  # (exercise, part, benchmark) -> per student


def _ratios(students: list[StudentReport]) -> Ratios:
    ratios: Ratios = defaultdict(list)
    for report in students:
        for _, result in report.exercises:
            for part, row in _speed_rows(result):
                value = row.yardstick if row.yardstick is not None else row.ratio  # × the reference where timed
                ratios[(result.exercise, part.name, row.label)].append((report.student, float(value), row))
    return ratios


def _speed(ratios: Ratios, table: _Table) -> list[str]:
    h = ['<h2 id="speed">Speed ratios</h2><p class="meta">ratio = the reference solution\'s time ÷ the student\'s '
         "time (the baseline\'s where the reference was not timed), both measured by the grader in the same rounds "
         "on the same GPU (higher is faster).</p>"]
    if not ratios:
        return [*h, '<p id="no-speed">No speed was measured in this batch (it ran on the CPU, or no GPU is '
                "calibrated).</p>"]
    h.append('<table id="speed-table"><tr><th>benchmark</th><th>students</th><th>min</th><th>median</th>'
             "<th>max</th><th>partial credit from</th><th>full credit at</th></tr>")
    strips = []
    for (exercise, part, label), entries in sorted(ratios.items()):
        values = [v for _, v, _ in entries]
        st = _stats(values)
        sample = entries[0][2]
        beside = sample.yardstick is not None
        full = sample.yardstick_full if beside else sample.required_full
        partial = sample.yardstick_partial if beside else sample.required_partial
        ident = f"{exercise}.{part}.{label}"
        h.append(f'<tr><td>{_e(ident)}</td><td class="num">{st["n"]}</td><td class="num">{_f(st["min"])}</td>'
                 f'<td class="num" id="ratio-{_e(ident)}-median">{_f(st["median"])}</td><td class="num">'
                 f'{_f(st["max"])}</td><td class="num">{_f(_num(partial))}</td>'
                 f'<td class="num">{_f(_num(full))}</td></tr>')
        strips.append(strip_svg(values, title=ident, full=_num(full), partial=_num(partial)))
        for student, value, _ in entries:
            table.add("speed_ratio", exercise, part, label, student, f"{value:.6g}")
    h.append(f'</table><div class="plots">{"".join(strips)}</div>')
    return h


def _leaderboard(students: list[StudentReport], ratios: Ratios, display_names: Mapping[str, str | None], salt: str,
                 table: _Table) -> list[str]:
    """The geometric mean of each student's ratios, for the students timed on every benchmark."""
    everyone = set(ratios)
    if not everyone:
        return ['<h2 id="leaderboard">Speed leaderboard (verified)</h2><p id="no-leaderboard">No leaderboard: no '
                "speed was measured in this batch.</p>"]
    board = []
    for report in students:
        mine, gpus = {}, set()
        for _, result in report.exercises:
            for part, row in _speed_rows(result):
                mine[(result.exercise, part.name, row.label)] = float(row.ratio)
                gpus.add(str(result.device.get("name") or "?"))
        if everyone and set(mine) == everyone:
            geo = math.exp(statistics.fmean(math.log(v) for v in mine.values()))
            shown = display_names.get(report.student) or anonymous_id(report.student, salt)
            board.append((geo, shown, report.student, ", ".join(sorted(gpus))))
    board.sort(key=lambda b: (-b[0], b[1]))
    unranked = sum(1 for r in students if r.exercises) - len(board)
    h = ['<h2 id="leaderboard">Speed leaderboard (verified)</h2><p class="meta">The geometric mean of each '
         f"student's ratios over the {len(everyone)} benchmark(s) the class was timed on; every time was measured by "
         "the grader, none is self-reported. Names are shown only where the student opted in (display_name); the "
         f"others are anonymous. {unranked} student(s) not ranked (not every benchmark measured, an integrity flag, "
         "or a pending regrade).</p>",
         '<table id="leaderboard-table"><tr><th>rank</th><th>name</th><th>geometric mean ratio</th><th>GPU</th></tr>']
    for rank, (geo, shown, student, gpus) in enumerate(board, 1):
        h.append(f'<tr><td class="num">{rank}</td><td>{_e(shown)}</td><td class="num" data-geomean="{geo:.6g}">'
                 f"{geo:.3f}</td><td>{_e(gpus)}</td></tr>")
        table.add("leaderboard", item=str(rank), student=student, value=f"{geo:.6g}", detail=f"{shown}; {gpus}")
    h.append("</table>")
    return h


def _ungradable(ungradable: Mapping[str, str], table: _Table) -> list[str]:
    """The submissions of which nothing could be graded, each with why; not in the statistics above."""
    if not ungradable:
        return []
    h = [f'<h2 id="ungradable">Submissions that could not be graded</h2><p class="meta">{len(ungradable)} '
         "submission(s) could not be read or held no exercise module: left out of the statistics above (not "
         "counted as zeros); their reports and the gradebook give them no points.</p>",
         '<table id="ungradable-table"><tr><th>student</th><th>reason</th></tr>']
    for student, why in sorted(ungradable.items()):
        h.append(f"<tr><td>{_e(student)}</td><td><pre>{_e(_first_line(why))}</pre></td></tr>")
        table.add("ungradable", student=student, detail=_first_line(why))
    h.append("</table>")
    return h


_NONE_ROW = '<tr><td colspan="4" class="meta none">{what}</td></tr>'  # an empty table says so


def _problems(students: list[StudentReport], names: list[str], gpu_failures: Sequence[Mapping[str, Any]],
              table: _Table) -> list[str]:
    """Integrity flags, parts awaiting a regrade, work without a result, GPUs taken out."""
    ordered = sorted(students, key=lambda r: r.student)
    h = ['<h2 id="flags">Integrity flags</h2><table id="flag-table"><tr><th>student</th><th>exercise / part</th>'
         "<th>rule</th><th>message</th></tr>"]
    rows = len(h)
    for report in ordered:
        for _, result in report.exercises:
            for part in result.parts:
                for flag in part.flags:
                    h.append(f"<tr><td>{_e(report.student)}</td><td>{_e(result.exercise)} / {_e(part.name)}</td>"
                             f"<td><code>{_e(flag['rule'])}</code></td><td><pre>{_e(_first_line(flag['message']))}"
                             "</pre></td></tr>")
                    table.add("flag", result.exercise, part.name, flag["rule"], report.student,
                              detail=_first_line(flag["message"]))
    if len(h) == rows:
        h.append(_NONE_ROW.format(what="no integrity flag was raised"))
    h.append('</table><h2 id="regrade">Grader errors and parts that need a regrade</h2><table id="regrade-table">'
             "<tr><th>student</th><th>exercise</th><th>parts</th><th>error</th></tr>")
    rows = len(h)
    for report in ordered:
        for _, result in report.exercises:
            if result.needs_regrade:
                errors = result.all_grader_errors()
                why = _first_line(errors[0].error if errors else result.message)
                parts = ", ".join(result.regrade_parts())
                h.append(f"<tr><td>{_e(report.student)}</td><td>{_e(result.exercise)}</td><td>{_e(parts)}</td>"
                         f"<td><pre>{_e(why)}</pre></td></tr>")
                table.add("needs_regrade", result.exercise, parts, "", report.student, detail=why)
    if len(h) == rows:
        h.append(_NONE_ROW.format(what="none: the grader failed on no part"))
    h.append("</table>")
    missing = [(r.student, n) for r in ordered for n in names if n not in {s.exercise for s, _ in r.exercises}]
    listed = ": " + _e(", ".join(f"{s}/{n}" for s, n in missing[:50])) if missing else ""
    h.append(f'<h2 id="unfinished">Not graded yet</h2><p id="n-missing">{len(missing)} exercise run(s) have no '
             f"result yet{listed}</p>")
    for student, name in missing:
        table.add("not_graded", name, student=student)
    if gpu_failures:
        h.append('<h2 id="gpu-failures">GPUs taken out of the pool</h2><table><tr><th>when</th><th>GPU</th>'
                 "<th>why</th><th>task moved elsewhere</th></tr>")
        for f in gpu_failures:
            device = f.get("device", {})
            gpu = f"{f.get('slot')} {device.get('name', '')} {device.get('uuid', '')}".strip()
            h.append(f"<tr><td>{_e(f.get('when', ''))}</td><td>{_e(gpu)}</td><td>{_e(f.get('reason', ''))}</td>"
                     f"<td>{_e(f.get('task', ''))}</td></tr>")
            table.add("gpu_failure", item=gpu, detail=f"{f.get('reason', '')} ({f.get('task', '')})")
        h.append("</table>")
    return h
