"""The ASGI app: the web pages (a session cookie after logging in with the token) and the JSON API (the token as
``Authorization: Bearer``), over one :class:`Service`.

Authorization is checked on every route through :func:`grader.serve.access.who` (who is asking, with the locks on
the session cookie and on small forms) and :func:`grader.serve.service.visible` (may they see this submission): a
student sees only their own submissions, the instructor sees all; the roster and the class's results are the
instructor's only. A new submission is received by :mod:`grader.serve.upload`.
"""

from __future__ import annotations

import contextlib
import hmac
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from grader.serve import (
    access,
    audit,
    extensions,
    gradebook,
    leaderboard,
    outcome,
    pages,
    queue,
    storage,
    tokens,
)
from grader.serve.grading_threads import Pool
from grader.serve.service import Service, detailed, visible
from grader.serve.upload import submit

REPORT_FILES = {"report.html": "text/html; charset=utf-8", "report.md": "text/markdown; charset=utf-8",
                "results.json": "application/json"}
# A report is the grader's HTML around text a student wrote (escaped): it runs no script and loads nothing.
REPORT_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; frame-ancestors 'self'"


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
    subs = detailed(service, queue.of_student(service.db, student.id))
    error = request.query_params.get("error", "")
    if not hmac.compare_digest(request.query_params.get("sig", ""), access.signature(service, error)):
        error = ""  # words in a link someone else made: not shown
    own = extensions.policy_for(service.db, service.policy, student.id)  # their deadlines, extensions applied
    return HTMLResponse(pages.student_home(who, student, subs, device_html=_device_html(service),
                                           deadlines=own.to_dict()["deadlines"], error=error,
                                           rule=service.policy.counting_rule()))


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
    sub = visible(request, who, int(request.path_params["id"]))
    service: Service = request.app.state.service
    return HTMLResponse(pages.submission(who, sub, device_html=_device_html(service),
                                         rule=service.policy.counting_rule()))


async def submission_json(request: Request) -> Response:
    who = access.who(request)
    return JSONResponse(visible(request, who, int(request.path_params["id"])).to_dict())


async def submissions_json(request: Request) -> Response:
    who = access.who(request)
    service: Service = request.app.state.service
    if who.is_instructor:
        subs = [queue.get(service.db, r["id"]) for r in service.db.query("SELECT id FROM submissions ORDER BY id DESC")]
    else:
        subs = queue.of_student(service.db, who.student or "")
    return JSONResponse({"submissions": [s.to_dict() for s in detailed(service, [s for s in subs if s])],
                         "device": service.device, "speed_graded": service.on_gpu})


async def report_file(request: Request) -> Response:
    who = access.who(request)
    name = request.path_params["name"]
    if name not in REPORT_FILES:
        raise HTTPException(404, "no such report")
    sub = visible(request, who, int(request.path_params["id"]))
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
                                         detailed(service, [s for s in recent if s]),
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

