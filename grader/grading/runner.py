"""Grade one exercise of one submission: plan the checks, run them in a sandboxed worker, judge the
observations it sends back. This is the verdict process: it never imports student code; it rebuilds
every input from the case and computes the float64 references itself (grader.check.judge*).

Checks of a part, in the order the worker runs them:

* correctness: the part's examples, then ``n_random`` cases drawn from its strategy. Every seed mixes
  the run's secret with the public case, so the values are unknown before the run;
* integrity: the part's integrity cases (the same rules as ``pytest``: the student's own Triton
  kernel, no PyTorch compute, inputs unchanged, no aliasing). "No PyTorch compute", "inputs unchanged"
  and "no aliasing" are also applied to every correctness case (a shortcut taken for some shapes only
  is still a shortcut);
* fresh inputs: the first integrity case again with new values; the same output bits for different
  inputs mean a cached or replayed result;
* bad inputs: the calls that must raise;
* speed (CUDA only, via grader.speed): timed against the baselines, outputs of the timed runs and of a
  run on fresh inputs re-checked here.

A worker that crashes (or overruns the per-call limit) is restarted for the checks it had not reached —
once, and again (at most ``max_restarts`` times) only if the restarted worker made progress; the check
it was running fails with the reason. The exercise's time limit is for all runs together: a time-out
ends the exercise.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from grader import cases as cases_mod
from grader import check, integrity, loader
from grader.grading import channel, sandbox
from grader.spec import Case, Exercise, Part

MB = 1 << 20
STDERR_TAIL_LINES = 15
_DRAW_LOCK = threading.Lock()

# Runs the worker with only the grader package importable: a private directory holding a link to it
# goes first on sys.path, and -I keeps out the working directory, PYTHONPATH and the user site.
_BOOT = (
    "import sys; sys.path.insert(0, sys.argv[1]); del sys.argv[1]; import runpy; "
    "runpy.run_module('grader.grading.worker', run_name='__main__', alter_sys=True)"
)


@dataclass
class Settings:
    device: str
    secret: str
    n_random: int
    timeout_s: float
    memory_mb: int | None  # None: no limit
    workdir: Path  # private scratch space of this grading run
    output_cap: int = 64 * 1024  # bytes of stdout and of stderr kept per worker
    result_cap_mb: int = 4096  # largest result channel
    call_timeout_s: float = 120.0  # one call of the student's code (a check); 0: no limit
    speed_budget_s: float = 20.0
    gpu_name: str | None = None
    max_restarts: int = 2


@dataclass
class Check:
    """One graded check: a correctness case, a bad input, an integrity case, ..."""

    id: str
    kind: str  # "example" | "random" | "bad_input" | "integrity" | "fresh"
    label: str
    passed: bool
    message: str = ""
    case: dict | None = None
    size: int | None = None  # elements in the inputs: the smallest failing case is shown first


@dataclass
class PartResult:
    name: str
    status: str  # "graded" | "not implemented" | "error" | "not submitted"
    message: str = ""
    correctness: list[Check] = field(default_factory=list)
    integrity: list[Check] = field(default_factory=list)
    flags: list[dict] = field(default_factory=list)  # {"rule", "message"}; any flag zeroes the part
    speed: dict = field(default_factory=dict)  # {"status", "message", "fraction", "rows", ...}

    @property
    def passed_cases(self) -> int:
        return sum(c.passed for c in self.correctness)

    def first_failure(self) -> Check | None:
        failing = [c for c in self.correctness if not c.passed]
        return min(failing, key=lambda c: (c.size is None, c.size or 0)) if failing else None


@dataclass
class ExerciseResult:
    exercise: str
    title: str
    status: str  # "graded" | "not submitted" | "not implemented" | "error"
    message: str = ""
    parts: list[PartResult] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # crashes, time-outs, malformed results
    log: str = ""  # the worker's captured stdout/stderr
    elapsed_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("log")
        return data


# --------------------------------------------------------------------------------------------- plan


def _item(part: Part, role: str, n: int, **extra) -> dict[str, Any]:
    return {"id": f"{part.name}/{role}/{n}", "part": part.name, "kind": extra.pop("item_kind", "case"),
            "role": role, **extra}


def plan(exercise: Exercise, settings: Settings) -> list[dict[str, Any]]:
    """The checks to run, with every seed derived from the secret (the worker never sees the secret)."""
    device, secret = settings.device, settings.secret
    items: list[dict[str, Any]] = []
    for part in exercise.parts:
        mix = lambda *public, _p=part: cases_mod.mixed_seed(secret, exercise.name, _p.name, *public)
        examples = [c.with_seed(mix("example", i)) for i, c in enumerate(part.examples)]
        examples = [c for c in examples if part.skip(c, device) is None]
        for i, case in enumerate(examples):
            items.append(_item(part, "example", i, case=case.to_dict(), full=True))
        if settings.n_random > 0:
            # Hypothesis generates the minimal example (smallest shape, seed 0) first whatever the seed:
            # draw one more and drop it, and give every case secret values.
            with _DRAW_LOCK:  # hypothesis is not thread-safe; runs are planned from several threads
                drawn = cases_mod.draw(part, device, settings.n_random + 1, mix("random"))
            drawn = [c.with_seed(mix("random", i)) for i, c in enumerate(drawn[1:] or drawn)]
        else:
            drawn = []
        for i, case in enumerate(drawn[: settings.n_random]):
            items.append(_item(part, "random", i, case=case.to_dict(), full=True))
        integrity_cases = [c.with_seed(mix("integrity", i))
                           for i, c in enumerate(part.integrity_cases or part.examples[:1])]
        integrity_cases = [c for c in integrity_cases if part.skip(c, device) is None]
        for i, case in enumerate(integrity_cases):
            items.append(_item(part, "integrity", i, case=case.to_dict(), full=True))
        if integrity_cases:
            fresh = integrity_cases[0].with_seed(mix("fresh"))
            items.append(_item(part, "fresh", 0, case=fresh.to_dict(), full=False))
        for i, _ in enumerate(part.bad_inputs):
            items.append(_item(part, "bad_input", i, item_kind="bad_input", index=i))
        if device == "cuda" and part.speed_points > 0 and part.benchmarks:
            items.append(_item(part, "speed", 0, item_kind="speed", seed=mix("speed"),
                               budget_s=settings.speed_budget_s))
    return items


# ---------------------------------------------------------------------------------------------- run


@dataclass
class _Run:
    results: dict[str, dict] = field(default_factory=dict)  # item id -> result record
    load_errors: dict[str, dict] = field(default_factory=dict)
    loaded: bool = False
    failed: dict[str, str] = field(default_factory=dict)  # item id -> why it has no result
    problems: list[str] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)


def _describe(item_id: str, items: dict[str, dict], exercise: Exercise) -> str:
    if item_id == "load":
        return f"importing {exercise.module}.py"
    item = items[item_id]
    what = {"example": "example case", "random": "random case", "integrity": "integrity case",
            "fresh": "fresh-input case", "bad_input": "bad-input check", "speed": "the speed measurement"}
    text = f"running the {item['part']} {what.get(item['role'], item['role'])}"
    if "case" in item:
        text += f" {Case.from_dict(item['case']).label}"
    return text


_NOISE = ("Extension modules:", '  File "<frozen runpy>"', '  File "<string>"', "Current thread 0x",
          "Thread 0x", "Timeout (")


def _stderr_tail(outcome: sandbox.Outcome, grader_dir: str) -> str:
    """The end of the worker's stderr without the grader's own frames (a faulthandler dump keeps the
    student's frames and the "Fatal Python error" line)."""
    lines = [line for line in outcome.stderr.text().rstrip().splitlines()
             if line.strip() and not line.startswith(_NOISE) and grader_dir not in line]
    return "\n".join(lines[-STDERR_TAIL_LINES:])


def _worker_argv(settings: Settings, fd: int) -> list[str]:
    argv = [sys.executable, "-I", "-c", _BOOT, str(_package_link(settings.workdir)), "--fd", str(fd),
            "--file-mb", str(settings.result_cap_mb)]
    if settings.memory_mb and settings.device != "cuda":  # CUDA needs a huge address space: see sandbox.py
        argv += ["--memory-mb", str(settings.memory_mb)]
    return argv


def _package_link(workdir: Path) -> Path:
    """A directory whose only entry is a link to the grader package (never the repository root)."""
    import grader

    link_dir = workdir / "pkg"
    link = link_dir / "grader"
    if not link.exists():
        link_dir.mkdir(parents=True, exist_ok=True)
        try:
            link.symlink_to(Path(grader.__file__).resolve().parent, target_is_directory=True)
        except FileExistsError:
            pass
    return link_dir


def _run_worker(exercise: Exercise, root: Path, items: list[dict], settings: Settings, timeout_s: float,
                scratch: Path, cache_dir: Path | None):
    job = {"exercise": exercise.name, "root": str(root), "device": settings.device,
           "call_timeout_s": settings.call_timeout_s,
           "items": [{k: v for k, v in it.items() if k != "role"} for it in items]}
    cwd = Path(tempfile.mkdtemp(prefix="run-", dir=scratch))
    env = sandbox.minimal_env({"GRADER_DEVICE": settings.device}, home=str(cwd))
    if cache_dir is not None:  # compiled kernels are shared by one submission's workers, never across students
        env["TRITON_CACHE_DIR"] = str(cache_dir)
    if settings.device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    rss_limit = settings.memory_mb * MB if settings.memory_mb else None
    with tempfile.TemporaryFile(dir=scratch) as results:
        fd = results.fileno()
        outcome = sandbox.run(
            _worker_argv(settings, fd), stdin_data=json_bytes(job), cwd=str(cwd), env=env, timeout_s=timeout_s,
            rss_limit_bytes=rss_limit, output_cap=settings.output_cap, pass_fds=(fd,),
        )
        size = os.fstat(fd).st_size
        if size > settings.result_cap_mb * MB:
            decoded = channel.Decoded(problem=f"the worker's result is larger than {settings.result_cap_mb} MB")
        else:
            results.seek(0)
            decoded = channel.read_records(results.read())
    return outcome, decoded


def json_bytes(data: Any) -> bytes:
    import json

    return json.dumps(data).encode()


def execute_plan(exercise: Exercise, root: Path, items: list[dict], settings: Settings, scratch: Path,
                 cache_dir: Path | None = None) -> _Run:
    """Run the items, restarting after a crash; every item ends with a result or a reason in ``failed``."""
    by_id = {it["id"]: it for it in items}
    run = _Run()
    remaining = list(items)
    deadline = time.monotonic() + settings.timeout_s
    attempt = 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0.5:
            for it in remaining:
                run.failed.setdefault(it["id"], f"not run: the {settings.timeout_s:g} s time limit was used up")
            break
        outcome, decoded = _run_worker(exercise, root, remaining, settings, left, scratch, cache_dir)
        run.logs.append(_log_text(outcome, attempt))
        current, done, progress = None, False, 0
        for record in decoded.records:
            kind = record["type"]
            if kind == "begin":
                current = record.get("id")
            elif kind == "loaded":
                run.loaded = True
                errors = record.get("errors")
                run.load_errors = errors if isinstance(errors, dict) else {}
                current = None
            elif kind == "result" and record.get("id") in by_id:
                progress += record["id"] not in run.results
                run.results.setdefault(record["id"], record)
                current = None
            elif kind == "done":
                done = True
        if decoded.problem:
            run.problems.append(f"the worker sent a malformed result: {decoded.problem}")
        if done and not decoded.problem:
            break
        why = _why_ended(outcome, settings, decoded.problem)
        where = _describe(current, by_id, exercise) if current else "starting up"
        message = f"{why} while {where}" if current else f"{why} ({where})"
        tail = _stderr_tail(outcome, str(_package_link(settings.workdir) / "grader"))
        if tail and not outcome.timed_out and attempt == 0:  # restarts usually repeat the same story
            label = "where it was" if "took longer" in why else "last lines of its stderr"
            message += f"\n{label}:\n{tail}"
        run.problems.append(message)
        if current and current != "load":
            run.failed[current] = message
        pending = [it for it in remaining if it["id"] not in run.results and it["id"] not in run.failed]
        # Restart for the checks it had not reached: once, and again only while the restarts make progress
        # (a crash on one case costs that case; code that crashes on every call is not run over and over).
        stuck = attempt > 0 and progress == 0
        if (current == "load" or not run.loaded or outcome.timed_out or decoded.problem or stuck
                or attempt >= settings.max_restarts):
            for it in pending:
                run.failed[it["id"]] = f"not run: {message.splitlines()[0]}"
            break
        remaining = pending
        attempt += 1
        if not remaining:
            break
    return run


def _why_ended(outcome: sandbox.Outcome, settings: Settings, problem: str | None) -> str:
    if outcome.returncode == 1 and "Timeout (" in outcome.stderr.text():  # the worker's per-call watchdog
        return f"took longer than the {settings.call_timeout_s:g} s allowed for one call (stopped)"
    if outcome.timed_out:
        return f"timed out after {settings.timeout_s:g} s (the process group was killed)"
    if outcome.memory_exceeded:
        return f"used more than {settings.memory_mb} MB of memory (the process group was killed)"
    if outcome.signal_name:
        return f"crashed with {outcome.signal_name}"
    if problem:
        return f"stopped with a malformed result (exit code {outcome.returncode})"
    return f"exited early (exit code {outcome.returncode})"


def _log_text(outcome: sandbox.Outcome, attempt: int) -> str:
    head = f"--- worker run {attempt + 1}: {outcome.elapsed_s:.1f} s"
    if outcome.leftover_killed:
        head += f"; killed {outcome.leftover_killed} process(es) it left running"
    return f"{head}\n[stdout]\n{outcome.stdout.text()}\n[stderr]\n{outcome.stderr.text()}"


# -------------------------------------------------------------------------------------------- judge


class Malformed(Exception):
    pass


def _tensor_dict(value: Any, what: str) -> dict[str, torch.Tensor]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in value.items()):
        raise Malformed(f"{what} is not a dict of tensors")
    return value


