"""The one place where the grader's and the worker's messages (:mod:`.protocol`) become the plain data that
travels (:func:`encode`: tensors, numbers, strings, lists and dicts only) and back (:func:`decode`). What a worker
sends is untrusted: :func:`decode` checks every field's type and raises :class:`~.protocol.ProtocolError` for
anything else.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from grader.checks.call_records import ERROR_KINDS, BadInputOutcome, Execution
from grader.grading.isolation.protocol import (
    BadInputDone,
    CaseDone,
    CompileAhead,
    Compiled,
    CompiledAhead,
    Compiling,
    ExtraDone,
    Finish,
    Hello,
    Inputs,
    Job,
    Loaded,
    LoadFailure,
    NotImplementedYet,
    Poisoned,
    ProtocolError,
    Raised,
    Reply,
    Request,
    RunBadInput,
    RunCase,
    RunExtra,
    RunSpeed,
    SpeedDone,
    WarmedUp,
    WarmUp,
)
from grader.speed.measure import BenchmarkTiming, SpeedMeasurement
from grader.speed.plan import LaunchPlan, PlanError
from grader.speed.stats import Stats

# ------------------------------------------------------------------------------------------ encoding


def _plain_tensor(t: torch.Tensor) -> torch.Tensor:
    return t.detach().as_subclass(torch.Tensor)


def plain_data(value: Any) -> Any:
    """What ``torch.load(weights_only=True)`` accepts: tensors, str, bool, int, float, None, lists and
    str-keyed dicts (numpy scalars become numbers, tuples lists, anything else its repr)."""
    if isinstance(value, torch.Tensor):
        return _plain_tensor(value)
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


def _execution_data(ex: Execution) -> dict[str, Any]:
    return {
        "outputs": None if ex.outputs is None else {str(k): _plain_tensor(v) for k, v in ex.outputs.items()},
        "output_devices": {str(k): str(v) for k, v in ex.output_devices.items()},
        "error_kind": ex.error_kind,
        "error": ex.error,
        "ops": [str(op) for op in ex.ops],
        "kernels": [[str(n), str(f)] for n, f in ex.kernels],
        "inputs_after": {str(k): _plain_tensor(v) for k, v in ex.inputs_after.items()},
        "aliased": [str(a) for a in ex.aliased],
    }


def _inputs_data(inputs: Inputs | None) -> Any:
    if inputs is None:
        return None
    return {str(k): _plain_tensor(v) if isinstance(v, torch.Tensor) else plain_data(v) for k, v in inputs.items()}


def encode(message: Request | Reply) -> dict[str, Any]:
    """A message as plain data (the wire form)."""
    data = _encode_request(message)
    if data is None:
        data = _encode_reply(message)
    if data is None:
        raise TypeError(f"not a protocol message: {message!r}")
    return data


def _encode_request(message: Any) -> dict[str, Any] | None:
    match message:
        case Job():
            return {"type": "job", "exercise": message.exercise, "root": message.root, "device": message.device,
                    "call_timeout_s": float(message.call_timeout_s)}
        case RunCase():
            return {"type": "run_case", "id": message.id, "part": message.part,
                    "inputs": _inputs_data(message.inputs), "full": bool(message.full)}
        case RunBadInput():
            return {"type": "run_bad_input", "id": message.id, "part": message.part, "index": int(message.index)}
        case RunExtra():
            return {"type": "run_extra", "id": message.id, "part": message.part, "name": message.name}
        case RunSpeed():
            return {"type": "run_speed", "id": message.id, "part": message.part, "budget_s": float(message.budget_s),
                    "recheck_inputs": _inputs_data(message.recheck_inputs)}
        case WarmUp():
            return {"type": "warm_up", "id": message.id, "part": message.part}
        case CompileAhead():
            return {"type": "compile_ahead", "id": message.id, "part": message.part,
                    "signatures": [_inputs_data(s) for s in message.signatures],
                    "benchmarks": bool(message.benchmarks)}
        case Finish():
            return {"type": "finish"}
    return None


def _encode_reply(message: Any) -> dict[str, Any] | None:
    match message:
        case Hello():
            return {"type": "hello", "pid": int(message.pid)}
        case Loaded():
            return {"type": "loaded", "errors": {str(p): {"kind": str(e.kind), "message": str(e.message)}
                                                 for p, e in message.errors.items()}}
        case CaseDone():
            return {"type": "case_done", "id": message.id, "execution": _execution_data(message.execution)}
        case BadInputDone():
            o = message.outcome
            return {"type": "bad_input_done", "id": message.id, "raised": o.raised,
                    "raised_types": [str(t) for t in o.raised_types], "message": str(o.message)}
        case ExtraDone():
            return {"type": "extra_done", "id": message.id, "observation": plain_data(message.observation)}
        case SpeedDone():
            return _speed_done_data(message)
        case WarmedUp():
            return {"type": "warmed_up", "id": message.id, "error": message.error}
        case CompiledAhead():
            return {"type": "compiled_ahead", "id": message.id, "kernels": int(message.kernels),
                    "error": None if message.error is None else str(message.error)}
        case Poisoned():
            return {"type": "poisoned", "why": str(message.why)}
        case Compiling():
            return {"type": "compiling", "what": str(message.what)}
        case Compiled():
            return {"type": "compiled", "seconds": float(message.seconds)}
        case NotImplementedYet():
            return {"type": "not_implemented", "id": message.id, "message": str(message.message)}
        case Raised():
            return {"type": "raised", "id": message.id, "message": str(message.message)}
    return None


def _speed_done_data(message: SpeedDone) -> dict[str, Any]:
    m = message.measurement
    return {"type": "speed_done", "id": message.id, "gpu": str(m.gpu),
            "benchmarks": [plain_data(b.to_dict()) for b in m.benchmarks],
            "recheck": None if m.recheck is None else _execution_data(m.recheck),
            "tampered": [str(t) for t in m.tampered], "recheck_repeats": bool(m.recheck_repeats),
            "plans": {str(label): plan.to_dict() if isinstance(plan, LaunchPlan)
                      else {"not_replayable": str(plan)} for label, plan in m.plans.items()}}


# ------------------------------------------------------------------------------------------ decoding


def _get(data: dict, key: str, kind: type | tuple[type, ...], what: str) -> Any:
    if key not in data:
        raise ProtocolError(f"{what}: no {key!r}")
    value = data[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:  # bool is an int: only where a bool is meant
        raise ProtocolError(f"{what}: {key!r} is not {' or '.join(k.__name__ for k in kinds)}")
    if float in kinds and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, kinds):
        raise ProtocolError(f"{what}: {key!r} is not {' or '.join(k.__name__ for k in kinds)}")
    return value


MAX_TEXT = 20_000  # characters of one message from a worker (an exception's text, an error): the rest is cut


def cut(text: str | None, limit: int = MAX_TEXT) -> str | None:
    """``text`` within ``limit`` characters, saying how much was cut: a submission that raises a 50 MB message must
    not make its reports, or the class report, that large."""
    if text is None or len(text) <= limit:
        return text
    return f"{text[:limit]}\n[... {len(text) - limit} more characters cut: a message is kept to {limit} characters]"


def _text(data: dict, key: str, what: str, *, optional: bool = False) -> str | None:
    """A message or error text of the worker's, cut to :data:`MAX_TEXT`."""
    return cut(_get(data, key, (str, type(None)) if optional else str, what))


