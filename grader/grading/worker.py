"""The student-side process: ``python -m grader.grading.worker --fd N`` (started by the grader, not
by hand). It reads a job (JSON) from stdin, imports one exercise module of one submission, runs the
listed items and writes raw observations to the private channel ``fd``. It judges nothing: the
verdicts are computed in the parent, which never imports student code.

Protocol, one record per line of work (see :mod:`grader.grading.channel`)::

    {"type": "hello"}                                     started; limits set
    {"type": "begin", "id": ID}                           about to run item ID ("load": importing the module)
    {"type": "loaded", "errors": {part: {kind, message}}}  the module imported (or not), per part
    {"type": "result", "id": ID, "status": ..., ...}      one item's observations
    {"type": "done"}                                      every item ran

A job is ``{"exercise", "root", "device", "call_timeout_s", "items": [...]}``; an item is
``{"id", "part", "kind"}`` with ``kind`` "case" (plus "case": Case.to_dict(), "full": whether integrity
data is needed), "bad_input" (plus "index") or "speed" (plus "seed", "budget_s"). The job carries derived seeds only,
never the grading secret. A call running longer than ``call_timeout_s`` (plus the budget for speed)
makes faulthandler print every thread's stack to stderr and exit the worker with status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import traceback
from typing import Any

MB = 1 << 20


def _limit(which: int, value: int | None) -> None:
    if value is None:
        return
    _soft, hard = resource.getrlimit(which)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(which, (value, value))


def _plain(t):
    import torch

    return t.detach().as_subclass(torch.Tensor)


def execution_record(ex, full: bool) -> dict[str, Any]:
    """An Execution as plain data; integrity observations only when ``full`` (integrity items)."""
    record: dict[str, Any] = {
        "outputs": None if ex.outputs is None else {str(k): _plain(v) for k, v in ex.outputs.items()},
        "output_devices": dict(ex.output_devices),
        "error_kind": ex.error_kind,
        "error": ex.error,
    }
    if full:
        record.update(
            ops=[str(op) for op in ex.ops],
            kernels=[[str(n), str(f)] for n, f in ex.kernels],
            inputs_after={str(k): _plain(v) for k, v in ex.inputs_after.items()},
            aliased=[str(a) for a in ex.aliased],
        )
    return record


def plain_data(value: Any) -> Any:
    """What ``torch.load(weights_only=True)`` accepts: tensors, str, bool, int, float, None, lists and
    str-keyed dicts (numpy scalars become numbers, tuples lists, anything else its repr)."""
    import torch

    if isinstance(value, torch.Tensor):
        return _plain(value)
    if value is None:
        return None
    for kind in (bool, int, float, str):  # exact built-in types (np.float64 is a float subclass)
        if isinstance(value, kind):
            return kind(value)
    if isinstance(value, dict):
        return {str(k): plain_data(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain_data(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        try:
            return plain_data(value.item())
        except (TypeError, ValueError):
            pass
    return repr(value)


def _run_item(item: dict, part, module, device: str) -> dict[str, Any]:
    from grader import check
    from grader.spec import Case

    kind = item["kind"]
    if kind == "case":
        ex = check.execute(part, module, Case.from_dict(item["case"]), device)
        status = "not_implemented" if ex.error_kind == "not_implemented" else "ok"
        return {"status": status, "execution": execution_record(ex, bool(item.get("full")))}
    if kind == "bad_input":
        bad = part.bad_inputs[int(item["index"])]
        try:
            outcome = check.execute_bad_input(module, bad, device)
        except NotImplementedError as exc:
            return {"status": "not_implemented", "message": str(exc)}
        return {"status": "ok", "raised": outcome.raised, "raised_types": outcome.raised_types,
                "message": outcome.message}
    if kind == "speed":
        try:
            from grader import speed
        except ImportError:
            return {"status": "skipped", "message": "not measured: the speed engine (grader.speed) is not installed"}
        measurement = speed.measure_part(part, module, device=device, secret_seed=int(item["seed"]),
                                         budget_s=float(item["budget_s"]))
        return {"status": "ok", "measurement": plain_data(measurement)}
    raise ValueError(f"unknown item kind {kind!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fd", type=int, required=True, help="the result channel")
    parser.add_argument("--memory-mb", type=int, default=None, help="RLIMIT_AS (omit on CUDA)")
    parser.add_argument("--file-mb", type=int, default=None, help="RLIMIT_FSIZE: largest file it may write")
    args = parser.parse_args(argv)

    # Limits first, before anything the student controls runs; children inherit them.
    _limit(resource.RLIMIT_CORE, 0)
    _limit(resource.RLIMIT_AS, args.memory_mb * MB if args.memory_mb else None)
    _limit(resource.RLIMIT_FSIZE, args.file_mb * MB if args.file_mb else None)
    fd = args.fd
    os.set_inheritable(fd, False)  # programs the student starts do not get the channel
    job = json.loads(sys.stdin.buffer.read())
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    import faulthandler

    faulthandler.enable(file=sys.stderr)  # a segfault prints the Python stack to the captured stderr

    from grader.grading.channel import write_record

    write_record(fd, {"type": "hello", "pid": os.getpid()})
    from grader import exercises, loader, runtime

    runtime.configure()
    device = job["device"]
    exercise = exercises.get(job["exercise"])

    call_limit = float(job.get("call_timeout_s") or 0)
    write_record(fd, {"type": "begin", "id": "load"})
    if call_limit > 0:  # importing the module is student code too
        faulthandler.dump_traceback_later(call_limit, exit=True, file=sys.stderr)
    modules, errors = {}, {}
    for part in exercise.parts:
        try:
            modules[part.name] = loader.load(job["root"], exercise, part.functions)
        except loader.LoadError as exc:
            errors[part.name] = {"kind": exc.kind, "message": str(exc)}
    faulthandler.cancel_dump_traceback_later()
    write_record(fd, {"type": "loaded", "errors": errors})

    first_seen: set[str] = set()
    not_implemented: dict[str, str] = {}
    for item in job["items"]:
        part = exercise.part(item["part"])
        if part.name not in modules:
            continue
        key = part.missing_key
        if key in not_implemented:
            write_record(fd, {"type": "result", "id": item["id"], "status": "not_implemented",
                              "message": not_implemented[key], "skipped": True})
            continue
        write_record(fd, {"type": "begin", "id": item["id"]})
        limit = call_limit + (float(item.get("budget_s", 0)) if item["kind"] == "speed" else 0.0)
        if limit > 0:  # a watchdog thread: prints every stack and exits, even from a busy loop in C
            faulthandler.dump_traceback_later(limit, exit=True, file=sys.stderr)
        try:
            record = _run_item(item, part, modules[part.name], device)
        except BaseException as exc:  # the student's SystemExit, KeyboardInterrupt, ... is a result too
            text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            record = {"status": "error", "message": f"{text}\n{_student_frames(exc)}".strip()}
        finally:
            faulthandler.cancel_dump_traceback_later()
        if key not in first_seen and record["status"] == "not_implemented":
            not_implemented[key] = record.get("message") or record["execution"]["error"] or ""
        first_seen.add(key)
        try:
            write_record(fd, {"type": "result", "id": item["id"], **record})
        except Exception as exc:  # e.g. an output torch.save cannot write
            write_record(fd, {"type": "result", "id": item["id"], "status": "error",
                              "message": f"the result could not be sent to the grader: {type(exc).__name__}: {exc}"})
    write_record(fd, {"type": "done"})
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # do not wait for threads or atexit handlers the student may have left behind


def _student_frames(exc: BaseException) -> str:
    from grader.check import _format_exception

    return _format_exception(exc).split("\n", 1)[1] if "\n" in _format_exception(exc) else ""


if __name__ == "__main__":
    sys.exit(main())
