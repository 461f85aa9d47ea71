"""``grader serve``: run the grading server, and manage its roster.

    grader serve --dir SERVE_DIR [--host 127.0.0.1] [--port 8000] [--workers N] [grading options of grader grade]
    grader serve roster add STUDENT [--name DISPLAY] --dir SERVE_DIR     prints the student's token, once
    grader serve roster import roster.csv --dir SERVE_DIR               a token for each new student, once
    grader serve roster list [--removed] --dir SERVE_DIR
    grader serve roster reissue STUDENT --dir SERVE_DIR                 a new token, once; the old one stops working
    grader serve roster revoke STUDENT --dir SERVE_DIR                  their token stops working; no new one
    grader serve roster remove STUDENT --dir SERVE_DIR                  a dropped student: history kept, not graded
    grader serve instructor-token [--rotate] --dir SERVE_DIR            a new instructor token, once (--rotate: the
                                                                        earlier ones stop working)
    grader serve export --dir SERVE_DIR --out FOLDER                    grades.csv, class report, results.json
    grader serve log --dir SERVE_DIR [--limit N] [--action A] [--json]   the audit log (append-only)
    grader serve override STUDENT EXERCISE SCORE|clear --reason TEXT --dir SERVE_DIR   shown in the gradebook
    grader serve extend STUDENT EXERCISE UNTIL --reason TEXT --dir SERVE_DIR [--course FILE]   their own deadline
    grader serve backup --dir SERVE_DIR --out FOLDER                    a consistent copy, the server running or not
    grader serve restore --from BACKUP --dir SERVE_DIR                  into a new or empty folder, the server stopped
    grader serve regrade (--all | --student S... | --exercise E... | --submission ID...) --reason TEXT --dir SERVE_DIR
                                                    grade stored submissions again (after a grader fix); the earlier
                                                    results are kept as history, the new ones count once graded
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grader.grading import config
from grader.grading.batch import slurm
from grader.grading.commands import grade as grade_cmd
from grader.serve import audit, overrides, storage, tokens
from grader.serve import backup as backup_mod
from grader.serve import extensions as extensions_mod
from grader.serve import policy as policy_mod
from grader.serve import regrade as regrade_mod
from grader.serve.db import Database, SchemaError

DEFAULT_DIR = "grader-serve"
# the errors told to the instructor as they are, without a traceback
_TOLD = (SchemaError, tokens.RosterError, backup_mod.BackupError, overrides.OverrideError,
         extensions_mod.ExtensionError, policy_mod.PolicyError, config.CourseError, regrade_mod.RegradeError, OSError)
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
    actions = parser.add_subparsers(dest="action", metavar="{roster,instructor-token,export,log,override,extend,"
                                    "regrade,backup,restore}")
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
    listed = roster_actions.add_parser("list", help="the students on the roster")
    listed.add_argument("--removed", action="store_true", help="also those removed from it (marked 'removed')")
    _add_dir(listed)
    for name, what in (("reissue", "a new token for STUDENT, printed once; their old token stops working at once"),
                       ("revoke", "STUDENT's token stops working at once; no new one (reissue gives one)"),
                       ("remove", "drop STUDENT: token revoked, submissions kept as history (marked removed), "
                                  "out of the gradebook and the leaderboard, queued ones not graded")):
        action = roster_actions.add_parser(name, help=what)
        action.add_argument("student", metavar="STUDENT")
        _add_dir(action)
    instructor = actions.add_parser("instructor-token", help="a new instructor token, printed once")
    instructor.add_argument("--rotate", action="store_true", help="revoke every earlier instructor token (and its "
                            "web sessions) at once")
    _add_dir(instructor)
    export = actions.add_parser("export", help="the class's gradebook (the latest on-time results, or the best: "
                                "[serve] counts) as grader grade "
                                "writes it: grades.csv, the class report, each student's results.json")
    export.add_argument("--out", required=True, metavar="FOLDER")
    _add_dir(export)
    log = actions.add_parser("log", help="the audit log: logins, failed logins, submissions, token changes, exports")
    log.add_argument("--limit", type=int, default=None, metavar="N", help="the last N entries only")
    log.add_argument("--action", dest="only_action", default=None, metavar="ACTION",
                     help="entries of this action only (e.g. login-failed, submit, token-reissue, export)")
    log.add_argument("--json", action="store_true", help="one JSON object a line")
    _add_dir(log)
    override = actions.add_parser("override", help="set STUDENT's score on EXERCISE by hand, with a reason (shown "
                                  "in the gradebook and grades.csv); SCORE 'clear' removes the override")
    override.add_argument("student", metavar="STUDENT")
    override.add_argument("exercise", metavar="EXERCISE")
    override.add_argument("score", metavar="SCORE")
    override.add_argument("--reason", required=True, metavar="TEXT")
    _add_dir(override)
    extend = actions.add_parser("extend", help="move EXERCISE's deadline for STUDENT to UNTIL (e.g. 2025-10-17T23:59 "
                                "or 2025-10-17: the end of that day), with a reason")
    extend.add_argument("student", metavar="STUDENT")
    extend.add_argument("exercise", metavar="EXERCISE")
    extend.add_argument("until", metavar="UNTIL")
    extend.add_argument("--reason", required=True, metavar="TEXT")
    extend.add_argument("--course", type=Path, default=None, metavar="FILE",
                        help="the course file the server runs with (its [serve.deadlines]); default: the one saved "
                        "by the last start")
    _add_dir(extend)
    regrade = actions.add_parser("regrade", help="grade stored submissions again (after a fix of the grader), by the "
                                 "running server or at its next start: the earlier results stay as history "
                                 "(superseded), the new ones count once graded")
    regrade.add_argument("--all", dest="everything", action="store_true", help="every current submission")
    regrade.add_argument("--student", dest="students", action="append", default=[], metavar="S",
                         help="the submissions of student S (repeatable)")
    regrade.add_argument("--exercise", dest="regrade_exercises", action="append", default=[], metavar="E",
                         help="the submissions holding exercise E (repeatable)")
    regrade.add_argument("--submission", dest="submission_ids", action="append", default=[], type=int,
                         metavar="ID", help="submission ID (repeatable)")
    regrade.add_argument("--reason", required=True, metavar="TEXT", help="why (kept in the audit log)")
    _add_dir(regrade)
    saved = actions.add_parser("backup", help="a consistent copy of the database (SQLite's online backup) and of "
                               "the uploads and reports, while the server runs or not")
    saved.add_argument("--out", required=True, metavar="FOLDER", help="a new or empty folder")
    _add_dir(saved)
    restored = actions.add_parser("restore", help="make SERVE_DIR (new or empty) a copy of a backup; then start "
                                  "grader serve on it")
    restored.add_argument("--from", dest="source", required=True, metavar="BACKUP")
    _add_dir(restored)


def run(args: argparse.Namespace) -> int:
    folder = Path(args.dir).resolve()
    try:
        with storage.private_umask():
            return _run(folder, args)
    except _TOLD as exc:
        print(f"grader serve: {exc}", file=sys.stderr)
        return 2


def _private(folder: Path) -> None:
    """The serve folder is the owner's only; one made by an earlier version is tightened, with a note."""
    if folder.exists():
        changed = storage.tighten(folder)
        if changed:
            print(f"grader serve: {len(changed)} path(s) in {folder} were readable by others: now the owner's only "
                  "(folders 0700, files 0600)", file=sys.stderr)
    storage.make_private_dir(folder)


