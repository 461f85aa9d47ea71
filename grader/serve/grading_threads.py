"""Worker threads: each takes the next submission from the queue, grades it through the backend and records the
result. ``workers`` threads grade that many submissions at once (never two of one student)."""

from __future__ import annotations

import contextlib
import sys
import threading
import traceback
from pathlib import Path

from grader.serve import queue, storage
from grader.serve.backend import Backend, GradingFailed, Job
from grader.serve.db import Database

IDLE_POLL_S = 1.0  # an idle worker looks at the queue this often even without a wake-up (another worker finished)


class Pool:
    def __init__(self, db: Database, backend: Backend, *, folder: Path, workers: int = 1) -> None:
        self.db = db
        self.backend = backend
        self.folder = folder
        self.workers = max(1, workers)
        self._wake = threading.Condition()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for i in range(self.workers):
            thread = threading.Thread(target=self._loop, name=f"grader-serve-worker-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def wake(self) -> None:
        """A submission arrived or finished: idle workers look at the queue now."""
        with self._wake:
            self._wake.notify_all()

    def stop(self, *, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self.wake()
        for thread in self._threads:
            thread.join(timeout_s)

    def drain(self) -> int:
        """Grade, in this thread, what may run now until nothing is left (no worker threads; tests and tools);
        returns how many were graded."""
        count = 0
        while (job := queue.claim_next(self.db)) is not None:
            self._grade(job)
            count += 1
        return count

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                job = queue.claim_next(self.db)
            except Exception:  # the database is busy or broken: say so, try again later
                traceback.print_exc(file=sys.stderr)
                job = None
            if job is None:
                with self._wake:
                    self._wake.wait(IDLE_POLL_S)
                continue
            try:
                self._grade(job)
            except Exception:  # recording the outcome failed (the database busy or full): the thread goes on
                traceback.print_exc(file=sys.stderr)
                self._recover(job)
            self.wake()  # that student's next submission may run now

    def _grade(self, submission) -> None:
        job = Job(submission, storage.upload_path(self.folder, submission), storage.submission_dir(self.folder,
                                                                                                   submission.id))
        try:
            grade, times = self._graded(job)
        except GradingFailed as exc:
            status = queue.give_up_or_retry(self.db, submission, str(exc))
            print(f"grader serve: submission {submission.id}: {exc} ({status})", file=sys.stderr)
            return
        except Exception as exc:
            traceback.print_exc(file=sys.stderr)
            queue.give_up_or_retry(self.db, submission, f"the grader failed: {type(exc).__name__}: {exc}")
            return
        queue.finish(self.db, submission, grade, times)

    def _graded(self, job: Job):
        try:
            return self.backend.grade(job)
        finally:
            # the engine writes its reports 0644 (inside folders of 0700, so unreachable): made 0600 all the same
            with contextlib.suppress(OSError):
                storage.tighten(job.folder)

    def _recover(self, submission) -> None:
        """After a failure to record an attempt's outcome: queue it again (or mark it failed after its attempts), so
        that neither it nor the student's later submissions wait for a restart; tried until the database answers."""
        while not self._stop.is_set():
            try:
                queue.give_up_or_retry(self.db, submission, "queued again: its outcome could not be recorded")
                return
            except Exception:
                traceback.print_exc(file=sys.stderr)
                self._stop.wait(IDLE_POLL_S)
