"""The class report: rebuilt from an output folder holding a small class (full marks, partial, an integrity flag,
a pending regrade, incomplete speed), rendered in headless Chromium, and its numbers checked against the
gradebook written beside it and against the students' results."""

from __future__ import annotations

import csv
import math
import re
import shutil
import statistics
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from grader import exercises
from grader.grading import config
from grader.grading.exercise_run import item_plan
from grader.grading.results import class_report, rebuild, store
from grader.grading.results.results import (
    FAILED,
    GRADED,
    NEEDS_REGRADE,
    PASSED,
    CheckResult,
    ExerciseResult,
    GraderError,
    PartResult,
    SpeedResult,
)
from grader.speed.credit import BenchmarkCredit

ALL = exercises.all_exercises()
GELU, SOFTMAX = exercises.get("gelu"), exercises.get("softmax")
SALT = "class-salt"
WRONG = "y: max abs error 3.2 at [17], expected 0.5"


def _checks(exercise, failing: set[str] = frozenset()) -> list[CheckResult]:
    items = item_plan.plan(exercise, device="cpu", secret="s", random_cases=2, speed_budget_s=1.0)
    return [CheckResult(it.id, it.role, it.label, FAILED if it.id in failing else PASSED,
                        WRONG if it.id in failing else "") for it in items]


def _speed(exercise, ratios: list[float]) -> SpeedResult:
    labels = [b.label for b in exercise.parts[0].benchmarks]
    rows = [BenchmarkCredit(label, "torch", student_ms=1.0 / r, baseline_ms=1.0, ratio=r, required_full=1.0,
                            required_partial=0.5) for label, r in zip(labels, ratios)]
    credit = statistics.fmean(min(1.0, max(0.0, (r - 0.5) / 0.5)) for r in ratios)
    return SpeedResult("measured", "speed", credit, rows, calibrated=True)


def _result(exercise, *, failing=frozenset(), ratios=(), flags=(), regrade=False) -> ExerciseResult:
    part = PartResult("forward", NEEDS_REGRADE if regrade else GRADED, checks=_checks(exercise, set(failing)),
                      flags=list(flags), speed=_speed(exercise, list(ratios)) if ratios else SpeedResult("not graded"))
    errors = [GraderError("forward.random[0]", "RuntimeError: judge crashed")] if regrade else []
    return ExerciseResult(exercise.name, exercise.title, NEEDS_REGRADE if regrade else GRADED, parts=[part],
                          grader_errors=errors, device={"kind": "cuda", "name": "NVIDIA H100 80GB HBM3", "index": 0})


