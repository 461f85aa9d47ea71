"""The students' side of ``grader serve``, over HTTP with the standard library only (the student release has no
web client installed): hand in a folder, a zip or a notebook, and read the results."""

from __future__ import annotations

import io
import json
import os
import secrets
import time
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Left out of an upload, as the grader leaves them out of a submission (grader/grading/batch/skipping.py, which a
# student release does not ship): caches, virtual environments, installed packages, build output, large files.
SKIPPED = {"__pycache__", ".git", ".ipynb_checkpoints", ".hypothesis", ".pytest_cache", ".venv", ".benchmarks",
           "venv", "node_modules", "site-packages", "build", "dist", "__MACOSX"}
MAX_FILE_BYTES = 1 << 20  # a file larger than this that is not Python source is no hand-written kernel
MAX_ZIP_BYTES = 64 << 20  # the server's limit: refused here before anything is sent


class ClientError(RuntimeError):
    """What went wrong, told to the student verbatim (``status``: the HTTP status, 0 when the server was not
    reached)."""

    def __init__(self, message: str, *, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Server:
    url: str
    token: str

    def request(self, method: str, path: str, *, body: bytes | None = None, content_type: str | None = None,
                timeout_s: float = 60.0) -> tuple[int, bytes]:
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        req = urllib.request.Request(self.url.rstrip("/") + path, data=body, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            raise ClientError(_message(exc.read()) or exc.reason, status=exc.code) from None
        except (urllib.error.URLError, OSError) as exc:
            raise ClientError(f"cannot reach {self.url}: {getattr(exc, 'reason', exc)}") from None

    def json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        _, data = self.request(method, path, **kwargs)
        return json.loads(data)


def _message(body: bytes) -> str:
    try:
        return str(json.loads(body).get("error", ""))
    except (ValueError, AttributeError):
        return body.decode(errors="replace")[:300]


def token_from(*, token: str | None, token_file: str | None) -> str:
    if token_file:
        try:
            return Path(token_file).read_text().strip()
        except OSError as exc:
            raise ClientError(f"{token_file}: cannot read the token: {exc.strerror or exc}") from None
    found = token or os.environ.get("GRADER_TOKEN", "")
    if not found:
        raise ClientError("give your token: --token-file FILE (or --token TOKEN, or $GRADER_TOKEN)")
    return found.strip()


def zip_folder(folder: Path) -> bytes:
    """A folder as a zip (regular files only: links and caches are left out, as the grader would)."""
    buffer = io.BytesIO()
    size = 0
    venvs = {p.parent for p in folder.rglob("pyvenv.cfg")}  # a virtual environment of any name
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(folder.rglob("*")):
            rel = path.relative_to(folder)
            if (any(part in SKIPPED or part.endswith(".egg-info") for part in rel.parts) or path.is_symlink()
                    or not path.is_file() or any(v in path.parents for v in venvs)
                    or (path.suffix != ".py" and path.stat().st_size > MAX_FILE_BYTES)):
                continue
            size += path.stat().st_size
            if size > MAX_ZIP_BYTES:
                raise ClientError(f"{folder} holds more than {MAX_ZIP_BYTES >> 20} MB: hand in the assignments only")
            zf.write(path, (Path(folder.name) / rel).as_posix())
    return buffer.getvalue()


def payload(path: Path) -> tuple[str, bytes]:
    """(file name, bytes) to upload for a folder, a .zip or a .ipynb."""
    if path.is_dir():
        return f"{path.resolve().name}.zip", zip_folder(path)
    if path.suffix.lower() in (".zip", ".ipynb") and path.is_file():
        return path.name, path.read_bytes()
    raise ClientError(f"{path}: hand in your assignments/ folder, a .zip of it or a .ipynb notebook")


def multipart(filename: str, data: bytes) -> tuple[bytes, str]:
    boundary = "grader-" + secrets.token_hex(16)
    safe = filename.replace('"', "_").replace("\r", "_").replace("\n", "_")
    head = (f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{safe}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n").encode()
    return head + data + f"\r\n--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def submit(server: Server, path: Path) -> dict[str, Any]:
    filename, data = payload(path)
    body, content_type = multipart(filename, data)
    return server.json("POST", "/api/submissions", body=body, content_type=content_type, timeout_s=300.0)


def status_line(sub: dict[str, Any]) -> str:
    status = sub["status"]
    if status == "queued":
        text = f"queued (position {sub['position']})" if sub.get("position") else "queued"
    elif status == "running":
        text = f"grading ({sub['progress']})" if sub.get("progress") else "grading"
    elif status == "done" and sub.get("grade"):
        text = f"graded: {sub['grade']['score']:.2f} / {sub['grade']['max_score']:.2f}"
    else:
        text = status + (f": {sub['message']}" if sub.get("message") else "")
    late = f" [late: {', '.join(sub['late'])}]" if sub.get("late") else ""
    return f"#{sub['id']} {text}{late}"


def wait(server: Server, submission_id: int, *, poll_s: float = 2.0, timeout_s: float | None = None,
         say=print) -> dict[str, Any]:
    """Poll until the submission is graded or failed; says each change of status."""
    start, last = time.monotonic(), ""
    while True:
        sub = server.json("GET", f"/api/submissions/{submission_id}")
        line = status_line(sub)
        if line != last:
            say(line)
            last = line
        if sub["status"] in ("done", "failed"):
            return sub
        if timeout_s is not None and time.monotonic() - start > timeout_s:
            raise ClientError(f"submission #{submission_id} is still {sub['status']} after {timeout_s:.0f} s "
                              f"(see: grader results {submission_id})")
        time.sleep(poll_s)


def report(server: Server, submission_id: int) -> str:
    _, data = server.request("GET", f"/api/submissions/{submission_id}/report.md")
    return data.decode()
