"""The web pages, as plain HTML text (no scripts: the pages refresh themselves while a grading runs). Everything
shown that a user wrote is escaped here."""

from __future__ import annotations

import datetime as dt
from html import escape

from grader.serve.gradebook import Standing
from grader.serve.leaderboard import Board
from grader.serve.records import DONE, QUEUED, RUNNING, Principal, Student, Submission

_CSS = """body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222}
table{border-collapse:collapse;margin:1rem 0}td,th{border:1px solid #ccc;padding:.3rem .6rem;text-align:left}
.note{background:#fff7d6;border:1px solid #e5c100;padding:.5rem 1rem}.error{color:#a00}.late{color:#a50}
nav a{margin-right:1rem}iframe{width:100%;height:70vh;border:1px solid #ccc}.superseded{color:#777}
tr.mine{background:#e6f3ff;font-weight:bold}"""


def _e(value: object) -> str:
    return escape(str(value), quote=True)


def _when(timestamp: float | None) -> str:
    if timestamp is None:
        return "-"
    return dt.datetime.fromtimestamp(timestamp, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def page(title: str, body: str, *, who: Principal | None = None, refresh_s: int | None = None) -> str:
    nav = ""
    if who is not None:
        home = "/instructor" if who.is_instructor else "/me"
        nav = (f'<nav><a href="{home}">home</a><a href="/leaderboard">leaderboard</a>'
               '<form method="post" action="/logout" style="display:inline"><button id="logout">log out</button>'
               f"</form> <span>{_e(who.student or 'instructor')}</span></nav>")
    meta = f'<meta http-equiv="refresh" content="{refresh_s}">' if refresh_s else ""
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">{meta}<title>{_e(title)}</title>'
            f"<style>{_CSS}</style></head><body>{nav}<h1>{_e(title)}</h1>{body}</body></html>")


def device_note(device: str, on_gpu: bool) -> str:
    if on_gpu:
        return f'<p class="note" id="device-note">Graded on {_e(device)}.</p>'
    return (f'<p class="note" id="device-note">This server grades on the CPU ({_e(device)}): correctness is graded, '
            "speed is not — speed is graded on a GPU only.</p>")


def login(error: str = "") -> str:
    shown = f'<p class="error" id="login-error">{_e(error)}</p>' if error else ""
    return page("Log in", f"""{shown}<form method="post" action="/login">
<label>Your token <input type="password" name="token" id="token" autocomplete="off" size="50"></label>
<button type="submit" id="login">Log in</button></form>
<p>The token came from your instructor. From a terminal: <code>grader submit --server URL --token-file FILE
assignments/</code>.</p>""")


def _status(sub: Submission) -> str:
    text = _state(sub)
    if sub.regrade_of is not None:
        text = f"regrade of #{sub.regrade_of}; {text}"
    if sub.superseded_by is not None:
        text = f"{text} (superseded by #{sub.superseded_by}: its result counts instead)"
    return text


def _state(sub: Submission) -> str:
    if sub.status == QUEUED:
        return f"queued (position {sub.position})" if sub.position else "queued"
    if sub.status == RUNNING:
        return f"grading: {sub.progress}" if sub.progress else "grading"
    if sub.status == DONE and sub.grade is not None:
        return f"graded: {sub.grade.score:.2f} / {sub.grade.max_score:.2f}"
    return f"{sub.status}: {sub.message}" if sub.message else sub.status


