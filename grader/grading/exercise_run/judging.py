"""Judge an exercise's replies in the grader's process, which never imports student code: the verdicts of
:mod:`grader.checks.verdicts` on the inputs the grader built, replay detection, extra checks and speed
credit, assembled into :class:`~grader.grading.results.results.PartResult` s.

A fault of the grader itself — any exception while judging, comparing, detecting replays or computing
credit — is recorded as a :class:`~grader.grading.results.results.GraderError` with its traceback for that check:
the check is "grader error", its part "needs regrade" (neither 0 nor passed), and the student is never
charged for it.

Integrity: the integrity cases get the full rules (the student's own Triton kernel, no PyTorch compute,
inputs unchanged, no aliasing); "no PyTorch compute", "inputs unchanged" and "no aliasing" also apply to
every correctness call (a shortcut taken for some shapes only is still a shortcut). If no integrity case
ran cleanly, the kernel rule is judged on a correctness call that did. Any flag zeroes the part.
"""

from __future__ import annotations

import hashlib
import threading
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from grader.checks import compare, integrity, interpreter_limits, tensors, verdicts
from grader.checks.call_records import Execution
from grader.checks.spec import Case, Exercise, Inputs, Part
from grader.grading.exercise_run.case_references import CaseReferences
from grader.grading.exercise_run.item_plan import Item
from grader.grading.exercise_run.supervised_run import Run
from grader.grading.isolation import protocol
from grader.grading.results.results import (
    ERROR,
    FAILED,
    GRADED,
    GRADER_ERROR,
    NEEDS_REGRADE,
    NOT_IMPLEMENTED,
    NOT_SUBMITTED,
    PASSED,
    SKIPPED,
    CheckResult,
    GraderError,
    PartResult,
    SpeedResult,
)
from grader.speed import credit
from grader.speed.thresholds import calibrated, speed_curves

# --profile: summed over the judging threads, and counted in "judge (grader)" as well
RECHECK_STEP = "speed: judging the recheck, before the timing"
GRADER_FAULT = ("the grader failed while judging this check — a fault of the grader, not of your code; "
                "it is not scored and will be regraded")


