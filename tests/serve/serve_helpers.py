"""What the ``grader serve`` tests share: a real server in a subprocess, an in-process server over a test stand-in
backend, students on the roster, and submissions to hand in."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import uvicorn

from grader import exercises
from grader.grading import config
from grader.serve import db as db_mod
from grader.serve import policy as policy_mod
from grader.serve import tokens
from grader.serve.app import create_app
from grader.serve.backend import Job
from grader.serve.db import Database
from grader.serve.records import Grade, SpeedTime
from grader.serve.service import Service

from .. import sandboxing

REPO = Path(__file__).resolve().parents[2]
GELU = REPO / "solutions" / "gelu" / "gelu.py"
# One exercise, fixed examples only: one grading takes a few seconds on a CPU.
GRADING_ARGS = ["--exercises", "gelu", "--random", "0", "--jobs", "1", *sandboxing.sandbox_args()]
START_TIMEOUT_S = 60.0


def rows(folder: Path, sql: str) -> list[tuple]:
    """What ``sql`` reads from the server's database in ``folder``, on a connection of its own, closed after
    (tests poll with it while the server writes)."""
    with contextlib.closing(sqlite3.connect(folder / db_mod.FILE, timeout=30)) as conn:
        return conn.execute(sql).fetchall()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gelu_zip(path: Path, *, source: str | None = None) -> Path:
    """A submission: a zip of an assignments/ folder holding gelu (the reference solution unless ``source``)."""
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("assignments/gelu/gelu.py", source if source is not None else GELU.read_text())
    return path


def http(url: str, *, token: str | None = None, method: str = "GET", data: bytes | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """(status, body) of one request; HTTP errors are returned, not raised."""
    sent = dict(headers or {})
    if token:
        sent["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=data, method=method, headers=sent)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_healthy(url: str, *, timeout_s: float = START_TIMEOUT_S, process: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the server exited with status {process.returncode}")
        with contextlib.suppress(OSError):
            if http(url + "/healthz")[0] == 200:
                return
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {timeout_s} s")


def browser():
    """A headless Chromium through Selenium and Debian's chromium-driver; a skip with the reason where absent."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.skip("chromium or chromedriver is not installed (apt-get install -y chromium chromium-driver)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(executable_path=driver), options=options)


PAGE_WAIT_S = 20.0  # a page that has not loaded by then never will


def _on_page(browser, read, wait: float):
    """``read(browser)`` once it succeeds and gives something: a click's navigation or a page's refresh may be under
    way, which replaces the elements a read finds (retried, as a reader would wait)."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(browser, wait, poll_frequency=0.2, ignored_exceptions=(WebDriverException,)).until(read)


def element(browser, element_id: str, wait: float = PAGE_WAIT_S):
    """The element with this id, once the page that has it has loaded."""
    from selenium.webdriver.common.by import By

    return _on_page(browser, lambda b: b.find_element(By.ID, element_id), wait)


def text_of(browser, element_id: str, wait: float = PAGE_WAIT_S) -> str:
    """The element's text, read in the same wait that finds it (a found element may be detached by then)."""
    from selenium.webdriver.common.by import By

    return _on_page(browser, lambda b: b.find_element(By.ID, element_id).text, wait)


def attribute_of(browser, element_id: str, name: str, wait: float = PAGE_WAIT_S) -> str:
    """The element's attribute, read in the same wait that finds it."""
    from selenium.webdriver.common.by import By

    return _on_page(browser, lambda b: b.find_element(By.ID, element_id).get_attribute(name), wait)


def grader_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "grader.cli", *args]


