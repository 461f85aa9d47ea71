"""The ASGI app: the web pages (a session cookie after logging in with the token) and the JSON API (the token as
``Authorization: Bearer``), over one :class:`Service`.

Authorization is checked on every route through :func:`grader.serve.access.who` (who is asking, with the locks on
the session cookie and on small forms) and :func:`_visible` (may they see this submission): a student sees only
their own submissions, the instructor sees all; the roster and the class's results are the instructor's only.
"""

from __future__ import annotations

import contextlib
import hmac
import shutil
import tempfile
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from grader.checks.spec import Exercise
from grader.grading.config import Course
from grader.serve import (
    access,
    audit,
    extensions,
    gradebook,
    intake,
    leaderboard,
    outcome,
    pages,
    queue,
    storage,
    tokens,
)
from grader.serve.backend import Backend
from grader.serve.db import Database
from grader.serve.policy import Policy
from grader.serve.records import RUNNING, Principal, Submission
from grader.serve.worker import Pool

REPORT_FILES = {"report.html": "text/html; charset=utf-8", "report.md": "text/markdown; charset=utf-8",
                "results.json": "application/json"}
# A report is the grader's HTML around text a student wrote (escaped): it runs no script and loads nothing.
REPORT_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; frame-ancestors 'self'"
UPLOAD_MAX_BODY = intake.MAX_UPLOAD_BYTES + (1 << 20)  # the file's limit plus room for the multipart framing


@dataclass
class Service:
    """Everything the routes share."""

    db: Database
    folder: Path
    backend: Backend
    policy: Policy
    course: Course
    all_exercises: tuple[Exercise, ...]
    selected: tuple[Exercise, ...]  # the exercises this server grades
    device: str  # where submissions are graded, in words
    on_gpu: bool
    salt: str  # anonymous leaderboard ids, and the key that signs the messages a redirect carries
    workers: int = 1
    pool: Pool | None = field(default=None, init=False)
    class_lock: threading.Lock = field(default_factory=threading.Lock, init=False)  # one class report build at a time
    uploads_lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    uploading: set[str] = field(default_factory=set, init=False)  # students whose upload is being received now


def _visible(request: Request, who: Principal, submission_id: int) -> Submission:
    """The submission, if ``who`` may see it: 404 if there is none, 403 if it is someone else's."""
    service: Service = request.app.state.service
    sub = queue.get(service.db, submission_id)
    if sub is None:
        raise HTTPException(404, f"no submission #{submission_id}")
    if not who.may_see(sub.student):
        raise HTTPException(403, f"submission #{submission_id} is not yours")
    return _detailed(service, [sub])[0]


def _detailed(service: Service, subs: list[Submission]) -> list[Submission]:
    places = queue.positions(service.db) if any(s.status == queue.QUEUED for s in subs) else {}
    removed = {r["id"] for r in service.db.query("SELECT id FROM students WHERE removed IS NOT NULL")}
    counts_for: dict[int, list[str]] = {}
    if any(s.status == queue.DONE for s in subs):
        for by_exercise in gradebook.counting(service.db, service.policy).values():
            for name, counted in sorted(by_exercise.items()):
                counts_for.setdefault(counted.submission, []).append(name)
    for sub in subs:
        sub.counts_for = counts_for.get(sub.id, [])
        sub.student_removed = sub.student in removed
        sub.position = places.get(sub.id)
        sub.grade = queue.grade_of(service.db, sub.id)
        if sub.status == RUNNING:
            out = storage.submission_dir(service.folder, sub.id) / f"attempt-{sub.attempts}"
            sub.progress = outcome.progress(out, len(sub.exercises))
    return subs


def _device_html(service: Service) -> str:
    return pages.device_note(service.device, service.on_gpu)


# ------------------------------------------------------------------------------------- logging in


async def home(request: Request) -> Response:
    try:
        who = access.who(request)
    except HTTPException:
        return HTMLResponse(pages.login())
    return RedirectResponse("/instructor" if who.is_instructor else "/me", status_code=303)


