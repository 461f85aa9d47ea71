"""``grader serve``: run the grading server, and manage its roster.

    grader serve --dir SERVE_DIR [--host 127.0.0.1] [--port 8000] [--workers N] [grading options of grader grade]
    grader serve roster add STUDENT [--name DISPLAY] --dir SERVE_DIR     prints the student's token, once
    grader serve roster import roster.csv --dir SERVE_DIR               a token for each new student, once
    grader serve roster list --dir SERVE_DIR
    grader serve instructor-token --dir SERVE_DIR                       a new instructor token, once
    grader serve export --dir SERVE_DIR --out FOLDER                    grades.csv, class report, results.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grader.grading import config
from grader.grading.batch import slurm
from grader.grading.commands import grade as grade_cmd
from grader.serve import policy as policy_mod
from grader.serve import storage, tokens
from grader.serve.db import Database, SchemaError

DEFAULT_DIR = "grader-serve"
CONFIG = "serve.json"  # what the running server grades: read by `grader serve export`


def _add_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", default=argparse.SUPPRESS, metavar="SERVE_DIR",
                        help=f"the server's folder: database, uploads, results (default: {DEFAULT_DIR})")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", default=DEFAULT_DIR, metavar="SERVE_DIR",
                        help=f"the server's folder: database, uploads, results (default: {DEFAULT_DIR})")
    parser.add_argument("--host", default="127.0.0.1",
                        help="the address to listen on (default: 127.0.0.1; put a TLS reverse proxy in front)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=1, metavar="N",
                        help="submissions graded at once (default: 1; each grades its exercises with --jobs)")
    parser.add_argument("--forwarded-allow-ips", default="127.0.0.1", metavar="IPS",
                        help="the reverse proxies whose X-Forwarded-* headers are trusted (default: 127.0.0.1)")
    grade_cmd.add_common(parser)
    slurm.add_arguments(parser)
    actions = parser.add_subparsers(dest="action", metavar="{roster,instructor-token,export}")
    roster = actions.add_parser("roster", help="the students and their tokens")
    roster_actions = roster.add_subparsers(dest="roster_action", required=True)
    add = roster_actions.add_parser("add", help="add a student; prints their token once")
    add.add_argument("student", metavar="STUDENT")
    add.add_argument("--name", default=None, metavar="DISPLAY", help="the name shown if they opt into the leaderboard")
    _add_dir(add)
    imported = roster_actions.add_parser("import", help="add the students of a CSV (a 'student' column, optionally "
                                         "'name'); prints each new student's token once")
    imported.add_argument("csv", metavar="ROSTER.csv")
    _add_dir(imported)
    _add_dir(roster_actions.add_parser("list", help="the students on the roster"))
    _add_dir(actions.add_parser("instructor-token", help="a new instructor token, printed once"))
    export = actions.add_parser("export", help="the class's gradebook (latest on-time results) as grader grade "
                                "writes it: grades.csv, the class report, each student's results.json")
    export.add_argument("--out", required=True, metavar="FOLDER")
    _add_dir(export)


def run(args: argparse.Namespace) -> int:
    folder = Path(args.dir).resolve()
    try:
        db = Database.in_folder(folder)
        if args.action == "roster":
            return _roster(db, args)
        if args.action == "instructor-token":
            print(f"instructor token (shown once; keep it private): {tokens.instructor_token(db)}")
            return 0
        if args.action == "export":
            return _export(db, folder, Path(args.out))
        return _serve(db, folder, args)
    except (SchemaError, tokens.RosterError, policy_mod.PolicyError, config.CourseError, OSError) as exc:
        print(f"grader serve: {exc}", file=sys.stderr)
        return 2


def _roster(db: Database, args: argparse.Namespace) -> int:
    if args.roster_action == "add":
        token = tokens.add_student(db, args.student, display_name=args.name)
        print(f"{tokens.student_id(args.student)}\t{token}")
    elif args.roster_action == "import":
        added = tokens.import_roster(db, Path(args.csv))
        for student, token in added:
            print(f"{student}\t{token}")
        print(f"grader serve: {len(added)} new student(s); their tokens are shown this once", file=sys.stderr)
    else:
        for student in tokens.students(db):
            print(f"{student.id}\t{student.display_name or ''}")
    return 0


def _selected(names: tuple[str, ...]):
    from grader import exercises

    everything = exercises.all_exercises()
    if not names:
        return everything, everything
    by_name = {e.name: e for e in everything}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise config.CourseError(f"unknown exercise(s) {', '.join(unknown)} (known: {', '.join(by_name)})")
    return everything, tuple(by_name[n] for n in names)


def _export(db: Database, folder: Path, out: Path) -> int:
    from grader.serve import gradebook

    saved = json.loads((folder / CONFIG).read_text()) if (folder / CONFIG).is_file() else {}
    everything, selected = _selected(tuple(saved.get("exercises", ())))
    course = config.load_course(saved.get("course"))
    students = gradebook.build(db, folder=folder, out=out.resolve(), course=course, all_exercises=everything,
                               exercises=[e.name for e in selected])
    print(f"grader serve: the latest on-time results of {len(students)} student(s) written to {out}: grades.csv, "
          "class-report.html, students/<id>/results.json (Gradescope)", file=sys.stderr)
    return 0


def _device(options: config.GradeOptions, course: config.Course) -> tuple[str, bool]:
    if options.slurm is not None:
        settings = config.slurm_settings(course, options.slurm)
        where = f"Slurm jobs ({settings.gres or 'no GPU requested'})"
        return where, settings.device == "cuda"
    from grader.checks import runtime

    mode = runtime.configure()
    if mode.is_cuda:
        return f"a GPU ({mode.gpu_name})", True
    return "the CPU via the Triton interpreter", False


def _serve(db: Database, folder: Path, args: argparse.Namespace) -> int:
    import uvicorn

    from grader.serve import queue
    from grader.serve.app import Service, create_app
    from grader.serve.backend import EngineBackend

    options = grade_cmd.options_from_args(args)
    if options.slurm is not None:
        options = options.replace(wait=True)  # a submission's grade is known when its job ends
    everything, selected = _selected(options.exercises)
    policy = policy_mod.load(options.course, known=tuple(e.name for e in everything))
    course_file = options.course
    course = config.load_course(course_file, known=tuple(e.name for e in everything))
    options = options.replace(exercises=tuple(e.name for e in selected))
    secret = options.secret or storage.secret(folder)
    options = options.replace(secret=None)
    storage_config = {"exercises": list(options.exercises), "course": str(course_file) if course_file else None}
    (folder / CONFIG).write_text(json.dumps(storage_config, indent=1) + "\n")
    device, on_gpu = _device(options, course)
    if not tokens.has_instructor(db):
        print(f"grader serve: instructor token (shown once; keep it private): {tokens.instructor_token(db)}")
    requeued = queue.requeue_running(db)
    if requeued:
        print(f"grader serve: {len(requeued)} submission(s) were being graded when the server stopped: queued again "
              f"({', '.join(f'#{i}' for i in requeued)})", file=sys.stderr)
    # every submission is a batch of its own, all with the folder's secret: they share the cases' references
    options = options.replace(references=folder / "references")
    service = Service(db=db, folder=folder, backend=EngineBackend(options=options, secret=secret, course=course),
                      policy=policy, course=course, all_exercises=everything, selected=selected, device=device,
                      on_gpu=on_gpu, salt=secret, workers=args.workers)
    note = "" if on_gpu else " (speed is not graded on a CPU)"
    print(f"grader serve: grading {', '.join(options.exercises)} on {device}{note}; listening on "
          f"http://{args.host}:{args.port}", file=sys.stderr, flush=True)
    uvicorn.run(create_app(service), host=args.host, port=args.port, log_level="warning", proxy_headers=True,
                forwarded_allow_ips=args.forwarded_allow_ips)
    return 0