CLASS = {  # student: (display name, {exercise: result})
    "s1": ("Speedy <b>", {"gelu": _result(GELU, ratios=(1.2, 0.9)), "softmax": _result(SOFTMAX, ratios=(1.0, 1.1))}),
    "s2": (None, {"gelu": _result(GELU, failing={"forward.random[0]"}, ratios=(0.5, 0.6)),
                  "softmax": _result(SOFTMAX, failing={"forward.random[0]", "forward.random[1]"}, ratios=(0.7, 0.8))}),
    "s3": (None, {"gelu": _result(GELU, ratios=(2.0, 2.0), flags=[{"rule": "no-torch-compute",
                                                                   "message": "gelu called aten.gelu"}]),
                  "softmax": _result(SOFTMAX, failing={"forward.random[0]"}, ratios=(3.0, 3.0))}),
    "s4": ("Regrade Me", {"gelu": _result(GELU, regrade=True), "softmax": _result(SOFTMAX, ratios=(1.5, 1.5))}),
    "s5": (None, {"gelu": _result(GELU, ratios=(4.0,)), "softmax": _result(SOFTMAX, failing={"forward.random[1]"})}),
    "s6": (None, {"gelu": _result(GELU, ratios=(1.0, 1.0))}),  # softmax not graded yet
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("class")
    store.write_run(out, {"exercises": ["gelu", "softmax"], "device": "CUDA on NVIDIA H100 80GB HBM3",
                          "secret_salt": SALT, "started": "2026-01-01 10:00:00"})
    for student, (display, results) in CLASS.items():
        store.save_submission(out, student, {"source": f"/subs/{student}", "kind": "directory", "problems": [],
                                             "display_name": display})
        for result in results.values():
            store.save_exercise(out, student, result)
    store.record_gpu_failure(out, {"slot": "cuda:3", "device": {"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-3"},
                                   "reason": "health check failed: CUDA is not available", "task": "s2 gelu",
                                   "when": "2026-01-01 10:05:00"})
    rebuild.rebuild(out, course=config.load_course(), all_exercises=ALL)
    return out


def _gradebook(out: Path) -> list[dict[str, str]]:
    with open(out / store.GRADEBOOK) as f:
        return list(csv.DictReader(f))


class _Cells(HTMLParser):
    """Text of every element with an id, and the data-* attributes of the page, in order."""

    def __init__(self):
        super().__init__()
        self.by_id: dict[str, str] = {}
        self.data: list[tuple[str, str, str]] = []  # (tag, attribute, value)
        self._open: list[str | None] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.data += [(tag, k, v) for k, v in attrs.items() if k.startswith("data-")]
        if tag in ("br", "meta", "hr", "img"):  # no end tag follows
            return
        self._open.append(attrs.get("id"))
        if attrs.get("id"):
            self.by_id[attrs["id"]] = ""

    def handle_endtag(self, tag):
        if self._open:
            self._open.pop()

    def handle_data(self, text):
        for ident in self._open:
            if ident:
                self.by_id[ident] += text


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def _render(path: Path, profile: Path) -> str:
    command = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
               f"--user-data-dir={profile}"]
    dom = subprocess.run([*command, "--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    return dom.stdout


@pytest.fixture(scope="module")
def page(folder, tmp_path_factory) -> _Cells:
    """The page as Chromium renders it (its DOM); as written where Chromium is missing."""
    path = folder / store.CLASS_REPORT_HTML
    html = _render(path, tmp_path_factory.mktemp("profile")) if _chromium() else path.read_text()
    cells = _Cells()
    cells.feed(html)
    cells.html = html
    return cells


@pytest.mark.skipif(_chromium() is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_the_page_renders_in_headless_chromium(folder, tmp_path):
    path = folder / store.CLASS_REPORT_HTML
    dom = _render(path, tmp_path / "profile")
    assert '<h1 id="title">Class report</h1>' in dom and dom.count('class="histogram"') == 3
    shot = tmp_path / "class.png"
    subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1300,3000",
                    path.as_uri()], capture_output=True, timeout=120, check=True)
    assert shot.stat().st_size > 20_000  # a rendered page, not a blank one


def _num(text: str) -> float:
    return float(text.strip())


@pytest.mark.parametrize("exercise", ["gelu", "softmax"])
def test_score_statistics_match_the_gradebook(folder, page, exercise):
    rows = _gradebook(folder)
    scored = [float(r[exercise]) for r in rows if r[f"{exercise}_status"] not in ("needs regrade", "pending")]
    assert _num(page.by_id[f"stat-{exercise}-n"]) == len(scored)
    assert _num(page.by_id[f"stat-{exercise}-mean"]) == pytest.approx(statistics.fmean(scored), abs=0.006)
    assert _num(page.by_id[f"stat-{exercise}-median"]) == pytest.approx(statistics.median(scored), abs=0.006)
    assert _num(page.by_id[f"stat-{exercise}-min"]) == pytest.approx(min(scored), abs=0.006)
    assert _num(page.by_id[f"stat-{exercise}-highest"]) == pytest.approx(max(scored), abs=0.006)
    most = _num(page.by_id[f"stat-{exercise}-max"])
    assert _num(page.by_id[f"stat-{exercise}-full"]) == sum(abs(v - most) < 0.006 for v in scored)
    regrade = sum(r[f"{exercise}_status"] == "needs regrade" for r in rows)
    assert _num(page.by_id[f"stat-{exercise}-regrade"]) == regrade
    bars = [int(v) for tag, k, v in page.data if k == "data-count"]
    assert sum(bars) > 0
    hist = re.search(rf'<svg[^>]*id="hist-{exercise}".*?</svg>', page.html, re.S).group(0)
    assert sum(int(c) for c in re.findall(r'data-count="(\d+)"', hist)) == len(scored)


def test_total_statistics_match_the_gradebook(folder, page):
    totals = [float(r["total"]) for r in _gradebook(folder)]
    assert _num(page.by_id["n-students"]) == len(totals) == len(CLASS)
    assert _num(page.by_id["stat-total-mean"]) == pytest.approx(statistics.fmean(totals), abs=0.006)
    assert _num(page.by_id["stat-total-highest"]) == pytest.approx(max(totals), abs=0.006)


def test_the_most_failed_checks_count_students_and_show_an_example(page):
    counts = {v: None for tag, k, v in page.data if k == "data-check"}
    expected = {}
    for _, results in CLASS.values():
        for result in results.values():
            for check in result.parts[0].checks:
                if check.status == FAILED:
                    key = f"{result.exercise}:{check.id}"
                    expected[key] = expected.get(key, 0) + 1
    assert set(counts) == set(expected)
    order = re.findall(r'data-check="([^"]+)">(\d+)<', page.html)
    assert {k: int(n) for k, n in order} == expected
    assert [int(n) for _, n in order] == sorted((int(n) for _, n in order), reverse=True)
    assert order[0] == ("softmax:forward.random[0]", "2") and WRONG in page.html


def test_the_leaderboard_ranks_verified_complete_clean_speed_only(page):
    board = re.findall(r'<tr><td class="num">(\d+)</td><td>(.*?)</td><td class="num" data-geomean="([^"]+)"',
                       page.html)
    geo = {s: math.exp(statistics.fmean(math.log(r) for res in CLASS[s][1].values()
                                         for row in res.parts[0].speed.rows for r in [row.ratio]))
           for s in ("s1", "s2")}
    # s3 is flagged, s4 awaits a regrade, s5 and s6 lack benchmarks: not ranked
    assert [(rank, float(value)) for rank, _, value in board] == [("1", pytest.approx(geo["s1"], rel=1e-5)),
                                                                  ("2", pytest.approx(geo["s2"], rel=1e-5))]
    assert board[0][1] == "Speedy &lt;b&gt;"  # the opted-in name, escaped
    assert board[1][1] == class_report.anonymous_id("s2", SALT) and "s2" not in board[1][1]
    assert "4 student(s) not ranked" in page.html
    assert "NVIDIA H100 80GB HBM3" in page.by_id["leaderboard-table"]


def test_speed_flags_regrades_unfinished_and_gpu_failures_are_listed(page):
    median = page.by_id["ratio-gelu.forward.fp32-4096x8192-median"]
    assert _num(median) == pytest.approx(statistics.median([1.2, 0.5, 4.0, 1.0]), abs=0.006)  # not s3 (flagged)
    assert page.html.count('class="strip"') == 4
    assert "no-torch-compute" in page.by_id["flag-table"] and "s3" in page.by_id["flag-table"]
    assert "s4" in page.by_id["regrade-table"] and "judge crashed" in page.by_id["regrade-table"]
    assert "1 exercise run(s) have no result yet: s6/softmax" in page.by_id["n-missing"]
    assert "cuda:3" in page.html and "CUDA is not available" in page.html


def test_the_csv_holds_the_same_numbers(folder, page):
    with open(folder / store.CLASS_REPORT_CSV) as f:
        rows = list(csv.DictReader(f))
    assert set(rows[0]) == {"section", "exercise", "part", "item", "student", "value", "max", "detail"}
    mean = next(r for r in rows if r["section"] == "score" and r["exercise"] == "gelu" and not r["part"]
                and r["item"] == "mean")
    assert mean["value"] == page.by_id["stat-gelu-mean"].strip()
    board = [r for r in rows if r["section"] == "leaderboard"]
    assert [r["student"] for r in board] == ["s1", "s2"]
    failed = {(r["exercise"], r["item"]): int(r["value"]) for r in rows if r["section"] == "failed_check"}
    assert failed[("softmax", "forward.random[0]")] == 2
    assert {r["student"] for r in rows if r["section"] == "needs_regrade"} == {"s4"}


def test_no_network_and_nothing_executable_in_the_page(folder):
    text = (folder / store.CLASS_REPORT_HTML).read_text()
    assert "<script" not in text and "http://" not in text.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in text and "<b>" not in text.replace("<b>gelu</b>", "").replace("<b>softmax</b>", "") \
        .replace("<b>total</b>", "")


def test_empty_problem_tables_say_none(tmp_path):
    """A clean class: the flag and regrade tables say that nothing was found, instead of standing empty."""
    store.write_run(tmp_path, {"exercises": ["gelu"], "device": "CPU", "secret_salt": SALT,
                               "started": "2026-01-01 10:00:00"})
    store.save_submission(tmp_path, "s1", {"source": "/subs/s1", "kind": "directory", "problems": []})
    store.save_exercise(tmp_path, "s1", _result(GELU))
    rebuild.rebuild(tmp_path, course=config.load_course(), all_exercises=ALL)
    cells = _Cells()
    cells.feed((tmp_path / store.CLASS_REPORT_HTML).read_text())
    assert "no integrity flag was raised" in cells.by_id["flag-table"]
    assert "the grader failed on no part" in cells.by_id["regrade-table"]


def test_thresholds_are_shown_rounded_and_the_histograms_last_label_is_not_clipped(tmp_path):
    result = _result(GELU, ratios=(1.2, 0.9))
    for row in result.parts[0].speed.rows:
        row.required_full, row.required_partial = 1.354924, 0.747488  # as calibrate writes them
    store.write_run(tmp_path, {"exercises": ["gelu"], "device": "CPU", "secret_salt": SALT,
                               "started": "2026-01-01 10:00:00"})
    store.save_submission(tmp_path, "s1", {"source": "/subs/s1", "kind": "directory", "problems": []})
    store.save_exercise(tmp_path, "s1", result)
    rebuild.rebuild(tmp_path, course=config.load_course(), all_exercises=ALL)
    html = (tmp_path / store.CLASS_REPORT_HTML).read_text()
    assert ">1.35</td>" in html and ">0.75</td>" in html and "1.354924" not in html.split('id="speed-table"')[1][:2000]
    assert 'text-anchor="end" font-size="10">100%</text>' in html