def _plans(value: Any, what: str) -> dict[str, LaunchPlan | str]:
    """The recorded launch plans: a plan that is not well-formed is the student's ("not measurable"), not a
    broken message."""
    if not isinstance(value, dict):
        raise ProtocolError(f"{what}: 'plans' is not a mapping")
    plans: dict[str, LaunchPlan | str] = {}
    for label, data in value.items():
        if isinstance(data, dict) and isinstance(data.get("not_replayable"), str):
            plans[str(label)] = cut(data["not_replayable"])
            continue
        try:
            plans[str(label)] = LaunchPlan.from_dict(data)
        except PlanError as exc:
            plans[str(label)] = f"the recorded launches are malformed: {exc}"
    return plans


def _str_list(value: Any, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ProtocolError(f"{what} is not a list of strings")
    return value


def _tensor_dict(value: Any, what: str) -> dict[str, torch.Tensor]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in value.items()):
        raise ProtocolError(f"{what} is not a dict of tensors")
    return value


def _execution(data: Any, what: str) -> Execution:
    if not isinstance(data, dict):
        raise ProtocolError(f"{what}: no execution data")
    outputs = data.get("outputs")
    if outputs is not None:
        outputs = _tensor_dict(outputs, f"{what}: outputs")
    devices = data.get("output_devices", {})
    if not isinstance(devices, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in devices.items()):
        raise ProtocolError(f"{what}: output_devices is not a dict of strings")
    error_kind = data.get("error_kind")
    if error_kind is not None and error_kind not in ERROR_KINDS:
        raise ProtocolError(f"{what}: unknown error kind {error_kind!r}")
    error = data.get("error")
    if error is not None and not isinstance(error, str):
        raise ProtocolError(f"{what}: error is not a string")
    error = cut(error)
    if error_kind is None and outputs is None:
        raise ProtocolError(f"{what}: neither outputs nor an error")
    kernels = data.get("kernels", [])
    if not isinstance(kernels, list) or not all(
        isinstance(k, list) and len(k) == 2 and all(isinstance(s, str) for s in k) for k in kernels
    ):
        raise ProtocolError(f"{what}: kernels is not a list of (name, file) pairs")
    return Execution(
        outputs=outputs,
        output_devices=devices,
        error_kind=error_kind,
        error=error,
        ops=_str_list(data.get("ops", []), f"{what}: ops"),
        kernels=[(n, f) for n, f in kernels],
        inputs_after=_tensor_dict(data.get("inputs_after", {}), f"{what}: inputs_after"),
        aliased=_str_list(data.get("aliased", []), f"{what}: aliased"),
    )