def grader_error(where: str, exc: BaseException) -> GraderError:
    return GraderError(where, f"{type(exc).__name__}: {exc}",
                       "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))


def output_fingerprint(outputs: dict[str, torch.Tensor]) -> bytes:
    """The outputs' names, shapes, dtypes and bits, whatever their layout."""
    digest = hashlib.sha256()
    for name in sorted(outputs):
        t = outputs[name]
        digest.update(f"{name}{tuple(t.shape)}{t.dtype}".encode())
        digest.update(tensors.row_major_bytes(t))
    return digest.digest()


def _size(inputs: Inputs) -> int:
    return sum(v.numel() for v in inputs.values() if isinstance(v, torch.Tensor))


@dataclass
class _Seen:
    """A returned call, for replay detection: which outputs, and whether they were right."""

    item: Item
    fingerprint: bytes
    right: bool


@dataclass
class _PartState:
    checks: dict[str, CheckResult] = field(default_factory=dict)
    flags: dict[str, dict[str, str]] = field(default_factory=dict)  # rule -> {rule, message}
    seen: list[_Seen] = field(default_factory=list)
    integrity_ran: bool = False
    first_ok: tuple[Case, Inputs, Execution] | None = None  # a correctness call that returned
    speed: SpeedResult | None = None
    rechecks: dict[str, verdicts.Verdict] = field(default_factory=dict)  # speed item -> its recheck, judged early
    errors: list[GraderError] = field(default_factory=list)

    def flag(self, flag: integrity.Flag, case: Case | None = None, *, scope: str = "part") -> None:
        """``scope``: "part" zeroes the whole part, "speed" its speed credit only."""
        where = f" (case {case.label})" if case is not None else ""
        self.flags.setdefault(flag.rule, {"rule": flag.rule, "message": f"{flag.message}{where}", "scope": scope})


class ExerciseJudge:
    """Collects the verdicts of one exercise run, reply by reply (``on_reply``), then assembles the parts."""

    def __init__(self, exercise: Exercise, *, device: str, student_dir: str, gpu_name: str | None = None,
                 curves: Mapping[str, speed_curves.Curve] | None = None,
                 references: CaseReferences | None = None):
        self.exercise = exercise
        self.references = references  # the batch's stored references (None: each computed here)
        self.curves = dict(curves or {})  # the course's speed curves
        self.device = device
        self.student_dir = student_dir
        self.gpu_name = gpu_name
        self.parts = {p.name: _PartState() for p in exercise.parts}
        self.profile: dict[str, float] = {}  # the worker's own breakdown of speed time (grader grade --profile)
        self._lock = threading.Lock()  # on_recorded runs on the judging threads of several worker groups

    # ------------------------------------------------------------------------------ one reply

    def on_reply(self, item: Item, request: protocol.Request, reply: protocol.ItemReply) -> None:
        state = self.parts[item.part.name]
        try:
            result = self._judge(item, request, reply, state)
        except Exception as exc:  # a fault of the grader: never the student's failure
            state.errors.append(grader_error(item.id, exc))
            result = CheckResult(item.id, item.role, item.label, GRADER_ERROR, GRADER_FAULT,
                                 item.case.to_dict() if item.case else None)
            if item.role == "speed":
                state.speed = SpeedResult(NEEDS_REGRADE, f"speed: {GRADER_FAULT}")
        if result is not None:
            state.checks[item.id] = result

    def on_recorded(self, item: Item, request: protocol.Request, reply: protocol.ItemReply) -> None:
        """A speed measurement as the worker recorded it, before the trusted timer times it: its recheck (the call
        on fresh inputs after the recording) is judged now, while the student's other workers still run, not after
        the timed rounds; :meth:`on_reply` with the timed measurement uses that verdict."""
        state = self.parts[item.part.name]
        if not isinstance(reply, protocol.SpeedDone) or reply.measurement.recheck is None:
            return
        start = time.monotonic()
        try:
            state.rechecks[item.id] = self._recheck(item, request, reply.measurement)
        except Exception:  # judged again, and its fault reported, with the timed measurement
            pass
        with self._lock:
            self.profile[RECHECK_STEP] = self.profile.get(RECHECK_STEP, 0.0) + time.monotonic() - start

    def _judge(self, item: Item, request, reply, state: _PartState) -> CheckResult | None:
        part, case = item.part, item.case
        if item.role == "speed":
            state.speed = self._speed(item, request, reply, state)
            return None
        if isinstance(reply, protocol.NotImplementedYet):
            return self._check(item, False, f"not implemented: {reply.message}")
        if isinstance(reply, protocol.Raised):
            contiguous = compare.inputs_contiguous(request.inputs) if isinstance(request, protocol.RunCase) else None
            return self._check(item, False, f"{part.functions[0]} raised {reply.message}", contiguous=contiguous)
        if item.role == "bad_input":
            assert isinstance(reply, protocol.BadInputDone)
            verdict = verdicts.bad_input(part.bad_inputs[item.index or 0], reply.outcome)
            return self._check(item, verdict.passed, verdict.message)
        if case is None:  # an extra check
            assert isinstance(reply, protocol.ExtraDone)
            extra = next(x for x in part.extra_checks if x.name == item.role)
            verdict = extra.judge(reply.observation, self.device)
            return self._check(item, verdict.passed, verdict.message)
        assert isinstance(reply, protocol.CaseDone) and isinstance(request, protocol.RunCase)
        inputs, ex = request.inputs, reply.execution
        right = verdicts.correctness(part, case, inputs, ex, self.device, reference=self._reference(part, case, inputs))
        if ex.outputs is not None and ex.error_kind is None:
            state.seen.append(_Seen(item, output_fingerprint(ex.outputs), right.passed))
        size = _size(inputs)
        if item.role == "integrity":
            verdict = verdicts.integrity_verdict(part, inputs, ex, student_dir=self.student_dir)
            for flag in verdict.flags:
                state.flag(flag, case)
            state.integrity_ran = state.integrity_ran or ex.error_kind is None
            return self._check(item, verdict.passed, verdict.message, size)
        if item.role == "fresh":
            return self._check(item, True, "", size)
        if ex.error_kind is None:
            if state.first_ok is None:
                state.first_ok = (case, inputs, ex)
            # The rules that cannot misfire on any correct kernel apply to every call.
            for flag in verdicts.integrity_flags(part, inputs, ex, student_dir=self.student_dir):
                if flag.rule != "own-kernel":
                    state.flag(flag, case)
        return self._check(item, right.passed, right.message, size, compare.inputs_contiguous(inputs))

    def _reference(self, part: Part, case: Case, inputs: Inputs):
        if self.references is None:
            return None
        return lambda: self.references.expected(part, case, inputs)

    @staticmethod
    def _check(item: Item, passed: bool, message: str, size: int | None = None,
               contiguous: bool | None = None) -> CheckResult:
        return CheckResult(item.id, item.role, item.label, PASSED if passed else FAILED, message,
                           item.case.to_dict() if item.case else None, size, contiguous)

    def _speed(self, item: Item, request, reply, state: _PartState) -> SpeedResult:
        part = item.part
        if isinstance(reply, protocol.NotImplementedYet):
            return SpeedResult(credit.NOT_MEASURED, "not measured: not implemented")
        if isinstance(reply, protocol.Raised):
            return SpeedResult(credit.FAILED, f"speed measurement raised {reply.message}", 0.0)
        assert isinstance(reply, protocol.SpeedDone) and isinstance(request, protocol.RunSpeed)
        measurement = reply.measurement
        if measurement.timer_fault:
            raise RuntimeError(f"the trusted timer failed: {measurement.timer_fault}")
        for row in measurement.benchmarks:
            for step, seconds in (("speed: warm-up, compilation, autotuning", row.warmup_s),
                                  ("speed: timed rounds", row.timed_s)):
                self.profile[step] = self.profile.get(step, 0.0) + seconds
        recheck = verdicts.Verdict(True)
        if measurement.recheck is not None:
            recheck = state.rechecks.pop(item.id, None) or self._recheck(item, request, measurement)
            # A wrong output is a wrong result (no speed credit for it, the message says why); only a wrong output
            # that repeats the bits of the recorded call on other inputs is evidence of a cached result.
            if not recheck.passed and measurement.recheck_repeats:
                state.flag(integrity.Flag("speed-recheck", "results must be computed on every call, not cached or "
                                          "replayed — on fresh inputs after the timed runs, "
                                          f"{part.functions[0]} returned bit for bit the output of the recorded call "
                                          "on the benchmark's inputs: " + recheck.message))
        try:
            limits = credit.load_thresholds(measurement.gpu)
        except calibrated.ThresholdsError as exc:
            return SpeedResult(NEEDS_REGRADE, f"speed: the thresholds file is not usable: {exc}")
        verdict = credit.judge(part, measurement, recheck=recheck, thresholds=limits,
                               curve=speed_curves.curve_for(self.curves, self.exercise.name, part.name))
        for rule, message in verdict.flags:
            state.flag(integrity.Flag(rule, message), scope="speed")
        return SpeedResult(verdict.status, verdict.message, verdict.fraction, verdict.rows, verdict.calibrated,
                           verdict.roofline, list(measurement.gpu_state))

    def _recheck(self, item: Item, request, measurement) -> verdicts.Verdict:
        """The verdict on the speed measurement's call on fresh inputs after its recorded runs."""
        assert item.recheck is not None and isinstance(request, protocol.RunSpeed)
        inputs = request.recheck_inputs or {}
        verdict = verdicts.correctness(item.part, item.recheck, inputs, measurement.recheck, self.device,
                                       reference=self._reference(item.part, item.recheck, inputs))
        if verdict.passed:
            return verdicts.Verdict(True)
        return verdicts.Verdict(False, "the timed code's output is wrong (a wrong result earns no speed credit): "
                                       "on fresh inputs after the timed runs, " + verdict.message)

    # ------------------------------------------------------------------------------ assemble

    def part_results(self, items: list[Item], run: Run) -> list[PartResult]:
        out = []
        for part in self.exercise.parts:
            mine = [it for it in items if it.part is part]
            try:
                out.append(self._part(part, mine, run))
            except Exception as exc:  # a fault of the grader while assembling the part
                state = self.parts[part.name]
                result = PartResult(part.name, NEEDS_REGRADE, GRADER_FAULT,
                                    grader_errors=[*state.errors, grader_error(part.name, exc)])
                out.append(result)
        return out

    def _no_speed(self, part: Part, reason: str | None = None) -> SpeedResult:
        if not part.speed_graded:
            return SpeedResult(credit.NOT_GRADED, "this part is not speed-graded")
        if self.device != "cuda":
            return SpeedResult(credit.NOT_MEASURED, "not measured: speed points need a GPU (the kernels ran in the "
                                               "Triton interpreter)")
        return SpeedResult(credit.NOT_MEASURED, reason or "not measured")

    def _part(self, part: Part, items: list[Item], run: Run) -> PartResult:
        state = self.parts[part.name]
        if not run.loaded:
            message = run.problems[0] if run.problems else "the worker did not start"
            return PartResult(part.name, ERROR, message, speed=self._no_speed(part, "not measured: the module did "
                                                                                     "not load"))
        if part.name in run.load_errors:
            err = run.load_errors[part.name]
            return PartResult(part.name, NOT_SUBMITTED if err.kind == "missing" else ERROR, err.message,
                              speed=self._no_speed(part, "not measured: the module did not load"))
        # "not implemented" when every call the part made raised NotImplementedError (an untouched stub); an option
        # left unimplemented fails its own checks only.
        replied = [run.replies[it.id] for it in items if it.skip_reason is None and it.id in run.replies]
        if replied and all(_is_not_implemented(reply) for reply in replied):
            names = " / ".join(part.functions)
            return PartResult(part.name, NOT_IMPLEMENTED,
                              f"{names} is not implemented yet — see {self.exercise.handout}",
                              speed=self._no_speed(part, "not measured: not implemented"))
        result = PartResult(part.name, GRADED)
        for it in items:
            if it.role == "speed":
                continue
            if it.skip_reason is not None:
                result.checks.append(CheckResult(it.id, it.role, it.label, SKIPPED, it.skip_reason,
                                                 it.case.to_dict() if it.case else None))
            elif it.id in state.checks:
                result.checks.append(state.checks[it.id])
            else:
                why = run.failed.get(it.id) or run.not_run.get(it.id) or "not run"
                result.checks.append(CheckResult(it.id, it.role, it.label, FAILED, why,
                                                 it.case.to_dict() if it.case else None))
        self._replays(part, state)
        if not state.integrity_ran and state.first_ok is not None:
            case, inputs, ex = state.first_ok
            for flag in verdicts.integrity_verdict(part, inputs, ex, student_dir=self.student_dir).flags:
                state.flag(flag, case)
            state.integrity_ran = True
        if not state.integrity_ran:
            why = f"{part.functions[0]} could not be checked: no call returned normally"
            if any(interpreter_limits.mentions_limit(c.message) for c in result.checks):
                why += (" — the calls failed on a limit of the Triton interpreter (see the failing checks' notes); "
                        "on a GPU they may run")
            result.checks.append(CheckResult(f"{part.name}.integrity[unchecked]", "integrity", "integrity", FAILED,
                                             why))
        result.flags = list(state.flags.values())
        speed_item = next((it for it in items if it.role == "speed"), None)
        if state.speed is not None:
            result.speed = state.speed
        elif speed_item is not None and speed_item.id in run.failed:
            result.speed = SpeedResult(credit.FAILED, f"speed measurement failed: {run.failed[speed_item.id]}", 0.0)
        else:
            result.speed = self._no_speed(part)
        result.grader_errors = list(state.errors)
        if result.grader_errors:
            result.status = NEEDS_REGRADE
        return result

    def _replays(self, part: Part, state: _PartState) -> None:
        """A wrong output that is bit for bit the right output of an earlier call on other inputs: a cached or
        replayed result. (A kernel that is merely wrong, or constant, is left to the correctness checks.)"""
        right_before: dict[bytes, Case] = {}
        for seen in state.seen:
            case = seen.item.case
            assert case is not None
            if seen.right:
                right_before.setdefault(seen.fingerprint, case)
            elif seen.fingerprint in right_before:
                earlier = right_before[seen.fingerprint]
                state.flags.setdefault("fresh-inputs", {
                    "rule": "fresh-inputs",
                    "message": f"{part.functions[0]} returned, for new inputs ({case.label}, seed {case.seed}), "
                               f"exactly the output of an earlier call on other inputs (seed {earlier.seed}) — a "
                               "cached or replayed result; compute it from the inputs on every call",
                })
                return


def _is_not_implemented(reply: protocol.ItemReply) -> bool:
    if isinstance(reply, protocol.NotImplementedYet):
        return True
    return isinstance(reply, protocol.CaseDone) and reply.execution.error_kind == "not_implemented"
