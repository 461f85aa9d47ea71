"""One submission graded by the grading engine, in a process of its own (started by
:class:`grader.serve.backend.EngineBackend`): ``python -m grader.serve.grade_one JOB.json``. Exits with
``grader grade``'s status.

The upload is graded under its student's roster id (its file name): a copy without the manifest (a zip's
``student.toml``, a notebook's ``grader.student_id``) is graded, so that no upload is graded, and its report titled,
as another student's."""

from __future__ import annotations

import json
import shutil
import sys
import zipfile
from pathlib import Path

MANIFEST = "student.toml"


def without_manifest(upload: Path, dest: Path) -> Path:
    """A copy of ``upload`` in folder ``dest``, under the same name, that names no student: a zip's ``student.toml``
    files left out, a notebook's ``grader.student_id`` metadata removed. The engine then takes the student's id from
    the file name (the roster id the server stored it under)."""
    target = dest / upload.name
    if upload.suffix.lower() == ".zip" and zipfile.is_zipfile(upload):
        with zipfile.ZipFile(upload) as source, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as copy:
            for info in source.infolist():
                if info.filename.replace("\\", "/").rsplit("/", 1)[-1] == MANIFEST:
                    continue
                with source.open(info) as data, copy.open(info, "w") as out:
                    shutil.copyfileobj(data, out)
        return target
    if upload.suffix.lower() == ".ipynb":
        try:
            notebook = json.loads(upload.read_text())
            notebook.get("metadata", {}).get("grader", {}).pop("student_id", None)
            target.write_text(json.dumps(notebook))
            return target
        except (ValueError, AttributeError, OSError):
            pass  # not a notebook the engine can read either: it says so
    shutil.copyfile(upload, target)
    return target


def main(argv: list[str]) -> int:
    from grader.checks import runtime

    runtime.configure()  # before anything imports triton
    from grader.grading.batch.context import UsageError
    from grader.grading.commands import grade
    from grader.serve.backend import options_from_dict

    job = json.loads(Path(argv[0]).read_text())
    options = options_from_dict(job["options"])
    out = Path(job["out"])
    # the same path every run of this attempt (a run after a grader failure resumes the same batch)
    scratch = out.parent / f"{out.name}-upload"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    try:
        upload = without_manifest(Path(job["upload"]), scratch)
        batch = grade.grade([str(upload)], out=out, options=options, title="Your submission")
    except UsageError as exc:
        print(f"grader serve: {exc}", file=sys.stderr)
        return 2
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return grade.exit_status(batch)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
