"""One submission graded by the grading engine, in a process of its own (started by
:class:`grader.serve.backend.EngineBackend`): ``python -m grader.serve.grade_one JOB.json``. Exits with
``grader grade``'s status."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    from grader.checks import runtime

    runtime.configure()  # before anything imports triton
    from grader.grading.batch.context import UsageError
    from grader.grading.commands import grade
    from grader.serve.backend import options_from_dict

    job = json.loads(Path(argv[0]).read_text())
    options = options_from_dict(job["options"])
    try:
        batch = grade.grade([job["upload"]], out=Path(job["out"]), options=options, title="Your submission")
    except UsageError as exc:
        print(f"grader serve: {exc}", file=sys.stderr)
        return 2
    return grade.exit_status(batch)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