def _rows(subs: list[Submission]) -> str:
    if not subs:
        return '<p id="no-submissions">No submissions yet.</p>'
    rows = "".join(
        f'<tr class="submission{" superseded" if s.superseded_by is not None else ""}" data-id="{s.id}" '
        f'data-status="{_e(s.status)}" data-superseded-by="{s.superseded_by or ""}"><td><a href="/submissions/{s.id}">'
        f"#{s.id}</a></td><td>{_e(s.student)}{' (removed)' if s.student_removed else ''}</td>"
        f"<td>{_e(s.filename)}</td><td>{_when(s.created)}</td>"
        f"<td>{_e(', '.join(s.exercises))}</td><td class=\"late\">{_e(', '.join(s.late))}</td>"
        f'<td class="status">{_e(_status(s))}</td><td class="counts">{_e(", ".join(s.counts_for))}</td></tr>'
        for s in subs)
    return ('<table id="submissions"><tr><th>id</th><th>student</th><th>file</th><th>handed in</th><th>exercises</th>'
            f"<th>late</th><th>status</th><th>counts for</th></tr>{rows}</table>")


def student_home(who: Principal, student: Student, subs: list[Submission], *, device_html: str, deadlines: dict,
                 error: str = "", rule: str = "") -> str:
    shown = f'<p class="error" id="upload-error">{_e(error)}</p>' if error else ""
    due = "".join(f"<li>{_e(e)}: {_e(t)}</li>" for e, t in deadlines.items())
    checked = " checked" if student.leaderboard else ""
    body = f"""{device_html}{shown}
<h2>Hand in</h2><form method="post" action="/me/upload" enctype="multipart/form-data">
<input type="file" name="file" id="file" accept=".zip,.ipynb"> <button type="submit" id="upload">Submit</button>
</form><p>A .zip of your <code>assignments/</code> folder, or a notebook (.ipynb).</p>
<p id="counts-rule">{_e(rule)}</p>
{"<h2>Deadlines</h2><ul id='deadlines'>" + due + "</ul>" if due else ""}
<h2>Your submissions</h2>{_rows(subs)}
<h2>Leaderboard</h2><form method="post" action="/me/leaderboard">
<label><input type="checkbox" name="show" value="1" id="show-name"{checked}> show my name on the leaderboard as</label>
<input name="display_name" id="display-name" value="{_e(student.display_name or '')}" maxlength="40">
<button type="submit" id="save-name">Save</button></form>"""
    refresh = 3 if any(s.status in (QUEUED, RUNNING) for s in subs) else None
    return page(f"Submissions of {student.id}", body, who=who, refresh_s=refresh)


def submission(who: Principal, sub: Submission, *, device_html: str, rule: str = "") -> str:
    late = (f'<p class="late" id="late">Handed in after the deadline of: {_e(", ".join(sub.late))}.</p>'
            if sub.late else "")
    grade = ""
    if sub.grade is not None:
        notes = "".join(f'<p class="note">{_e(n)}</p>' for n in sub.grade.notes)
        grade = (f'<p id="score">Score: {sub.grade.score:.2f} / {sub.grade.max_score:.2f}</p>{notes}'
                 f'<p><a href="/submissions/{sub.id}/report.md">report (markdown)</a> · '
                 f'<a href="/submissions/{sub.id}/results.json">results.json</a></p>'
                 f'<iframe id="report" src="/submissions/{sub.id}/report.html" title="report"></iframe>')
    counts = (f"It counts for: {', '.join(sub.counts_for)}." if sub.counts_for
              else "It counts for no exercise now." if sub.status == DONE else "")
    body = (f'{device_html}<p id="status" data-status="{_e(sub.status)}">{_e(_status(sub))}</p>{late}'
            f"<p>Handed in {_when(sub.created)} ({_e(sub.filename)}; exercises {_e(', '.join(sub.exercises))}).</p>"
            f'<p id="counts-rule">{_e(rule)} {_e(counts)}</p>{grade}')
    return page(f"Submission #{sub.id}", body, who=who, refresh_s=3 if sub.status in (QUEUED, RUNNING) else None)


