"""A GPU lock that records how it was taken: for tests of who holds the GPU shared and who holds it alone."""

from __future__ import annotations

from grader.grading.slots import SharedExclusiveLock


class SpyLock(SharedExclusiveLock):
    """Records each acquisition, in order: "shared" or "exclusive"."""

    def __init__(self):
        super().__init__()
        self.modes: list[str] = []

    def shared(self):
        self.modes.append("shared")
        return super().shared()

    def exclusive(self):
        self.modes.append("exclusive")
        return super().exclusive()
