"""The batch's progress line: its time per submission and end are estimated from the tasks' work, not their
number, so that they hold from the first finished task of a batch that runs its longest tasks first."""

from __future__ import annotations

import heapq
import re

from grader.grading.batch.progress import Progress

# (planned seconds, seconds a run took) per exercise: a batch of 10 on one H100, as graded
EXERCISES = {"flash_attention": (190.0, 125.0), "rmsnorm": (113.0, 50.0), "matmul": (71.0, 32.0),
             "softmax": (62.0, 26.0), "gelu": (61.0, 20.0)}
PLACES = 7


def _seconds(text: str) -> float:
    number, unit = re.fullmatch(r"([0-9.]+) (s|min|h)", text).groups()
    return float(number) * {"s": 1, "min": 60, "h": 3600}[unit]


def _batch(*, weighted: bool) -> list[tuple[float, float, float, float]]:
    """Grade 10 students' 5 exercises longest first, 7 at once, on a fake clock: at each finished task, (the
    time, the true time left, the line's time left, the line's time per submission)."""
    tasks = [(f"s{i} {ex}", ex, planned, took) for ex, (planned, took) in EXERCISES.items() for i in range(10)]
    now = [0.0]
    work = {key: (ex, planned) for key, ex, planned, _ in tasks} if weighted else None
    progress = Progress(len(tasks), "a batch", per_submission=len(EXERCISES), work=work, clock=lambda: now[0])
    queue, running, seen = list(tasks), [], []

    def start() -> None:
        while queue and len(running) < PLACES:
            key, _, _, took = queue.pop(0)
            progress.start(key)
            heapq.heappush(running, (now[0] + took, key, took))

    start()
    while running:
        now[0], key, took = heapq.heappop(running)
        progress.advance(key, key=key, took_s=took)
        line = progress.status()
        per = _seconds(re.search(r"· (\S+ \S+) per submission", line).group(1))
        left = re.search(r"ends in about (\S+ \S+)", line)
        seen.append((now[0], 0.0, _seconds(left.group(1)) if left else 0.0, per))
        start()
    end = now[0]
    return [(t, end - t, left, per) for t, _, left, per in seen]


def test_the_end_is_foreseen_from_the_first_finished_task():
    seen = _batch(weighted=True)
    per_submission = seen[-1][0] / 10
    for t, true_left, left, per in seen[:-1]:
        assert 0.6 * true_left - 10 <= left <= 1.6 * true_left + 10, (t, true_left, left)
        assert 0.7 * per_submission <= per <= 1.35 * per_submission, (t, per, per_submission)
    assert seen[-1][3] == round(per_submission)


def test_counting_tasks_alike_is_far_off_when_the_longest_run_first():
    """The line as it was without the tasks' work: the first finished task said 10 min per submission and an end
    twenty times too late (the check above fails for it)."""
    per_submission = _batch(weighted=True)[-1][0] / 10
    t, true_left, left, per = _batch(weighted=False)[0]
    assert left > 5 * true_left and per > 5 * per_submission, (t, true_left, left, per)


def test_a_split_batch_counts_its_runs_from_when_they_are_seen_running(tmp_path, monkeypatch):
    """The parent of a split batch sees its children's runs through the folder: a run is timed from the first
    look that finds it running, and its time so far counts as work done."""
    from grader.grading.batch import markers, split
    from grader.grading.results import store

    now = [100.0]
    work = {"a gelu": ("gelu", 60.0), "b gelu": ("gelu", 60.0)}
    progress = Progress(2, "a split batch", per_submission=1, work=work, clock=lambda: now[0])
    done: set[tuple[str, str]] = set()
    results = type("Results", (), {"before": {("a", "gelu"): None, ("b", "gelu"): None},
                                   "done": lambda self, key: key in done})()
    monkeypatch.setattr(split, "WATCH_S", 3600.0)  # looked at by hand below
    monkeypatch.setattr(store, "read_markers",
                        lambda out: [(s, "gelu", {}, 0.0) for s in "ab" if (s, "gelu") not in done])
    monkeypatch.setattr(markers, "liveness", lambda data, age, jobs: markers.Liveness(True, "alive", True))
    watch = split._Watch(tmp_path, results, progress)
    watch.look()
    assert progress.running == 2 and set(progress._since) == {"a gelu", "b gelu"}
    now[0] += 30.0
    done.add(("a", "gelu"))  # its result cannot be read here: it took the 30 s it was seen running
    watch.look()
    assert progress.done == 1 and progress.running == 1 and progress._took == {"gelu": [30.0]}
    # b has run 30 s of its expected 30: the end is now
    assert "ends in about 0 s" in progress.status()
    watch.close()