def leaderboard(who: Principal, boards: list[Board], *, on_gpu: bool, device: str) -> str:
    if not on_gpu and not boards:
        body = ('<p class="note" id="no-times">Speed is graded on a GPU only: this server grades on the CPU '
                f"({_e(device)}), so the leaderboard shows no times.</p>")
        return page("Leaderboard", body, who=who)
    if not boards:
        return page("Leaderboard", '<p id="no-times">No times measured yet.</p>', who=who)
    parts = ['<p>Times measured by the grader on its GPU (never self-reported); names shown only where the '
             "student opted in." + (" Your own rows are highlighted, marked (you)." if who.student else "") + "</p>"]
    for board in boards:
        rows = "".join(f'<tr{" class=mine" if e.mine else ""}><td>{e.rank}</td>'
                       f'<td>{_e(e.name)}{" <strong>(you)</strong>" if e.mine else ""}</td>'
                       f"<td>{e.student_ms:.4g}</td><td>{e.ratio:.3f}</td><td>{_e(e.device)}</td><td>{_e(e.date)}</td>"
                       "</tr>" for e in board.entries)
        parts.append(f'<h2>{_e(board.exercise)} / {_e(board.part)}: {_e(board.benchmark)}</h2><table class="board">'
                     "<tr><th>rank</th><th>name</th><th>time (ms)</th><th>speed vs baseline</th><th>GPU</th>"
                     f"<th>date</th></tr>{rows}</table>")
    return page("Leaderboard", "".join(parts), who=who)


def instructor(who: Principal, standings: list[Standing], subs: list[Submission], counts: dict[str, int], *,
               device_html: str, counting: str = "latest") -> str:
    def score(value: float | None, top: float | None) -> str:
        return "-" if value is None else f"{value:.2f} / {top:.2f}"

    rows = "".join(
        f'<tr class="standing" data-student="{_e(s.student)}"><td>{_e(s.student)}</td><td>{_e(s.display_name or "")}'
        f"</td><td>{s.submissions}</td><td>{'#' + str(s.latest_id) if s.latest_id else '-'} {_e(s.latest_status or '')}"
        f"</td><td>{score(s.latest_score, s.latest_max)}</td><td class=\"late\">{_e(', '.join(s.latest_late))}</td>"
        f"<td>{'#' + str(s.best_id) if s.best_id else '-'}</td><td>{score(s.best_score, s.best_max)}</td>"
        f'<td class="counting">{_counting(s.counting)}</td><td class="overrides">{_overrides(s.overrides)}</td></tr>'
        for s in standings)
    queue = ", ".join(f"{n} {status}" for status, n in counts.items())
    body = (f"{device_html}<p id=\"queue\">Queue: {_e(queue)}.</p>"
            f'<p id="counts">Counts in the gradebook: each student\'s {_e(counting)} on-time submission per exercise '
            f'(<code>[serve] counts = "{_e(counting)}"</code>).</p>'
            f'<p><a href="/instructor/class-report" id="class-report">class report</a> ({_e(counting)} on-time '
            'submissions) · <a href="/instructor/grades.csv">grades.csv</a></p>'
            '<table id="standings"><tr><th>student</th><th>name</th><th>submissions</th><th>latest</th>'
            "<th>latest score</th><th>late</th><th>best</th><th>best score</th>"
            f"<th>counts ({_e(counting)})</th><th>overrides</th></tr>{rows}</table>"
            f"<h2>Recent submissions</h2>{_rows(subs)}")
    return page("Instructor", body, who=who, refresh_s=10)


def _counting(found: dict[str, dict]) -> str:
    return "; ".join(f"{_e(e)}: {'-' if c['score'] is None else format(c['score'], '.2f')} (#{c['submission']})"
                     for e, c in sorted(found.items()))


def _overrides(found: dict[str, dict]) -> str:
    return "; ".join(f"{_e(e)}: {o['score']:g} ({_e(o['reason'])})" for e, o in sorted(found.items()))


def error(who: Principal | None, status: int, message: str) -> str:
    back = '<p><a href="/" id="back">Back to your page</a> (where you hand in).</p>'
    return page(f"{status}", f'<p class="error" id="error">{_e(message)}</p>{back}', who=who)
