"""The one place where the grader's and the worker's messages (:mod:`.protocol`) become the plain data that
travels (:func:`encode`: tensors, numbers, strings, lists and dicts only) and back (:func:`decode`). What a worker
sends is untrusted: :func:`decode` checks every field's type (:mod:`.wire_fields`) and raises
:class:`~.protocol.ProtocolError` for anything else.
"""

from __future__ import annotations

from typing import Any

import torch

from grader.checks.call_records import BadInputOutcome, Execution
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
from grader.grading.isolation.wire_fields import (
    benchmark,
    cut,
    execution,
    get,
    inputs_field,
    observation,
    plans,
    str_list,
    text,
)
from grader.speed.measure import SpeedMeasurement
from grader.speed.plan import LaunchPlan

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
            return Job(get(data, "exercise", str, what), get(data, "root", str, what),
                       get(data, "device", str, what), get(data, "call_timeout_s", float, what))
        case "run_case":
            return RunCase(get(data, "id", str, what), get(data, "part", str, what),
                           inputs_field(data.get("inputs"), what) or {}, get(data, "full", bool, what))
        case "run_bad_input":
            return RunBadInput(get(data, "id", str, what), get(data, "part", str, what),
                               get(data, "index", int, what))
        case "run_extra":
            return RunExtra(get(data, "id", str, what), get(data, "part", str, what), get(data, "name", str, what))
        case "run_speed":
            return RunSpeed(get(data, "id", str, what), get(data, "part", str, what),
                            get(data, "budget_s", float, what), inputs_field(data.get("recheck_inputs"), what))
        case "warm_up":
            return WarmUp(get(data, "id", str, what), get(data, "part", str, what))
        case "compile_ahead":
            signatures = get(data, "signatures", list, what)
            return CompileAhead(get(data, "id", str, what), get(data, "part", str, what),
                                [inputs_field(x, f"{what}: signature {i}") or {} for i, x in enumerate(signatures)],
                                get(data, "benchmarks", bool, what))
        case "finish":
            return Finish()
    return None


def _decode_reply(kind: str, data: dict, what: str, extra_fields: dict[str, dict[str, Any]] | None) -> Reply | None:
    match kind:
        case "hello":
            return Hello(get(data, "pid", int, what))
        case "loaded":
            return _loaded(data, what)
        case "case_done":
            return CaseDone(get(data, "id", str, what), execution(data.get("execution"), what))
        case "bad_input_done":
            raised = get(data, "raised", (str, type(None)), what)
            return BadInputDone(get(data, "id", str, what), BadInputOutcome(
                cut(raised, 200), str_list(get(data, "raised_types", list, what), f"{what}: raised_types")[:64],
                text(data, "message", what)))
        case "extra_done":
            return _extra_done(data, what, extra_fields)
        case "speed_done":
            return _speed_done(data, what)
        case "warmed_up":
            return WarmedUp(get(data, "id", str, what), text(data, "error", what, optional=True))
        case "compiled_ahead":
            return CompiledAhead(get(data, "id", str, what), get(data, "kernels", int, what),
                                 text(data, "error", what, optional=True))
        case "poisoned":
            return Poisoned(text(data, "why", what))
        case "compiling":
            return Compiling(get(data, "what", str, what)[:500])
        case "compiled":
            return Compiled(get(data, "seconds", float, what))
        case "not_implemented":
            return NotImplementedYet(get(data, "id", str, what), text(data, "message", what))
        case "raised":
            return Raised(get(data, "id", str, what), text(data, "message", what))
    return None


def _loaded(data: dict, what: str) -> Loaded:
    errors = get(data, "errors", dict, what)
    failures = {}
    for part, err in errors.items():
        if not isinstance(part, str) or not isinstance(err, dict):
            raise ProtocolError(f"{what}: errors must map parts to {{kind, message}}")
        failures[part] = LoadFailure(get(err, "kind", str, what), text(err, "message", what))
    return Loaded(failures)


def _extra_done(data: dict, what: str, extra_fields: dict[str, dict[str, Any]] | None) -> ExtraDone:
    item = get(data, "id", str, what)
    fields = (extra_fields or {}).get(item)
    if fields is None:
        raise ProtocolError(f"{what}: {item!r} is not an extra check of this exercise")
    return ExtraDone(item, observation(data.get("observation"), fields, what))


def _speed_done(data: dict, what: str) -> SpeedDone:
    rows = get(data, "benchmarks", list, what)
    recheck = data.get("recheck")
    return SpeedDone(get(data, "id", str, what), SpeedMeasurement(
        gpu=get(data, "gpu", str, what),
        benchmarks=[benchmark(r, f"{what}: benchmark {i}") for i, r in enumerate(rows)],
        recheck=None if recheck is None else execution(recheck, f"{what}: recheck"),
        tampered=str_list(get(data, "tampered", list, what), f"{what}: tampered"),
        plans=plans(data.get("plans", {}), what),
        recheck_repeats=get(data, "recheck_repeats", bool, what)))