_STATS_KEYS = ("n", "median", "mean", "stdev", "min", "max", "q1", "q3")


def _stats(data: Any, what: str) -> Stats:
    if not isinstance(data, dict) or set(data) != set(_STATS_KEYS):
        raise ProtocolError(f"{what} is not a set of statistics")
    numbers = {k: _get(data, k, (int, float), what) for k in _STATS_KEYS}
    if not all(math.isfinite(v) for v in numbers.values()) or numbers["n"] < 1:
        raise ProtocolError(f"{what}: statistics must be finite, from at least one sample")
    return Stats(int(numbers["n"]), *(float(numbers[k]) for k in _STATS_KEYS[1:]))


def _benchmark(data: Any, what: str) -> BenchmarkTiming:
    if not isinstance(data, dict):
        raise ProtocolError(f"{what} is not a benchmark row")
    times = _get(data, "times", dict, what)
    return BenchmarkTiming(
        label=_get(data, "label", str, what),
        times={str(k): _stats(v, f"{what}: times[{k!r}]") for k, v in times.items()},
        mode=_get(data, "mode", str, what),
        stop=_get(data, "stop", str, what),
        rounds=int(_get(data, "rounds", int, what)),
        notes=_str_list(_get(data, "notes", list, what), f"{what}: notes"),
        warmup_s=_get(data, "warmup_s", float, what),
        timed_s=_get(data, "timed_s", float, what),
        error=_text(data, "error", what, optional=True),
        not_implemented=_get(data, "not_implemented", bool, what),
        failed_baseline=_get(data, "failed_baseline", (str, type(None)), what),
    )


def _observation(data: Any, fields: dict[str, type | tuple[type, ...]], what: str) -> dict[str, Any]:
    if not isinstance(data, dict) or set(data) != set(fields):
        raise ProtocolError(f"{what}: the observation must have exactly the keys {', '.join(sorted(fields))}")
    return {key: _get(data, key, kind, what) for key, kind in fields.items()}


def _inputs(data: Any, what: str) -> Inputs | None:
    if data is None:
        return None
    if not isinstance(data, dict):
        raise ProtocolError(f"{what}: inputs are not a dict")
    return data


def decode(data: Any, *, extra_fields: dict[str, dict[str, Any]] | None = None) -> Request | Reply:
    """A message from its wire form. ``extra_fields`` maps the ids of the extra-check items the grader asked
    for to their observations' declared fields (an ExtraDone is accepted for those only)."""
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        raise ProtocolError("not a message")
    kind = data["type"]
    what = f"{kind} message"
    found = _decode_request(kind, data, what)
    if found is None:
        found = _decode_reply(kind, data, what, extra_fields)
    if found is None:
        raise ProtocolError(f"unknown message type {kind!r}")
    return found


