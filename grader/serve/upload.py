"""A student's new submission, received: the web form's upload or the API's. Everything that can refuse it without
its bytes is checked before the body is read (its declared size, the student's limits, the queue's room, one
upload in flight per student); the file then goes to the intake (:mod:`grader.serve.intake`), which checks and
queues it.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from grader.serve import access, audit, intake, queue
from grader.serve.service import Service, visible

UPLOAD_MAX_BODY = intake.MAX_UPLOAD_BYTES + (1 << 20)  # the file's limit plus room for the multipart framing



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
    sub = visible(request, who, accepted.id)
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
