"""The fields of a message a worker sent (:func:`.wire.decode`), each read with a check: a field of the wrong type
raises :class:`~.protocol.ProtocolError`, a text is cut to :data:`MAX_TEXT`, and the records a reply nests (an
execution, a benchmark's timing, launch plans) are rebuilt from checked parts only.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from grader.checks.call_records import ERROR_KINDS, Execution
from grader.grading.isolation.protocol import Inputs, ProtocolError
from grader.speed.measure import BenchmarkTiming
from grader.speed.plan import LaunchPlan, PlanError
from grader.speed.stats import Stats


def get(data: dict, key: str, kind: type | tuple[type, ...], what: str) -> Any:
    """``data[key]``, of type ``kind`` (an int where a float is meant becomes one; a bool is never an int)."""
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


def text(data: dict, key: str, what: str, *, optional: bool = False) -> str | None:
    """A message or error text of the worker's, cut to :data:`MAX_TEXT`."""
    return cut(get(data, key, (str, type(None)) if optional else str, what))


def plans(value: Any, what: str) -> dict[str, LaunchPlan | str]:
    """The recorded launch plans: a plan that is not well-formed is the student's ("not measurable"), not a
    broken message."""
    if not isinstance(value, dict):
        raise ProtocolError(f"{what}: 'plans' is not a mapping")
    found: dict[str, LaunchPlan | str] = {}
    for label, data in value.items():
        if isinstance(data, dict) and isinstance(data.get("not_replayable"), str):
            found[str(label)] = cut(data["not_replayable"])
            continue
        try:
            found[str(label)] = LaunchPlan.from_dict(data)
        except PlanError as exc:
            found[str(label)] = f"the recorded launches are malformed: {exc}"
    return found


def str_list(value: Any, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ProtocolError(f"{what} is not a list of strings")
    return value


def tensor_dict(value: Any, what: str) -> dict[str, torch.Tensor]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in value.items()):
        raise ProtocolError(f"{what} is not a dict of tensors")
    return value


def execution(data: Any, what: str) -> Execution:
    if not isinstance(data, dict):
        raise ProtocolError(f"{what}: no execution data")
    outputs = data.get("outputs")
    if outputs is not None:
        outputs = tensor_dict(outputs, f"{what}: outputs")
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
        ops=str_list(data.get("ops", []), f"{what}: ops"),
        kernels=[(n, f) for n, f in kernels],
        inputs_after=tensor_dict(data.get("inputs_after", {}), f"{what}: inputs_after"),
        aliased=str_list(data.get("aliased", []), f"{what}: aliased"),
    )


_STATS_KEYS = ("n", "median", "mean", "stdev", "min", "max", "q1", "q3")


def _stats(data: Any, what: str) -> Stats:
    if not isinstance(data, dict) or set(data) != set(_STATS_KEYS):
        raise ProtocolError(f"{what} is not a set of statistics")
    numbers = {k: get(data, k, (int, float), what) for k in _STATS_KEYS}
    if not all(math.isfinite(v) for v in numbers.values()) or numbers["n"] < 1:
        raise ProtocolError(f"{what}: statistics must be finite, from at least one sample")
    return Stats(int(numbers["n"]), *(float(numbers[k]) for k in _STATS_KEYS[1:]))


def benchmark(data: Any, what: str) -> BenchmarkTiming:
    if not isinstance(data, dict):
        raise ProtocolError(f"{what} is not a benchmark row")
    times = get(data, "times", dict, what)
    return BenchmarkTiming(
        label=get(data, "label", str, what),
        times={str(k): _stats(v, f"{what}: times[{k!r}]") for k, v in times.items()},
        mode=get(data, "mode", str, what),
        stop=get(data, "stop", str, what),
        rounds=int(get(data, "rounds", int, what)),
        notes=str_list(get(data, "notes", list, what), f"{what}: notes"),
        warmup_s=get(data, "warmup_s", float, what),
        timed_s=get(data, "timed_s", float, what),
        error=text(data, "error", what, optional=True),
        not_implemented=get(data, "not_implemented", bool, what),
        failed_baseline=get(data, "failed_baseline", (str, type(None)), what),
    )


def observation(data: Any, fields: dict[str, type | tuple[type, ...]], what: str) -> dict[str, Any]:
    if not isinstance(data, dict) or set(data) != set(fields):
        raise ProtocolError(f"{what}: the observation must have exactly the keys {', '.join(sorted(fields))}")
    return {key: get(data, key, kind, what) for key, kind in fields.items()}


def inputs_field(data: Any, what: str) -> Inputs | None:
    if data is None:
        return None
    if not isinstance(data, dict):
        raise ProtocolError(f"{what}: inputs are not a dict")
    return data
