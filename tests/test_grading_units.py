"""Units of the instructor grader that need no worker: submissions (directories, zips, notebooks), the
course file and scoring, and the report formats (the HTML one rendered in headless Chromium)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import zipfile
from pathlib import Path

import nbformat
import pytest

from grader import exercises
from grader.checks import loader
from grader.grading import config
from grader.grading.batch import submission
from grader.grading.exercise_run import plan, runner
from grader.grading.results import reports, scoring, terminal
from grader.grading.results.results import CheckResult, ExerciseResult, PartResult, SpeedResult
from grader.speed import roofline
from grader.speed.credit import BenchmarkCredit

ALL = exercises.all_exercises()
GELU = exercises.get("gelu")


# ------------------------------------------------------------------------------------- submissions


def _tree(root: Path, body: str = "def gelu(x):\n    return x\n") -> Path:
    (root / "gelu").mkdir(parents=True)
    (root / "gelu" / "gelu.py").write_text(body)
    return root


def test_directory_submission_is_copied_and_its_id_is_the_folder_name(tmp_path):
    src = _tree(tmp_path / "alice smith")
    (src / "gelu" / "__pycache__").mkdir()
    (src / "gelu" / "__pycache__" / "junk.pyc").write_bytes(b"x")
    (src / "link.py").symlink_to("/etc/passwd")
    sub = submission.prepare(src, tmp_path / "work", ALL)
    assert sub.student == "alice_smith" and sub.kind == "directory"
    assert sub.root is not None and (sub.root / "gelu" / "gelu.py").read_text().startswith("def gelu")
    assert not sub.root.is_relative_to(src)
    assert not (sub.root / "gelu" / "__pycache__").exists() and not (sub.root / "link.py").exists()
    assert any("symbolic links are not graded" in p for p in sub.problems)


def test_nested_assignments_folder_and_manifest(tmp_path):
    src = tmp_path / "upload"
    _tree(src / "assignments")
    (src / "assignments" / "student.toml").write_text('student_id = "bob@example.com"\n')
    sub = submission.prepare(src, tmp_path / "work", ALL)
    assert sub.root == tmp_path / "work" / "files" / "assignments"
    assert sub.student == "bob_example.com"


def test_zip_slip_and_links_are_skipped(tmp_path):
    path = tmp_path / "carol.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("carol/gelu/gelu.py", "def gelu(x):\n    return x\n")
        zf.writestr("../../evil.py", "print('escaped')")
        info = zipfile.ZipInfo("carol/link")
        info.external_attr = 0o120777 << 16
        zf.writestr(info, "/etc/passwd")
    sub = submission.prepare(path, tmp_path / "work", ALL)
    assert sub.student == "carol" and sub.root is not None and (sub.root / "gelu" / "gelu.py").is_file()
    assert not (tmp_path / "evil.py").exists() and not (tmp_path / "work" / "evil.py").exists()
    assert any("outside the archive" in p for p in sub.problems)
    assert any("symbolic links" in p for p in sub.problems)


def test_folder_without_exercises_reports_what_it_expected(tmp_path):
    (tmp_path / "dave" / "a").mkdir(parents=True)
    (tmp_path / "dave" / "b").mkdir()
    sub = submission.prepare(tmp_path / "dave", tmp_path / "work", ALL)
    assert sub.usable
    assert any("no exercise module found (expected files like gelu/gelu.py" in p for p in sub.problems)


def test_notebook_cells_become_modules(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("import this_is_not_graded"),
        nbformat.v4.new_code_cell("# %% exercise: gelu\nimport torch\n%matplotlib inline\n"
                                  "def gelu(x):\n    return x"),
        nbformat.v4.new_markdown_cell("# %% exercise: softmax\n(markdown: ignored)"),
        nbformat.v4.new_code_cell("\n# %% exercise: gelu\nHELPER = 1"),
        nbformat.v4.new_code_cell("# %% exercise: nonsense\npass"),
    ], metadata={"grader": {"student_id": "erin"}})
    path = tmp_path / "whatever.ipynb"
    nbformat.write(nb, str(path))
    sub = submission.prepare(path, tmp_path / "work", ALL)
    assert sub.student == "erin" and sub.kind == "notebook"
    module = (sub.root / "gelu" / "gelu.py").read_text()
    assert "def gelu(x)" in module and "HELPER = 1" in module and "this_is_not_graded" not in module
    assert "# [ipython magic, not graded] %matplotlib inline" in module
    compile(module, "gelu.py", "exec")
    assert not (sub.root / "softmax").exists()
    assert any("unknown exercise 'nonsense'" in p for p in sub.problems)


def test_notebook_without_marked_cells_says_how_to_mark_them(tmp_path):
    path = tmp_path / "empty.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("def gelu(x): pass")]), str(path))
    sub = submission.prepare(path, tmp_path / "work", ALL)
    assert any("no code cell starting with '# %% exercise: <name>'" in p for p in sub.problems)


@pytest.mark.parametrize("text, message", [
    ("{ not json", "is not valid: it is not JSON"),
    ('{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5, "extra": 1}', "is not valid: Additional"),
    ('{"nbformat": 4, "nbformat_minor": 5, "metadata": {}}', "is not valid: The notebook is invalid and is missing "
                                                           "an expected key: cells"),
])
def test_malformed_notebooks_are_explained(tmp_path, text, message):
    path = tmp_path / "bad.ipynb"
    path.write_text(text)
    sub = submission.prepare(path, tmp_path / "work", ALL)
    assert not sub.usable
    assert any(p.startswith("notebook bad.ipynb") and message in p for p in sub.problems), sub.problems


def test_a_syntax_error_in_a_notebook_names_the_cell_and_its_own_line(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("intro"),
        nbformat.v4.new_code_cell("# %% exercise: gelu\nimport torch\n\ndef helper(x):\n    return x\n"),
        nbformat.v4.new_code_cell("print('not graded')"),
        nbformat.v4.new_code_cell("# %% exercise: gelu\ndef gelu(x):\n    return helper(x\n"),
    ])
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, str(path))
    sub = submission.prepare(path, tmp_path / "work", ALL)
    with pytest.raises(loader.LoadError) as raised:
        loader.load(sub.root, GELU, ("gelu",))
    message = str(raised.value)
    assert raised.value.kind == "syntax"
    assert message.startswith("notebook cell 4 has a syntax error at line 3 of that cell:"), message
    assert "gelu.py" not in message  # a file the student never wrote


def test_a_syntax_error_in_a_file_names_its_line(tmp_path):
    _tree(tmp_path / "t", "import torch\n\ndef gelu(x):\n    return (x\n")
    with pytest.raises(loader.LoadError, match=r"^gelu.py has a syntax error at line 4: '\(' was never closed"):
        loader.load(tmp_path / "t", GELU, ("gelu",))


def test_a_declared_source_encoding_is_honoured(tmp_path):
    root = tmp_path / "latin"
    (root / "gelu").mkdir(parents=True)
    (root / "gelu" / "gelu.py").write_bytes(b"# -*- coding: latin-1 -*-\nNAME = 'caf\xe9'\n\ndef gelu(x):\n"
                                            b"    return x\n")
    module = loader.load(root, GELU, ("gelu",))
    assert module.NAME == "café"
    bare = tmp_path / "bare"
    (bare / "gelu").mkdir(parents=True)
    (bare / "gelu" / "gelu.py").write_bytes(b"NAME = 'caf\xe9'\n\ndef gelu(x):\n    return x\n")
    with pytest.raises(loader.LoadError, match=r"gelu.py cannot be read as text .*save it as UTF-8, or declare its "
                                                r"encoding .*PEP 263"):
        loader.load(bare, GELU, ("gelu",))


@pytest.mark.parametrize("name, expected", [
    ("alice smith", "alice_smith"), ("..", "student"), (".", "student"), ("", "student"), ("...", "student"),
    ("../../etc", "etc"), ("grades.csv", "grades.csv"), (".hidden", "hidden"), ("a" * 300, "a" * 64),
    ("x" * 63 + "._y", "x" * 63),
])
def test_student_ids_are_plain_folder_names(name, expected):
    assert submission.sanitize(name) == expected


def test_a_submission_that_is_a_symbolic_link_is_refused_by_name(tmp_path):
    real = _tree(tmp_path / "real")
    (tmp_path / "linky").symlink_to(real, target_is_directory=True)
    sub = submission.prepare(tmp_path / "linky", tmp_path / "work", ALL)
    assert not sub.usable and sub.student == "linky"
    assert sub.problems == [f"linky is a symbolic link (to {real}): links are not graded; hand in the files "
                            "themselves"]
    assert not any((tmp_path / "work").rglob("*.py"))  # nothing was copied from where it points


def test_not_a_submission_is_a_usage_error(tmp_path):
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(submission.SubmissionError, match=r"not a directory, \.zip or \.ipynb"):
        submission.prepare(tmp_path / "notes.txt", tmp_path / "work", ALL)


# ------------------------------------------------------------------------------------------ scoring


def _result(status="graded", passed=(True, True, True, True), flags=(), integrity_ok=True, speed=None):
    part = PartResult("forward", status)
    part.checks = [CheckResult(f"c{i}", "example", f"case {i}", "passed" if ok else "failed",
                               "" if ok else f"wrong on case {i}", size=10 * (i + 1)) for i, ok in enumerate(passed)]
    part.checks.append(CheckResult("i0", "integrity", "case", "passed" if integrity_ok else "failed",
                                   "" if integrity_ok else "raised"))
    part.flags = [dict(f) for f in flags]
    part.speed = speed or SpeedResult("not measured", "not measured: no GPU")
    return ExerciseResult("gelu", "Fused GeLU", "graded", parts=[part])


def _course(**changes) -> config.Course:
    course = config.load_course()
    values = {"name": course.name, "total": course.total, "weights": course.weights, "correctness": course.correctness,
              "grading": course.grading, "source": course.source}
    return config.Course(**{**values, **changes})


def test_course_file_loads_and_scales_to_the_total():
    course = config.load_course(known=tuple(e.name for e in ALL))
    assert course.total > 0 and course.correctness in config.CORRECTNESS_MODES
    full = sum(course.factor(e, ALL) * e.max_points for e in ALL)
    assert full == pytest.approx(course.total)


def test_every_default_is_in_the_course_file():
    course = config.load_course()
    for key in config.PER_DEVICE:
        for device in config.DEVICES:
            assert course.setting(key, device) > 0 or key == "random_cases" or (key, device) == ("jobs", "cuda")
    assert course.setting("jobs", "cuda") == 0  # chosen per GPU (gpus.auto_jobs)
    settings = config.resolve(config.GradeOptions(), course, device="cpu", secret="s", workdir=Path("/w"))
    assert settings.random_cases == course.setting("random_cases", "cpu")
    assert settings.timeout_s == course.setting("timeout_s", "cpu")
    override = config.resolve(config.GradeOptions(random_cases=0, timeout_s=7.0), course, device="cuda", secret="s",
                              workdir=Path("/w"))
    assert (override.random_cases, override.timeout_s, override.call_timeout_s) == (0, 7.0, 7.0)


def test_jobs_on_a_gpu_follow_its_memory_and_the_hosts_cores():
    from grader.grading.batch import gpus

    h100 = gpus.Gpu(0, "NVIDIA H100 80GB HBM3", "u", "0", 80 << 30)
    assert gpus.auto_jobs(h100, gpus=1, cores=16) == 8  # 16 cores: 2 per run
    assert gpus.auto_jobs(h100, gpus=8, cores=128) == 8  # capped
    assert gpus.auto_jobs(h100, gpus=1, cores=6) == 3
    assert gpus.auto_jobs(gpus.Gpu(0, "small", "u", "0", 24 << 30), gpus=1, cores=64) == 2  # 10 GiB a run
    assert gpus.auto_jobs(gpus.Gpu(0, "tiny", "u", "0", 4 << 30), gpus=1, cores=1) == 1
    slots = gpus.gpu_slots(None, 0, available=[h100], current=0)
    assert slots[0].capacity == gpus.auto_jobs(h100, gpus=1)
    assert gpus.gpu_slots(None, 3, available=[h100], current=0)[0].capacity == 3  # --jobs wins


def test_an_instructors_course_file_is_laid_over_the_defaults(tmp_path):
    path = tmp_path / "course.toml"
    path.write_text("[weights]\ngelu = 2.0\n[grading]\nrandom_cases_cuda = 7\n")
    course = config.load_course(path)
    assert course.weight("gelu") == 2.0 and course.weight("softmax") == 1.0
    assert course.setting("random_cases", "cuda") == 7 and course.setting("random_cases", "cpu") == 5
    assert course.fingerprint() != config.load_course().fingerprint()


@pytest.mark.parametrize("text, message", [
    ("[course]\ntotal = 0\n", "total must be positive"),
    ("[grading]\ncorrectness = 'most'\n", "correctness must be one of"),
    ("[weights]\ngelu = -1\n", "must not be negative"),
    ("[course\n", "is not valid TOML"),
    ("[grading]\nrandom_case = 3\n", "unknown key\\(s\\) random_case"),
    ("[grading]\ntimeout_s_cuda = -5\n", "timeout_s must be positive"),
    ("[gradnig]\n", "unknown table"),
])
def test_bad_course_files_are_explained(tmp_path, text, message):
    path = tmp_path / "course.toml"
    path.write_text(text)
    with pytest.raises(config.CourseError, match=message):
        config.load_course(path)


def test_correctness_is_a_fraction_or_all_or_nothing(tmp_path):
    result = _result(passed=(True, True, True, False))
    fraction = scoring.score_exercise(GELU, result, _course(total=100.0), (GELU,))
    (line, *_) = fraction.lines
    assert line.score == pytest.approx(0.75 * line.max_score) and not line.passed
    assert "3 of 4 checks passed" in line.output and "wrong on case 3" in line.output
    strict = scoring.score_exercise(GELU, result, _course(total=100.0, correctness="all-or-nothing"), (GELU,))
    assert strict.lines[0].score == 0


def test_smallest_failing_case_is_reported_first():
    result = _result(passed=(True, False, True, False))
    assert result.parts[0].first_failure().label == "case 1"


def test_an_integrity_flag_zeroes_the_whole_part():
    speed = SpeedResult("measured", "fast", 1.0)
    flagged = _result(flags=[{"rule": "no-torch-compute", "message": "gelu called aten.gelu"}], speed=speed)
    score = scoring.score_exercise(GELU, flagged, _course(total=100.0), (GELU,))
    assert score.score == 0
    assert any("[no-torch-compute] gelu called aten.gelu" in line.output for line in score.lines)
    clean = scoring.score_exercise(GELU, _result(speed=speed), _course(total=100.0), (GELU,))
    assert clean.score == pytest.approx(clean.max_score) and clean.score == pytest.approx(100.0)


def test_speed_is_worth_nothing_where_it_was_not_measured():
    part = GELU.parts[0]
    score = scoring.score_exercise(GELU, _result(), _course(total=100.0), (GELU,))
    assert [ln.component for ln in score.lines] == ["correctness"]  # no 0/0 lines
    if part.speed_points:
        assert score.max_score == pytest.approx(100.0 * part.points / GELU.max_points)
    half = _result(speed=SpeedResult("measured", "half", 0.5))
    scored = scoring.score_exercise(GELU, half, _course(total=100.0), (GELU,))
    if part.speed_points:
        speed_line = scored.lines[-1]
        assert speed_line.component == "speed" and speed_line.score == pytest.approx(speed_line.max_score / 2)


def test_reports_say_which_points_a_cpu_cannot_award_and_why(tmp_path):
    result = _result()
    result.device = {"kind": "cpu"}
    score = scoring.score_exercise(GELU, result, _course(total=100.0), (GELU,))
    speed_points = 100.0 * GELU.parts[0].speed_points / GELU.max_points
    assert score.unavailable_points == pytest.approx(speed_points) and score.max_score == pytest.approx(
        100.0 - speed_points)
    report = reports.StudentReport("ann", "/subs/ann", "directory", [], "CPU via the Triton interpreter",
                                   [(score, result)], 12.0)
    note = (f"The maximum here is {100 - speed_points:.2f} points, not 100: the other {speed_points:.2f} are speed "
            "points, not available in this run — speed is measured on a GPU only (here the kernels ran in the "
            "Triton interpreter).")
    assert note in reports.markdown(report)
    assert "| gelu / forward: speed | – / 33.33 (not counted) | not available:" in reports.markdown(report)
    assert 'id="speed-unavailable"' in reports.render_html(report)
    assert note in reports.gradescope(report)["output"]
    header, row = reports.gradebook_csv([report], ["gelu"]).splitlines()[:2]
    assert header.endswith(",speed_unavailable") and row.endswith(",33.33")
    assert "12.0 s of grading (its exercises' times added up)" in reports.markdown(report)
    from rich.console import Console

    console = Console(record=True, width=200)
    console.print(terminal.summary_table([report], ["gelu"]))
    text = " ".join(console.export_text().split())  # the caption wraps at the table's width
    assert "time (sum)" in text and "the batch's wall time follows the table" in text
    assert "33.33 speed points are not — speed is measured on a GPU only" in text


def test_on_a_gpu_an_unmeasured_part_scores_zero_speed_instead_of_shrinking_the_maximum():
    result = _result(speed=SpeedResult("not measured", "not measured: not implemented"))
    result.device = {"kind": "cuda"}
    score = scoring.score_exercise(GELU, result, _course(total=100.0), (GELU,))
    speed = score.lines[-1]
    assert speed.component == "speed" and speed.score == 0 and speed.max_score > 0 and not speed.passed
    assert "not implemented" in speed.output and score.unavailable == []
    assert score.max_score == pytest.approx(100.0)


def test_one_check_is_one_check():
    result = _result(passed=(False,))
    line = scoring.score_exercise(GELU, result, _course(total=100.0), (GELU,)).lines[0]
    assert "0 of 1 check passed" in line.output


def test_not_submitted_scores_zero_with_the_reason(tmp_path):
    settings = _settings(tmp_path)
    result = runner.grade_exercise(GELU, tmp_path / "empty", settings=settings, scratch=tmp_path / "scratch")
    assert result.status == "not submitted" and "not submitted: no gelu/gelu.py" in result.message
    score = scoring.score_exercise(GELU, result, _course(), (GELU,))
    assert score.score == 0 and score.max_score > 0


def _settings(tmp_path, **changes) -> config.RunSettings:
    return config.resolve(config.GradeOptions(random_cases=0, timeout_s=5, **changes), config.load_course(),
                          device="cpu", secret="s", workdir=tmp_path)


# ------------------------------------------------------------------------------------------ reports

ROWS = [
    {"label": "4096x4096 fp16", "student_ms": 0.21, "baseline_ms": 0.35, "ratio": 1.67, "required_full": 1.5,
     "required_partial": 0.9, "gbps": 1280.0, "tflops": 0.9, "pct_roofline": 61.0},
    {"label": "1M fp32", "student_ms": 0.02, "baseline_ms": 0.03, "ratio": 1.5, "required_full": 1.5,
     "required_partial": 0.9, "gbps": 800.0, "tflops": 0.5, "pct_roofline": 40.0},
]


def _report(tmp_path) -> reports.StudentReport:
    speed = SpeedResult("measured", "speed: 80% <b>not html</b>", 0.8,
                        [BenchmarkCredit(**{"baseline": "torch", **row}) for row in ROWS],
                        roofline={"copy_gbps": 3000.0, "matmul_tflops": {"float16": 700.0}})
    result = _result(passed=(True, False), flags=[{"rule": "fresh-inputs", "message": "replayed <script>"}],
                     speed=speed)
    missing = ExerciseResult("softmax", "Fused softmax", "not submitted", "not submitted: no softmax/softmax.py",
                             parts=[PartResult("forward", "not submitted", "not submitted: no softmax/softmax.py")])
    course = _course(total=20.0)
    pairs = [(scoring.score_exercise(e, r, course, ALL[:2]), r) for e, r in ((GELU, result), (ALL[1], missing))]
    return reports.StudentReport("zoe", "/subs/zoe.zip", "zip", ["a problem"], "CUDA on a test GPU", pairs, 12.0)


def test_markdown_gradescope_and_csv(tmp_path):
    report = _report(tmp_path)
    reports.write_student(tmp_path, report)
    md = (tmp_path / "students" / "zoe" / "report.md").read_text()
    assert "# Grade report: zoe" in md and "not submitted: no softmax/softmax.py" in md
    assert "Integrity flag `fresh-inputs`" in md and "| 4096x4096 fp16 |" in md
    data = json.loads((tmp_path / "students" / "zoe" / "results.json").read_text())
    assert data["score"] == pytest.approx(report.score) and data["tests"]
    assert {t["status"] for t in data["tests"]} <= {"passed", "failed"}
    gradebook = reports.gradebook_csv([report], ["gelu", "softmax"])
    header, row = gradebook.splitlines()[:2]
    assert header.startswith("student,total,max_total,gelu,softmax,gelu_status,softmax_status")
    assert row.startswith("zoe,0,") and "not submitted" in row


def test_roofline_svg_has_a_point_per_benchmark_and_the_roof():
    svg = roofline.roofline_svg(ROWS, title="t", peak_gbps=3000.0, peak_tflops=700.0)
    assert svg.startswith("<svg") and svg.count('class="point"') == 2 and "<polyline" in svg
    bars = roofline.roofline_svg([{"label": "copy", "gbps": 900.0, "pct_roofline": 30.0}], title="t")
    assert "% of roofline" in bars and bars.count('class="point"') == 1
    assert roofline.roofline_svg([{"label": "x"}], title="t") == ""
    series = roofline.roofline_svg([{**r, "series": s} for r, s in zip(ROWS, ("yours", "torch"))], title="t")
    assert series.count('r="4.5" fill="#1f77b4"') == 1 and series.count('r="4.5" fill="#ff7f0e"') == 1
    assert ">torch</text>" in series  # the legend
    assert roofline.peaks({"copy_gbps": 3000.0, "matmul_tflops": {"a": 600.0, "b": 700.0}}) == (3000.0, 700.0)
    assert roofline.peaks({}) == (None, None)


def test_the_html_report_draws_the_same_roofline(tmp_path):
    page = reports.render_html(_report(tmp_path))
    assert roofline.roofline_svg(ROWS, title="gelu / forward", peak_gbps=3000.0, peak_tflops=700.0) in page


def test_html_escapes_student_controlled_text(tmp_path):
    page = reports.render_html(_report(tmp_path))
    assert "<script>" not in page and "replayed &lt;script&gt;" in page
    assert "<b>not html</b>" not in page


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.skipif(_chromium() is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_html_report_renders_in_headless_chromium(tmp_path):
    report = _report(tmp_path)
    reports.write_student(tmp_path, report)
    page = tmp_path / "students" / "zoe" / "report.html"
    command = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
               f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([*command, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert '<h1 id="student">Grade report: zoe</h1>' in html
    assert "Total: <b>" in html and "gelu / forward: correctness" in html
    assert "not submitted: no softmax/softmax.py" in html
    assert 'class="roofline"' in html and html.count('class="point"') == 2
    assert "Integrity flag" in html and "4096x4096 fp16" in html
    shot = tmp_path / "report.png"
    subprocess.run([*command, f"--screenshot={shot}", "--window-size=1200,2000", page.as_uri()],
                   capture_output=True, timeout=120, check=True)
    assert shot.stat().st_size > 10_000  # a rendered page, not a blank one


# ------------------------------------------------------------------------------------ speed (glue)


def test_speed_is_not_planned_on_cpu():
    assert not any(it.role == "speed" for it in plan.plan(GELU, device="cpu", secret="s", random_cases=0,
                                                          speed_budget_s=1.0))
    assert any(it.role == "speed" for it in plan.plan(GELU, device="cuda", secret="s", random_cases=0,
                                                      speed_budget_s=1.0))


def test_parts_that_share_a_strategy_share_their_random_shapes_with_values_of_their_own():
    """FlashAttention's three parts draw from one strategy: each is given the same random shapes, dtypes and options
    (a kernel the parts share is compiled once for them all), each with secret values of its own. RMSNorm's two
    parts have strategies of their own, and their own draws."""
    def random_cases(exercise, device):
        by_part: dict[str, list] = {}
        for it in plan.plan(exercise, device=device, secret="s", random_cases=12, speed_budget_s=1.0):
            if it.role == "random":
                by_part.setdefault(it.part.name, []).append(it.case)
        return by_part

    for device in ("cpu", "cuda"):
        fa = random_cases(exercises.get("flash_attention"), device)
        forward, backward, autograd = fa["forward"], fa["backward"], fa["autograd"]
        assert len(forward) == len(backward) == len(autograd) == 12
        assert [c.params for c in forward] == [c.params for c in backward] == [c.params for c in autograd]
        seeds = [{c.seed for c in cases} for cases in (forward, backward, autograd)]
        assert seeds[0].isdisjoint(seeds[1]) and seeds[0].isdisjoint(seeds[2]) and seeds[1].isdisjoint(seeds[2])
        assert len({(c["dtype"], c["d"], c["causal"]) for c in forward}) > 1  # the draw still varies the kernels

        rms = random_cases(exercises.get("rmsnorm"), device)
        assert [c.params for c in rms["forward"]] != [c.params for c in rms["backward"]]


def test_on_a_gpu_each_part_and_with_room_its_speed_measurement_run_in_workers_of_their_own():
    """With ``parallel_parts`` (GPUs) each part is a group of its own, run side by side; with ``speed_apart`` too (a
    GPU with room for more runs than the batch has), a part's speed measurement is one more; without either (CPUs)
    one worker runs everything, in the plan's order."""
    fa = exercises.get("flash_attention")
    items = plan.plan(fa, device="cuda", secret="s", random_cases=2, speed_budget_s=1.0)
    settings = config.RunSettings(device="cuda", secret="s", random_cases=2, timeout_s=60.0, call_timeout_s=30.0,
                                  memory_mb=None, speed_budget_s=1.0, workdir=Path("."), parallel_parts=True)

    def shape(groups):
        assert sorted(it.id for group in groups for it in group) == sorted(it.id for it in items)  # each item once
        return [(group[0].part.name, {it.role == "speed" for it in group}) for group in groups]

    assert shape(runner._groups(items, settings)) == [("forward", {False, True}), ("backward", {False}),
                                                      ("autograd", {False, True})]
    apart = runner._groups(items, dataclasses.replace(settings, speed_apart=True))
    assert shape(apart) == [("forward", {False}), ("forward", {True}), ("backward", {False}), ("autograd", {False}),
                            ("autograd", {True})]
    assert runner._groups(items, dataclasses.replace(settings, parallel_parts=False)) == [items]
