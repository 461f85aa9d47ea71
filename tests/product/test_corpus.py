"""Student-style submissions, each with the verdict a fair grader gives it, graded through ``grader grade``.

``tests/corpus/<name>/<exercise>/<exercise>.py`` is one submission of one exercise, written the way students
write kernels (block pointers, tensor descriptors, autotuning, libdevice, half-precision arithmetic, PyTorch
helpers in the call, in-place tricks, unfinished features). ``<name>`` is the student id. All of them are graded
in one batch with a few random cases; each then has one test per device that holds the stored results against
the declaration in its module docstring. On a CPU the ``-cpu`` tests run; ``pytest -m gpu`` on a GPU machine runs
the ``-gpu`` ones, which use the GPU-side lines.

The declaration: docstring lines of these forms (any other line is prose)::

    status: <part>: <status>          the part's status: graded, not implemented, ...
    expect: <checks>: <regex>         at least one of the checks failed with a message matching regex
    fails: <checks>: <regex>          every one of the checks that ran failed, each message matching regex
    passes: <checks>                  every one of the checks that ran passed
    flags: none                       no integrity flag at all, on any part
    flags: <rule>[?][, <rule>[?]]     the flags raised, over all parts: each rule without "?" is raised, and
                                      none outside the list ("?": may be raised)
    note: <checks>: interpreter       every one of the checks that failed says the failure may be a limit of the
                                      Triton interpreter (a line naming the interpreter and a limit or the GPU)
    all-checks-run                    no check is "not run" because of another check's fault, none is a grader
                                      error, no part is in error or needs a regrade
    cpu-only: <line>, gpu-only: <line>    a line that holds on that device only (the verdicts differ)

``<checks>`` selects checks: ``<part>.<kind>`` with a kind of :mod:`grader.checks.catalog` (``examples``,
``random``, ``integrity``, ``bad_input``, ``memory``, ...) or ``correctness`` (examples and random cases), and
optionally ``[<param>=<value>, ...]``, the case parameters as case labels write them (``shape=2x8193``,
``dtype=bfloat16``, ``causal=True``). Checks skipped on the device are left out; a selector that leaves nothing
fails the declaration.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from grader import cli, exercises
from grader.checks import runtime
from grader.grading.results import store

from ..sandboxing import sandbox_args
from . import corpus_helpers

CORPUS = Path(__file__).parents[1] / "corpus"
SUBMISSIONS = corpus_helpers.corpus(CORPUS)
RANDOM_CASES = 2  # per part, on top of the examples: enough to reach the random checks, cheap on a CPU


def _device() -> str:
    return "gpu" if runtime.configure().is_cuda else "cpu"


@pytest.fixture(scope="module")
def graded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The output folder of one ``grader grade`` batch over the whole corpus."""
    out = tmp_path_factory.mktemp("corpus") / "out"
    jobs = ["--jobs", "2"] if _device() == "cpu" else []
    cli.main(["grade", *(str(s.path) for s in SUBMISSIONS), "--out", str(out), "--random", str(RANDOM_CASES),
              "--secret", "corpus", *jobs, *sandbox_args()])
    return out


def test_every_submission_declares_its_verdict():
    names = {e.name for e in exercises.all_exercises()}
    assert len(SUBMISSIONS) >= 12
    for sub in SUBMISSIONS:
        keys = {d.key for d in sub.declarations}
        assert sub.exercise in names, sub.path
        assert {"status", "flags"} <= keys, f"{sub.name}: declares no status or no flags"
        assert any(d.key == "flags" and d.device is None for d in sub.declarations), sub.name


PARAMS = [pytest.param(sub, device, id=f"{sub.name}-{device}", marks=[pytest.mark.gpu] if device == "gpu" else [])
          for sub in SUBMISSIONS for device in ("cpu", "gpu")]


@pytest.mark.slow  # one sandboxed batch of every corpus submission
@pytest.mark.parametrize(("submission", "device"), PARAMS)
def test_declared_verdict(submission: corpus_helpers.Submission, device: str, request: pytest.FixtureRequest):
    if device != _device():
        pytest.skip(f"the {device}-side verdict: kernels run on the {_device()} here")
    out: Path = request.getfixturevalue("graded")
    result = store.load_exercises(out, submission.name).get(submission.exercise)
    assert result is not None, f"no result for {submission.name}/{submission.exercise} in {out}"
    points, of = corpus_helpers.score(out, submission.name, submission.exercise)
    problems = corpus_helpers.unmet(submission, result, device)
    assert not problems, (f"{submission.name} ({submission.summary})\ngraded {points:.2f}/{of:.2f}:\n"
                          f"{corpus_helpers.summary(result)}\nunmet:\n" + "\n".join(problems))