async def login(request: Request) -> Response:
    access.same_origin(request)
    service: Service = request.app.state.service
    form = await access.small_form(request)
    token = str(form.get("token", ""))
    session = tokens.open_session(service.db, token)
    if session is None:
        audit.record(service.db, audit.ANONYMOUS, "login-failed", "",
                     f"web login from {access.client_address(request)}")
        return HTMLResponse(pages.login("That token is not valid."), status_code=401)
    audit.record(service.db, audit.actor_of(tokens.authenticate(service.db, token)), "login", "",
                 f"web login from {access.client_address(request)}")
    response = RedirectResponse("/", status_code=303)
    response.set_cookie(access.COOKIE, session, max_age=tokens.SESSION_S, httponly=True, samesite="strict",
                        secure=request.url.scheme == "https")
    return response


async def logout(request: Request) -> Response:
    access.same_origin(request)
    session = request.cookies.get(access.COOKIE)
    if session:
        tokens.close_session(request.app.state.service.db, session)
    response = RedirectResponse("/", status_code=303)
    response.delete_cookie(access.COOKIE)
    return response


# ------------------------------------------------------------------------------------- students


async def me(request: Request) -> Response:
    who = access.who(request)
    if who.is_instructor:
        return RedirectResponse("/instructor", status_code=303)
    service: Service = request.app.state.service
    student = next(s for s in tokens.students(service.db) if s.id == who.student)
    subs = _detailed(service, queue.of_student(service.db, student.id))
    error = request.query_params.get("error", "")
    if not hmac.compare_digest(request.query_params.get("sig", ""), access.signature(service, error)):
        error = ""  # words in a link someone else made: not shown
    own = extensions.policy_for(service.db, service.policy, student.id)  # their deadlines, extensions applied
    return HTMLResponse(pages.student_home(who, student, subs, device_html=_device_html(service),
                                           deadlines=own.to_dict()["deadlines"], error=error,
                                           rule=service.policy.counting_rule()))