@dataclass
class ServerProcess:
    """``grader serve`` in a subprocess of its own (process group: stopping it stops its grading children)."""

    folder: Path
    port: int
    process: subprocess.Popen
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kill(self) -> None:
        """kill -9 of the server alone: its grading children die with it (they ask the kernel to)."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)

    def stop(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(20)


def start_server(folder: Path, *, port: int | None = None, extra: list[str] = ()) -> ServerProcess:
    port = port or free_port()
    log = folder.with_name(folder.name + f"-server-{port}.log")
    with open(log, "ab") as out:
        process = subprocess.Popen(grader_command("serve", "--dir", str(folder), "--port", str(port), *GRADING_ARGS,
                                                  *extra), stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    server = ServerProcess(folder, port, process, log)
    try:
        wait_healthy(server.url, process=process)
    except BaseException:
        server.stop()
        raise RuntimeError(f"grader serve did not start:\n{log.read_text()}") from None
    return server


def add_students(folder: Path, *names: str) -> dict[str, str]:
    db = Database.in_folder(folder)
    found = {name: tokens.add_student(db, name) for name in names}
    db.close()
    return found


# ------------------------------------------------------------------------------ the test stand-in backend


@dataclass
class SleepingStandInBackend:
    """A TEST STAND-IN for the grading engine: sleeps ``seconds``, then returns a made-up full score. It records
    when each grading ran, per student, so that a test can check the queue's order and that no student ever had
    two gradings at once."""

    seconds: float = 0.02
    lock: threading.Lock = field(default_factory=threading.Lock)
    started: list[tuple[str, int]] = field(default_factory=list)  # (student, submission id), in start order
    spans: list[tuple[str, float, float]] = field(default_factory=list)  # (student, start, end)
    running: dict[str, int] = field(default_factory=dict)
    overlaps: list[str] = field(default_factory=list)

    def grade(self, job: Job) -> tuple[Grade, list[SpeedTime]]:
        student = job.submission.student
        with self.lock:
            self.started.append((student, job.submission.id))
            self.running[student] = self.running.get(student, 0) + 1
            if self.running[student] > 1:
                self.overlaps.append(student)
        start = time.monotonic()
        assert job.upload.is_file(), f"the upload of #{job.submission.id} is not where the worker reads it"
        time.sleep(self.seconds)
        with self.lock:
            self.running[student] -= 1
            self.spans.append((student, start, time.monotonic()))
        grade = Grade(score=1.0, max_score=1.0, device="test stand-in", folder=None,
                      exercises={e: {"score": 1.0, "max_score": 1.0, "status": "graded"}
                                 for e in job.submission.exercises})
        return grade, []


@dataclass
class InProcessServer:
    service: Service
    server: uvicorn.Server
    thread: threading.Thread
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextlib.contextmanager
def in_process_server(folder: Path, backend, *, workers: int = 2, policy: policy_mod.Policy | None = None,
                      start_workers: bool = True) -> Iterator[InProcessServer]:
    everything = exercises.all_exercises()
    selected = tuple(e for e in everything if e.name == "gelu")
    service = Service(db=Database.in_folder(folder), folder=folder, backend=backend,
                      policy=policy or policy_mod.Policy(submissions_per_hour=100, queued_per_student=10),
                      course=config.load_course(), all_exercises=everything, selected=selected,
                      device="the CPU (test stand-in)", on_gpu=False, salt="salt", workers=workers)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(service, start_workers=start_workers), host="127.0.0.1",
                                           port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    running = InProcessServer(service, server, thread, port)
    try:
        wait_healthy(running.url, timeout_s=20)
        yield running
    finally:
        server.should_exit = True
        thread.join(20)


def upload(url: str, token: str, path: Path) -> tuple[int, dict]:
    """Hand in ``path`` through the API, as ``grader submit`` does."""
    from grader.handin import client

    body, content_type = client.multipart(path.name, path.read_bytes())
    status, data = http(url + "/api/submissions", token=token, method="POST", data=body,
                        headers={"Content-Type": content_type})
    return status, json.loads(data)


def grades_csv(db, folder: Path, out: Path, rules: policy_mod.Policy) -> dict[str, dict[str, str]]:
    """The gradebook of the server folder ``folder`` built into ``out`` as the instructor's export does, read back
    from its grades.csv: student -> row."""
    import csv

    from grader.serve import gradebook

    gradebook.build(db, folder=folder, out=out, course=config.load_course(), all_exercises=exercises.all_exercises(),
                    exercises=["gelu"], policy=rules)
    with open(out / "grades.csv", newline="") as f:
        return {r["student"]: r for r in csv.DictReader(f)}