def _run(folder: Path, args: argparse.Namespace) -> int:
    if args.action == "restore":  # before anything opens (and so creates) a database in the folder
        manifest = backup_mod.restore(Path(args.source).resolve(), folder)
        print(f"grader serve: {folder} restored from {args.source} ({manifest.get('submissions')} submission(s)); "
              "start grader serve on it", file=sys.stderr)
        return 0
    _private(folder)
    db = Database.in_folder(folder)
    if args.action == "roster":
        return _roster(db, args)
    if args.action == "instructor-token":
        token = tokens.rotate_instructor(db) if args.rotate else tokens.instructor_token(db)
        note = "; every earlier one is revoked" if args.rotate else ""
        print(f"instructor token (shown once; keep it private{note}): {token}")
        return 0
    if args.action == "export":
        return _export(db, folder, Path(args.out))
    if args.action == "log":
        return _log(db, args)
    if args.action == "extend":
        return _extend(db, folder, args)
    if args.action == "override":
        return _override(db, args)
    if args.action == "regrade":
        return _regrade(db, folder, args)
    if args.action == "backup":
        manifest = backup_mod.backup(db, folder, Path(args.out).resolve())
        print(f"grader serve: backup of {manifest['students']} student(s) and {manifest['submissions']} "
              f"submission(s) written to {args.out}", file=sys.stderr)
        return 0
    return _serve(db, folder, args)


def _extend(db: Database, folder: Path, args: argparse.Namespace) -> int:
    from grader import exercises

    saved = json.loads((folder / CONFIG).read_text()) if (folder / CONFIG).is_file() else {}
    course = args.course or (Path(saved["course"]) if saved.get("course") else None)
    policy = policy_mod.load(course, known=tuple(e.name for e in exercises.all_exercises()))
    until = extensions_mod.parse_until(args.until)
    extensions_mod.grant(db, args.student, args.exercise, until, args.reason, policy=policy)
    print(f"grader serve: {args.student}'s deadline for {args.exercise} is now {args.until}", file=sys.stderr)
    return 0


def _override(db: Database, args: argparse.Namespace) -> int:
    from grader import exercises

    if args.score == "clear":
        score = None
    else:
        try:
            score = float(args.score)
        except ValueError:
            raise overrides.OverrideError(f"SCORE is a number of points or 'clear', not {args.score!r}") from None
    known = tuple(e.name for e in exercises.all_exercises())
    overrides.set_override(db, args.student, args.exercise, score, args.reason, known=known)
    what = "cleared" if score is None else f"set to {score:g}"
    print(f"grader serve: {args.student}'s {args.exercise} override {what}; the gradebook shows it with its reason",
          file=sys.stderr)
    return 0