def _str_list(value: Any, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise Malformed(f"{what} is not a list of strings")
    return value


def _execution(record: dict) -> check.Execution:
    """Rebuild an Execution from a worker record, checking every field's type."""
    data = record.get("execution")
    if not isinstance(data, dict):
        raise Malformed("no execution data")
    outputs = data.get("outputs")
    if outputs is not None:
        outputs = _tensor_dict(outputs, "outputs")
    devices = data.get("output_devices", {})
    if not isinstance(devices, dict) or not all(isinstance(v, str) for v in devices.values()):
        raise Malformed("output_devices is not a dict of strings")
    error_kind = data.get("error_kind")
    if error_kind not in (None, "not_implemented", "exception", "bad_output"):
        raise Malformed(f"unknown error kind {error_kind!r}")
    error = data.get("error")
    if error is not None and not isinstance(error, str):
        raise Malformed("error is not a string")
    if error_kind is None and outputs is None:
        raise Malformed("neither outputs nor an error")
    kernels = data.get("kernels", [])
    if not isinstance(kernels, list) or not all(
        isinstance(k, list) and len(k) == 2 and all(isinstance(s, str) for s in k) for k in kernels
    ):
        raise Malformed("kernels is not a list of (name, file) pairs")
    return check.Execution(
        outputs=outputs,
        output_devices=devices,
        error_kind=error_kind,
        error=error,
        ops=_str_list(data.get("ops", []), "ops"),
        kernels=[(n, f) for n, f in kernels],
        inputs_after=_tensor_dict(data.get("inputs_after", {}), "inputs_after"),
        aliased=_str_list(data.get("aliased", []), "aliased"),
    )


def _size(case: Case, part: Part) -> int:
    inputs = part.make_inputs(case)
    return sum(v.numel() for v in inputs.values() if isinstance(v, torch.Tensor))


def _flag_case(flag: integrity.Flag, case: Case) -> dict:
    return {"rule": flag.rule, "message": f"{flag.message} (case {case.label})"}


def judge_part(part: Part, exercise: Exercise, items: list[dict], run: _Run, settings: Settings,
               student_dir: str) -> PartResult:
    device = settings.device
    function = part.functions[0]
    result = PartResult(part.name, "graded")
    if not run.loaded:
        result.status = "error"
        result.message = run.problems[0] if run.problems else "the worker did not start"
        result.speed = _no_speed(part, device, "not measured: the module did not load")
        return result
    if part.name in run.load_errors:
        err = run.load_errors[part.name]
        message = str(err.get("message", "")) if isinstance(err, dict) else str(err)
        kind = err.get("kind") if isinstance(err, dict) else None
        result.status = "not submitted" if kind == "missing" else "error"
        result.message = message
        result.speed = _no_speed(part, device, "not measured: the module did not load")
        return result

    mine = [it for it in items if it["part"] == part.name]
    first = next((it for it in mine if it["id"] in run.results), None)
    if first is not None and run.results[first["id"]].get("status") == "not_implemented":
        names = " / ".join(part.functions)
        result.status = "not implemented"
        result.message = f"{names} is not implemented yet — see {exercise.handout}"
        result.speed = _no_speed(part, device, "not measured: not implemented")
        return result

    flags: dict[str, dict] = {}
    outputs_by_id: dict[str, dict | None] = {}
    integrity_ran = False
    correctness_ok: list[tuple[Case, check.Execution]] = []
    for it in mine:
        role, record = it["role"], run.results.get(it["id"])
        case = Case.from_dict(it["case"]) if "case" in it else None
        if role in ("example", "random", "integrity", "fresh"):
            assert case is not None
            if record is None:
                check_ = Check(it["id"], role, case.label, False, run.failed.get(it["id"], "not run"), it["case"])
            elif record.get("status") == "error":
                check_ = Check(it["id"], role, case.label, False, f"{function} raised {record.get('message', '')}",
                               it["case"])
            elif record.get("status") == "not_implemented" and "execution" not in record:
                check_ = Check(it["id"], role, case.label, False, f"not implemented: {record.get('message', '')}",
                               it["case"])
            else:
                try:
                    ex = _execution(record)
                except Malformed as exc:
                    run.problems.append(f"the worker sent a malformed result for {it['id']}: {exc}")
                    check_ = Check(it["id"], role, case.label, False, f"malformed result from the worker: {exc}",
                                   it["case"])
                else:
                    outputs_by_id[it["id"]] = ex.outputs
                    check_ = _judge_execution(part, case, ex, it, settings, student_dir, flags, correctness_ok)
                    integrity_ran = integrity_ran or (role == "integrity" and ex.error_kind is None)
            check_.size = _size(case, part)
            if role in ("example", "random"):
                result.correctness.append(check_)
            elif role == "integrity":
                result.integrity.append(check_)
        elif role == "bad_input":
            bad = part.bad_inputs[int(it["index"])]
            label = f"bad input: {bad.label}"
            if record is None:
                result.correctness.append(Check(it["id"], role, label, False, run.failed.get(it["id"], "not run")))
            elif record.get("status") == "ok":
                outcome = check.BadInputOutcome(
                    record.get("raised") if isinstance(record.get("raised"), str) else None,
                    [str(t) for t in record.get("raised_types") or []],
                    str(record.get("message", "")),
                )
                verdict = check.judge_bad_input(bad, outcome)
                result.correctness.append(Check(it["id"], role, label, verdict.passed, verdict.message))
            else:
                result.correctness.append(Check(it["id"], role, label, False,
                                                f"{bad.function} ({bad.label}): {record.get('message', '')}"))
        elif role == "speed":
            result.speed = _judge_speed(part, record, run.failed.get(it["id"]), settings, flags)

    _judge_replays(part, mine, outputs_by_id, device, flags)
    if not integrity_ran and correctness_ok:
        # The integrity cases did not run cleanly: judge the kernel rule on the cases that did.
        case, ex = correctness_ok[0]
        verdict = check.judge_integrity(part, case, ex, student_dir=student_dir)
        for flag in verdict.flags:
            flags.setdefault(flag.rule, _flag_case(flag, case))
        integrity_ran = True
    if not integrity_ran:
        result.integrity.append(Check(f"{part.name}/integrity/unchecked", "integrity", "integrity", False,
                                      f"{function} could not be checked: no call returned normally"))
    result.flags = list(flags.values())
    if not result.speed:
        result.speed = _no_speed(part, device)
    return result


def _judge_execution(part, case, ex, item, settings, student_dir, flags, correctness_ok) -> Check:
    role = item["role"]
    if role == "integrity":
        verdict = check.judge_integrity(part, case, ex, student_dir=student_dir)
        for flag in verdict.flags:
            flags.setdefault(flag.rule, _flag_case(flag, case))
        return Check(item["id"], role, case.label, verdict.passed, verdict.message, item["case"])
    if role == "fresh":
        return Check(item["id"], role, case.label, True, "", item["case"])
    verdict = check.judge(part, case, ex, settings.device)
    if ex.error_kind is None:
        correctness_ok.append((case, ex))
        # The rules that cannot misfire on any correct kernel apply to every call.
        for flag in check.judge_integrity(part, case, ex, student_dir=student_dir).flags:
            if flag.rule != "own-kernel":
                flags.setdefault(flag.rule, _flag_case(flag, case))
    return Check(item["id"], role, case.label, verdict.passed, verdict.message, item["case"])


def _output_key(outputs: dict[str, torch.Tensor]) -> bytes:
    digest = hashlib.sha256()
    for name in sorted(outputs):
        t = outputs[name].detach().contiguous().reshape(-1)
        digest.update(f"{name}{tuple(t.shape)}{t.dtype}".encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.digest()


def _judge_replays(part: Part, mine: list[dict], outputs_by_id: dict, device: str, flags: dict) -> None:
    """A wrong output that is bit for bit the right output of an earlier call (other inputs): a cached or
    replayed result. (A kernel that is merely wrong, or constant, is left to the correctness checks.)"""
    keyed = [(it, _output_key(outputs_by_id[it["id"]])) for it in mine
             if outputs_by_id.get(it["id"]) and "case" in it]
    counts: dict[bytes, int] = {}
    for _, key in keyed:
        counts[key] = counts.get(key, 0) + 1
    right_before: dict[bytes, Case] = {}
    for it, key in keyed:
        if counts[key] < 2:
            continue  # no other call returned these bits: nothing to judge (the usual case)
        outputs = outputs_by_id[it["id"]]
        case = Case.from_dict(it["case"])
        ok = check.judge(part, case, check.Execution(outputs=outputs, output_devices={k: device for k in outputs}),
                         device).passed
        if ok:
            right_before.setdefault(key, case)
        elif key in right_before:
            earlier = right_before[key]
            flags.setdefault("fresh-inputs", {
                "rule": "fresh-inputs",
                "message": f"{part.functions[0]} returned, for new inputs ({case.label}, seed {case.seed}), "
                           f"exactly the output of an earlier call on other inputs (seed {earlier.seed}) — a cached "
                           "or replayed result; compute it from the inputs on every call",
            })
            return


def _no_speed(part: Part, device: str, reason: str | None = None) -> dict:
    if part.speed_points <= 0 or not part.benchmarks:
        return {"status": "not graded", "message": "this part is not speed-graded", "fraction": None}
    if device != "cuda":
        return {"status": "not measured", "message": "not measured: no GPU", "fraction": None}
    return {"status": "not measured", "message": reason or "not measured", "fraction": None}


def _judge_speed(part: Part, record: dict | None, failed: str | None, settings: Settings, flags: dict) -> dict:
    if record is None:
        return {"status": "failed", "message": f"speed measurement failed: {failed or 'not run'}", "fraction": 0.0}
    if record.get("status") == "skipped":
        return {"status": "not measured", "message": str(record.get("message")), "fraction": None}
    if record.get("status") != "ok" or not isinstance(record.get("measurement"), dict):
        return {"status": "failed", "message": f"speed measurement raised {record.get('message', '')}",
                "fraction": 0.0}
    measurement = dict(record["measurement"])
    if "skipped" in measurement:
        return {"status": "not measured", "message": f"not measured: {measurement['skipped']}", "fraction": None}
    try:
        from grader import speed
    except ImportError:
        return {"status": "not measured", "message": "not measured: grader.speed is not installed", "fraction": None}
    try:
        verdict = speed.judge_recheck(part, measurement, settings.device)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        verdict = check.Verdict(False, f"malformed re-check data from the timed runs ({type(exc).__name__}: {exc})")
    if not verdict.passed:
        flags.setdefault("speed-recheck", {
            "rule": "speed-recheck",
            "message": "results must be computed on every call, not cached or replayed — " + verdict.message,
        })
    measurement.pop("recheck", None)
    measurement["recheck_verdict"] = verdict.to_dict()
    thresholds = speed.load_thresholds(measurement.get("gpu") or settings.gpu_name)
    score = speed.score_part(part, measurement, thresholds=thresholds)
    if getattr(score, "skipped", None):
        return {"status": "not measured", "message": score.message, "fraction": None}
    return {"status": "measured", "fraction": float(score.fraction), "message": score.message,
            "rows": list(score.rows), "calibrated": bool(score.calibrated),
            "roofline": measurement.get("roofline") or {}}


# ------------------------------------------------------------------------------------------ exercise


def grade_exercise(exercise: Exercise, root: Path, settings: Settings, scratch: Path,
                   cache_dir: Path | None = None) -> ExerciseResult:
    """Grade one exercise of the implementation tree ``root``; never raises for anything the
    submission does (an internal error becomes an "error" result naming it)."""
    start = time.monotonic()
    result = ExerciseResult(exercise.name, exercise.title, "graded")
    path = loader.module_path(root, exercise)
    if not path.is_file():
        result.status = "not submitted"
        result.message = f"not submitted: no {exercise.name}/{exercise.module}.py"
        result.parts = [PartResult(p.name, "not submitted", result.message, speed=_no_speed(p, settings.device))
                        for p in exercise.parts]
        return result
    try:
        items = plan(exercise, settings)
        scratch.mkdir(parents=True, exist_ok=True)
        run = execute_plan(exercise, root, items, settings, scratch, cache_dir)
        result.log = "\n".join(run.logs)
        result.problems = run.problems
        student_dir = os.path.realpath(path.parent)
        result.parts = [judge_part(p, exercise, items, run, settings, student_dir) for p in exercise.parts]
    except Exception:  # a bug in the grader must not lose the batch: report it for this exercise
        result.status = "error"
        result.message = "internal grader error (please report):\n" + traceback.format_exc(limit=8)
        result.elapsed_s = time.monotonic() - start
        return result
    _clean_paths(result, {os.path.realpath(root) + os.sep: "", str(root) + os.sep: "",
                          str(_package_link(settings.workdir)) + os.sep: ""})
    statuses = {p.status for p in result.parts}
    if statuses == {"not implemented"}:
        result.status, result.message = "not implemented", result.parts[0].message
    elif statuses <= {"error", "not submitted"}:
        result.status, result.message = "error", result.parts[0].message
    elif run.problems:
        result.message = run.problems[0]
    result.elapsed_s = time.monotonic() - start
    return result


def _clean_paths(result: ExerciseResult, replacements: dict[str, str]) -> None:
    """Show the student's files as ``gelu/gelu.py`` rather than the grader's private copy."""

    def clean(text: str) -> str:
        for old, new in replacements.items():
            text = text.replace(old, new)
        return text

    result.problems = [clean(p) for p in result.problems]
    result.log = clean(result.log)
    for part in result.parts:
        part.message = clean(part.message)
        for c in part.correctness + part.integrity:
            c.message = clean(c.message)
        for flag in part.flags:
            flag["message"] = clean(flag["message"])