def _decode_request(kind: str, data: dict, what: str) -> Request | None:
    match kind:
        case "job":
            return Job(_get(data, "exercise", str, what), _get(data, "root", str, what),
                       _get(data, "device", str, what), _get(data, "call_timeout_s", float, what))
        case "run_case":
            return RunCase(_get(data, "id", str, what), _get(data, "part", str, what),
                           _inputs(data.get("inputs"), what) or {}, _get(data, "full", bool, what))
        case "run_bad_input":
            return RunBadInput(_get(data, "id", str, what), _get(data, "part", str, what),
                               _get(data, "index", int, what))
        case "run_extra":
            return RunExtra(_get(data, "id", str, what), _get(data, "part", str, what), _get(data, "name", str, what))
        case "run_speed":
            return RunSpeed(_get(data, "id", str, what), _get(data, "part", str, what),
                            _get(data, "budget_s", float, what), _inputs(data.get("recheck_inputs"), what))
        case "warm_up":
            return WarmUp(_get(data, "id", str, what), _get(data, "part", str, what))
        case "compile_ahead":
            signatures = _get(data, "signatures", list, what)
            return CompileAhead(_get(data, "id", str, what), _get(data, "part", str, what),
                                [_inputs(x, f"{what}: signature {i}") or {} for i, x in enumerate(signatures)],
                                _get(data, "benchmarks", bool, what))
        case "finish":
            return Finish()
    return None


def _decode_reply(kind: str, data: dict, what: str, extra_fields: dict[str, dict[str, Any]] | None) -> Reply | None:
    match kind:
        case "hello":
            return Hello(_get(data, "pid", int, what))
        case "loaded":
            return _loaded(data, what)
        case "case_done":
            return CaseDone(_get(data, "id", str, what), _execution(data.get("execution"), what))
        case "bad_input_done":
            raised = _get(data, "raised", (str, type(None)), what)
            return BadInputDone(_get(data, "id", str, what), BadInputOutcome(
                cut(raised, 200), _str_list(_get(data, "raised_types", list, what), f"{what}: raised_types")[:64],
                _text(data, "message", what)))
        case "extra_done":
            return _extra_done(data, what, extra_fields)
        case "speed_done":
            return _speed_done(data, what)
        case "warmed_up":
            return WarmedUp(_get(data, "id", str, what), _text(data, "error", what, optional=True))
        case "compiled_ahead":
            return CompiledAhead(_get(data, "id", str, what), _get(data, "kernels", int, what),
                                 _text(data, "error", what, optional=True))
        case "poisoned":
            return Poisoned(_text(data, "why", what))
        case "compiling":
            return Compiling(_get(data, "what", str, what)[:500])
        case "compiled":
            return Compiled(_get(data, "seconds", float, what))
        case "not_implemented":
            return NotImplementedYet(_get(data, "id", str, what), _text(data, "message", what))
        case "raised":
            return Raised(_get(data, "id", str, what), _text(data, "message", what))
    return None


def _loaded(data: dict, what: str) -> Loaded:
    errors = _get(data, "errors", dict, what)
    failures = {}
    for part, err in errors.items():
        if not isinstance(part, str) or not isinstance(err, dict):
            raise ProtocolError(f"{what}: errors must map parts to {{kind, message}}")
        failures[part] = LoadFailure(_get(err, "kind", str, what), _text(err, "message", what))
    return Loaded(failures)


def _extra_done(data: dict, what: str, extra_fields: dict[str, dict[str, Any]] | None) -> ExtraDone:
    item = _get(data, "id", str, what)
    fields = (extra_fields or {}).get(item)
    if fields is None:
        raise ProtocolError(f"{what}: {item!r} is not an extra check of this exercise")
    return ExtraDone(item, _observation(data.get("observation"), fields, what))


def _speed_done(data: dict, what: str) -> SpeedDone:
    rows = _get(data, "benchmarks", list, what)
    recheck = data.get("recheck")
    return SpeedDone(_get(data, "id", str, what), SpeedMeasurement(
        gpu=_get(data, "gpu", str, what),
        benchmarks=[_benchmark(r, f"{what}: benchmark {i}") for i, r in enumerate(rows)],
        recheck=None if recheck is None else _execution(recheck, f"{what}: recheck"),
        tampered=_str_list(_get(data, "tampered", list, what), f"{what}: tampered"),
        plans=_plans(data.get("plans", {}), what),
        recheck_repeats=_get(data, "recheck_repeats", bool, what)))
