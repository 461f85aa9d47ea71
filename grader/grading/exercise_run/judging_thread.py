"""A worker's replies judged in order on a thread of their own, so that judging one (a float64 reference computed,
or awaited from another run of the batch) never keeps the worker waiting for its next request.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

from grader.grading.exercise_run.item_plan import Item
from grader.grading.isolation import protocol

JUDGE_BACKLOG = 64  # replies waiting to be judged, at most: each holds its inputs and outputs in memory


class JudgingThread:
    """Replies judged in order on a thread of their own. A fault of the judging is raised in the supervisor's thread
    (at the next reply, or at :meth:`close`): the exercise needs a regrade, as if it were judged there."""

    def __init__(self, on_reply: Callable[[Item, protocol.Request, protocol.ItemReply], None], name: str):
        self.on_reply = on_reply
        self.seconds = 0.0  # spent judging ("judge (grader)" in the profile)
        self._queue: queue.Queue = queue.Queue(maxsize=JUDGE_BACKLOG)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def put(self, item: Item, request: protocol.Request, reply: protocol.ItemReply, *,
            judge: Callable[[Item, protocol.Request, protocol.ItemReply], None] | None = None) -> None:
        """Judge ``reply`` with ``judge`` (``on_reply`` by default) after the replies given before it."""
        self._raise()
        self._queue.put((judge or self.on_reply, item, request, reply))

    def close(self) -> None:
        """Wait until every reply given so far is judged; raise the first fault of the judging, if any."""
        self._queue.put(None)
        self._thread.join()
        self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _serve(self) -> None:
        while (entry := self._queue.get()) is not None:
            if self._error is not None:
                continue  # the run ends with the fault: the rest is not judged
            start = time.monotonic()
            judge, *reply = entry
            try:
                judge(*reply)
            except BaseException as exc:
                self._error = exc
            self.seconds += time.monotonic() - start