def _regrade(db: Database, folder: Path, args: argparse.Namespace) -> int:
    chosen = regrade_mod.select(db, everything=args.everything, students=tuple(args.students),
                                exercises=tuple(args.regrade_exercises), submissions=tuple(args.submission_ids))
    done = regrade_mod.queue_regrades(db, folder, chosen, args.reason)
    for earlier, why in sorted(done.skipped.items()):
        print(f"grader serve: #{earlier} not regraded: {why}", file=sys.stderr)
    for earlier, new in sorted(done.regrades.items()):
        print(f"#{earlier}\t#{new}")
    print(f"grader serve: {len(done.regrades)} submission(s) queued to be graded again (after the uploads waiting), "
          "by the running server or at its next start; their earlier results count until then", file=sys.stderr)
    return 0


def _log(db: Database, args: argparse.Namespace) -> int:
    for entry in audit.entries(db, limit=args.limit, action=args.only_action):
        print(json.dumps(entry.to_dict()) if args.json else entry.line())
    return 0


def _roster(db: Database, args: argparse.Namespace) -> int:
    if args.roster_action == "add":
        token = tokens.add_student(db, args.student, display_name=args.name)
        print(f"{tokens.student_id(args.student)}\t{token}")
    elif args.roster_action == "import":
        added = tokens.import_roster(db, Path(args.csv))
        for student, token in added:
            print(f"{student}\t{token}")
        print(f"grader serve: {len(added)} new student(s); their tokens are shown this once", file=sys.stderr)
    elif args.roster_action == "reissue":
        print(f"{tokens.student_id(args.student)}\t{tokens.reissue(db, args.student)}")
        print("grader serve: their new token is shown this once; the old one no longer works", file=sys.stderr)
    elif args.roster_action == "revoke":
        count = tokens.revoke(db, args.student)
        print(f"grader serve: {count} token(s) of {args.student} revoked; `roster reissue` gives them a new one",
              file=sys.stderr)
    elif args.roster_action == "remove":
        cancelled = tokens.remove_student(db, args.student)
        print(f"grader serve: {args.student} removed from the roster (token revoked, submissions kept as history, "
              f"out of the gradebook); {cancelled} queued submission(s) will not be graded", file=sys.stderr)
    else:
        for student in tokens.students(db, removed=args.removed):
            print(f"{student.id}\t{student.display_name or ''}" + ("\tremoved" if student.removed else ""))
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
    policy = policy_mod.load(Path(saved["course"]) if saved.get("course") else None,
                             known=tuple(e.name for e in everything))
    students = gradebook.build(db, folder=folder, out=out.resolve(), course=course, all_exercises=everything,
                               exercises=[e.name for e in selected], policy=policy)
    audit.record(db, audit.CLI, "export", str(out.resolve()), f"{len(students)} student(s)")
    print(f"grader serve: the {policy.counts} on-time results of {len(students)} student(s) written to {out}: "
          "grades.csv, class-report.html, students/<id>/results.json (Gradescope)", file=sys.stderr)
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


def public_seed_warning(course: config.Course) -> str | None:
    """What ``grader grade`` warns of too: with the public default cases_seed, the hidden cases are not hidden."""
    if course.cases_seed != config.DEFAULT_CASES_SEED:
        return None
    return ("grader serve: warning: the course file's cases_seed is the public default, so anyone with this "
            "repository can draw the hidden cases: set a private one in your course file (--course)")


def _serve(db: Database, folder: Path, args: argparse.Namespace) -> int:
    import uvicorn

    from grader.serve import queue
    from grader.serve.app import create_app
    from grader.serve.backend import EngineBackend
    from grader.serve.service import Service

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
    warning = public_seed_warning(course)
    if warning:
        print(warning, file=sys.stderr)
    device, on_gpu = _device(options, course)
    if not tokens.has_instructor(db):
        print(f"grader serve: instructor token (shown once; keep it private): {tokens.instructor_token(db)}")
    requeued = queue.requeue_running(db)
    if requeued:
        print(f"grader serve: {len(requeued)} submission(s) were being graded when the server stopped: queued again "
              f"({', '.join(f'#{i}' for i in requeued)})", file=sys.stderr)
    # every submission is a batch of its own, all with the folder's secret: they share the cases' references, and
    # the reference solutions' recorded plans (the yardstick), recorded once per GPU for the term
    options = options.replace(references=folder / "references", yardstick_cache=folder / "yardstick")
    service = Service(db=db, folder=folder, backend=EngineBackend(options=options, secret=secret, course=course),
                      policy=policy, course=course, all_exercises=everything, selected=selected, device=device,
                      on_gpu=on_gpu, salt=secret, workers=args.workers)
    note = "" if on_gpu else " (speed is not graded on a CPU)"
    print(f"grader serve: grading {', '.join(options.exercises)} on {device}{note}; listening on "
          f"http://{args.host}:{args.port}", file=sys.stderr, flush=True)
    uvicorn.run(create_app(service), host=args.host, port=args.port, log_level="warning", proxy_headers=True,
                forwarded_allow_ips=args.forwarded_allow_ips)
    return 0