async def submit(request: Request) -> Response:
    """A new submission: the web form's (redirects to its page) or the API's (201 and JSON). Everything that can
    refuse it without its bytes is checked before the body is read: its declared size, the student's limits, the
    queue's room, and one upload in flight per student."""
    who = access.who(request)
    api = access.is_api(request)
    if who.is_instructor or who.student is None:
        raise HTTPException(403, "only students hand in submissions")
    service: Service = request.app.state.service
    try:
        _check_upload_headers(request)
        await run_in_threadpool(queue.precheck, service.db, who.student, service.policy)
        with _one_upload(service, who.student):
            accepted = await _receive(request, service, who.student)
    except queue.Refused as exc:
        audit.record(service.db, audit.actor_of(who), "submit-refused", who.student, str(exc))
        if not api:
            return RedirectResponse(f"/me?{access.signed(service, str(exc))}", status_code=303)
        headers = {"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s else None
        return JSONResponse({"error": str(exc)}, status_code=exc.status, headers=headers)
    audit.record(service.db, audit.actor_of(who), "submit", who.student,
                 f"#{accepted.id}: {', '.join(accepted.exercises)}" + (f" (late: {', '.join(accepted.late)})"
                                                                        if accepted.late else ""))
    if service.pool is not None:
        service.pool.wake()
    if not api:
        return RedirectResponse(f"/submissions/{accepted.id}", status_code=303)
    sub = _visible(request, who, accepted.id)
    return JSONResponse({**sub.to_dict(), "problems": accepted.problems, "url": f"/submissions/{accepted.id}"},
                        status_code=201)


def _check_upload_headers(request: Request) -> None:
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise queue.Refused("a submission is a multipart/form-data upload (form field 'file')", status=415)
    length = request.headers.get("content-length")
    if length is None or not length.isdigit():
        raise queue.Refused("the upload needs a Content-Length (a whole number of bytes)", status=411)
    if int(length) > UPLOAD_MAX_BODY:
        raise queue.Refused(f"the upload is {int(length) >> 20} MB; the limit is {intake.MAX_UPLOAD_BYTES >> 20} MB",
                            status=413)


@contextlib.contextmanager
def _one_upload(service: Service, student: str) -> Iterator[None]:
    """At most one upload of ``student`` is received at a time: a second is refused before its body is read."""
    with service.uploads_lock:
        if student in service.uploading:
            raise queue.Refused("you have an upload in progress already: wait for it to finish (one at a time)",
                                status=429, retry_after_s=10)
        service.uploading.add(student)
    try:
        yield
    finally:
        with service.uploads_lock:
            service.uploading.discard(student)


async def _receive(request: Request, service: Service, student: str) -> intake.Accepted:
    """Read the multipart body and hand the file to the intake (which checks and queues it)."""
    async with request.form(max_files=1, max_fields=4) as form:
        upload = form.get("file")
        if upload is None or isinstance(upload, str) or not upload.filename:
            raise queue.Refused("no file in the upload (form field 'file')", status=400)
        with tempfile.NamedTemporaryFile(prefix="grader-serve-upload-") as data:
            await run_in_threadpool(shutil.copyfileobj, upload.file, data)
            data.flush()
            return await run_in_threadpool(
                intake.accept, service.db, folder=service.folder, student=student, filename=upload.filename,
                data_file=Path(data.name), size=data.tell(), policy=service.policy, selected=service.selected)


async def set_leaderboard(request: Request) -> Response:
    who = access.who(request)
    if who.student is None:
        raise HTTPException(403, "only students appear on the leaderboard")
    from grader.grading.batch.submission import display_name

    form = await access.small_form(request)
    service: Service = request.app.state.service
    with service.db.transaction() as conn:
        conn.execute("UPDATE students SET leaderboard = ?, display_name = COALESCE(?, display_name) WHERE id = ?",
                     (1 if form.get("show") else 0, display_name(form.get("display_name")), who.student))
    return RedirectResponse("/me", status_code=303)


async def submission_page(request: Request) -> Response:
    who = access.who(request)
    sub = _visible(request, who, int(request.path_params["id"]))
    service: Service = request.app.state.service
    return HTMLResponse(pages.submission(who, sub, device_html=_device_html(service),
                                         rule=service.policy.counting_rule()))


async def submission_json(request: Request) -> Response:
    who = access.who(request)
    return JSONResponse(_visible(request, who, int(request.path_params["id"])).to_dict())


async def submissions_json(request: Request) -> Response:
    who = access.who(request)
    service: Service = request.app.state.service
    if who.is_instructor:
        subs = [queue.get(service.db, r["id"]) for r in service.db.query("SELECT id FROM submissions ORDER BY id DESC")]
    else:
        subs = queue.of_student(service.db, who.student or "")
    return JSONResponse({"submissions": [s.to_dict() for s in _detailed(service, [s for s in subs if s])],
                         "device": service.device, "speed_graded": service.on_gpu})


async def report_file(request: Request) -> Response:
    who = access.who(request)
    name = request.path_params["name"]
    if name not in REPORT_FILES:
        raise HTTPException(404, "no such report")
    sub = _visible(request, who, int(request.path_params["id"]))
    if sub.grade is None or not sub.grade.folder:
        raise HTTPException(409, f"submission #{sub.id} is not graded yet ({sub.status})")
    service: Service = request.app.state.service
    path = outcome.report_dir(storage.submission_dir(service.folder, sub.id) / sub.grade.folder) / name
    if not path.is_file():
        raise HTTPException(404, f"submission #{sub.id} has no {name}")
    return FileResponse(path, media_type=REPORT_FILES[name], headers={"Content-Security-Policy": REPORT_CSP})


async def leaderboard_page(request: Request) -> Response:
    who = access.who(request)
    service: Service = request.app.state.service
    found = leaderboard.boards(service.db, viewer=who, salt=service.salt,
                               exercise=request.query_params.get("exercise"))
    if access.is_api(request):
        return JSONResponse({"speed_graded": service.on_gpu, "device": service.device,
                             "boards": [b.to_dict() for b in found]})
    return HTMLResponse(pages.leaderboard(who, found, on_gpu=service.on_gpu, device=service.device))


# ----------------------------------------------------------------------------------- instructor


async def instructor_page(request: Request) -> Response:
    who = access.who(request, instructor=True)
    service: Service = request.app.state.service
    recent = [queue.get(service.db, r["id"]) for r in service.db.query(
        "SELECT id FROM submissions ORDER BY id DESC LIMIT 50")]
    return HTMLResponse(pages.instructor(who, gradebook.standings(service.db, service.policy),
                                         _detailed(service, [s for s in recent if s]),
                                         queue.counts(service.db), device_html=_device_html(service),
                                         counting=service.policy.counts))


def _class_file(service: Service, name: str) -> bytes:
    """One file of the class report, built afresh (one build at a time: each clears the folder first)."""
    out = service.folder / "class"
    with service.class_lock:
        gradebook.build(service.db, folder=service.folder, out=out, course=service.course,
                        all_exercises=service.all_exercises, exercises=[e.name for e in service.selected],
                        policy=service.policy)
        storage.tighten(out)  # the grader's writers make reports 0644
        return (out / name).read_bytes()


async def class_report(request: Request) -> Response:
    access.who(request, instructor=True)
    audit.record(request.app.state.service.db, "instructor", "export", "class-report.html", "web")
    body = await run_in_threadpool(_class_file, request.app.state.service, "class-report.html")
    return Response(body, media_type="text/html; charset=utf-8", headers={"Content-Security-Policy": REPORT_CSP})


async def grades_csv(request: Request) -> Response:
    access.who(request, instructor=True)
    audit.record(request.app.state.service.db, "instructor", "export", "grades.csv", "web")
    body = await run_in_threadpool(_class_file, request.app.state.service, "grades.csv")
    return Response(body, media_type="text/csv; charset=utf-8")


async def standings_json(request: Request) -> Response:
    access.who(request, instructor=True)
    service: Service = request.app.state.service
    return JSONResponse({"students": [s.to_dict() for s in gradebook.standings(service.db, service.policy)],
                         "queue": queue.counts(service.db), "counts": service.policy.counts})


async def roster(request: Request) -> Response:
    who = access.who(request, instructor=True)
    service: Service = request.app.state.service
    if request.method == "POST":
        if not request.headers.get("content-type", "").startswith("application/json"):
            raise HTTPException(415, "the roster takes JSON (Content-Type: application/json)")
        data = await request.json()
        try:
            token = tokens.add_student(service.db, str(data.get("student", "")), display_name=data.get("name"),
                                       actor=audit.actor_of(who))
        except tokens.RosterError as exc:
            return JSONResponse({"error": str(exc)}, status_code=409)
        return JSONResponse({"student": data["student"], "token": token}, status_code=201)
    return JSONResponse({"students": [s.to_dict() for s in tokens.students(service.db)]})


async def health(request: Request) -> Response:
    return JSONResponse({"ok": True})


async def http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if access.is_api(request):
        return JSONResponse({"error": exc.detail}, status_code=exc.status_code)
    if exc.status_code == 401:
        return HTMLResponse(pages.login(str(exc.detail)), status_code=401)
    return HTMLResponse(pages.error(None, exc.status_code, str(exc.detail)), status_code=exc.status_code)


def create_app(service: Service, *, start_workers: bool = True) -> Starlette:
    """The app; its lifespan runs the worker pool (``start_workers=False``: the caller starts ``service.pool``)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        service.pool = Pool(service.db, service.backend, folder=service.folder, workers=service.workers)
        if start_workers:
            service.pool.start()
        try:
            yield
        finally:
            service.pool.stop()

    routes = [
        Route("/", home), Route("/login", login, methods=["POST"]), Route("/logout", logout, methods=["POST"]),
        Route("/healthz", health),
        Route("/me", me), Route("/me/upload", submit, methods=["POST"]),
        Route("/me/leaderboard", set_leaderboard, methods=["POST"]),
        Route("/submissions/{id:int}", submission_page), Route("/submissions/{id:int}/{name}", report_file),
        Route("/leaderboard", leaderboard_page),
        Route("/api/submissions", submissions_json), Route("/api/submissions", submit, methods=["POST"]),
        Route("/api/submissions/{id:int}", submission_json),
        Route("/api/submissions/{id:int}/{name}", report_file),
        Route("/api/leaderboard", leaderboard_page),
        Route("/instructor", instructor_page), Route("/instructor/class-report", class_report),
        Route("/instructor/grades.csv", grades_csv),
        Route("/api/instructor/students", standings_json),
        Route("/api/instructor/roster", roster, methods=["GET", "POST"]),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error}, lifespan=lifespan)
    app.state.service = service
    return app

