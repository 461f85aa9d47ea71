"""One exercise run's view of the batch's reference store (:class:`~.references.ReferenceStore`): a case's inputs for
the worker's request, then its reference outputs for the verdict (loaded with the inputs, or computed from them and
stored), with where the run's time with the store went (``grader grade --profile``).
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import torch

from grader.checks.spec import Case, Inputs, Part
from grader.grading.exercise_run.references import Compute, ReferenceStore

# where a run's time with the store went (grader grade --profile); waiting: for a record another run computes now, and
# loading it then
LOADING, COMPUTING, WAITING = ("references: loading stored ones", "references: computing",
                               "references: waiting for another run's")


class CaseReferences:
    """One exercise run's view of the store: :meth:`inputs` for the request, then :meth:`expected` for the
    verdict (loaded with the inputs, or computed from them and stored)."""

    def __init__(self, store: ReferenceStore, exercise: str, *, compute: Compute | None = None):
        self.store, self.exercise, self.compute = store, exercise, compute
        self.computed = self.reused = 0  # this run's, for grader grade --profile
        # seconds spent loading stored records, computing references, waiting for another run's (--profile)
        self.seconds = {LOADING: 0.0, COMPUTING: 0.0, WAITING: 0.0}
        self._loaded: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _key(part: Part, case: Case) -> tuple[str, str]:
        return part.name, json.dumps(case.to_dict(), sort_keys=True, default=str)

    def inputs(self, part: Part, case: Case) -> Inputs:
        start = time.monotonic()
        found = self.store.load(self.exercise, part, case)
        self._spent(LOADING, start)
        inputs, expected = found if found is not None else self.store.draw(self.exercise, part, case)
        if expected is None:  # drawn: no record holds the case yet
            return inputs
        with self._lock:
            self._loaded[self._key(part, case)] = expected
            self.reused += 1
        return inputs

    def expected(self, part: Part, case: Case, inputs: Inputs) -> dict[str, Any]:
        with self._lock:  # kept, not popped: two items may put the same case
            expected = self._loaded.get(self._key(part, case))
        if expected is not None:
            return expected
        start = time.monotonic()
        expected, computed = self.store.reference(self.exercise, part, case, inputs, compute=self.compute)
        self._spent(COMPUTING if computed else WAITING, start)
        with self._lock:
            if computed:
                self.computed += 1
            else:
                self.reused += 1
        return expected

    def _spent(self, what: str, since: float) -> None:
        with self._lock:
            self.seconds[what] += time.monotonic() - since
