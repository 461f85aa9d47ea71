"""A launch plan: what one call of a student's function does on the GPU, as data.

The student's worker records a plan (:mod:`grader.speed.recorder`); the trusted timer
(:mod:`grader.speed.timer`) replays it on buffers of its own and never runs the student's Python.
A plan holds

* the compiled kernels the call launched (**kernel images**: Triton's metadata JSON and the cubin, as
  the worker's compile left them, with the launcher's signature);
* the **buffers** the call touched: the inputs (by name: the timer builds its own), the storages of the
  outputs it returned, and scratch memory it allocated;
* the **steps** in order: kernel launches (grid, stream, every argument as a tensor view, a tensor
  descriptor, a scalar or a constexpr), copies and fills between views, and the events that order
  several streams;
* the **outputs** as views of output buffers.

Everything here is plain data, converted from and to JSON in :meth:`LaunchPlan.from_dict` /
:meth:`LaunchPlan.to_dict` only. A plan comes from untrusted code: :func:`grader.speed.plan_checks.problems`
lists everything that would make a replay touch memory it does not own (a view outside its buffer, an unknown
buffer, a kernel argument of a kind the launcher does not know, too many launches, buffers larger than the part
allows) and the timer refuses a plan with any.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

ROLES = ("input", "output", "scratch")
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int8": 1, "uint8": 1, "int16": 2,
               "int32": 4, "int64": 8, "bool": 1}
MAX_STEPS = 256  # launches, copies, fills and events in one call
MAX_KERNELS = 32


class PlanError(ValueError):
    """A plan that is not well-formed data (the timer refuses it; the student's speed is 'not measurable')."""


@dataclass(frozen=True)
class KernelImage:
    """One compiled kernel as Triton's cache holds it: its metadata JSON and its cubin, plus the launcher's
    signature (parameter name -> Triton type) in parameter order."""

    name: str
    metadata_json: str
    cubin: bytes
    signature: dict[str, str]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "metadata_json": self.metadata_json,
                "cubin": base64.b64encode(self.cubin).decode("ascii"), "signature": [list(kv) for kv in
                                                                                  self.signature.items()]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> KernelImage:
        signature = data["signature"]
        if not isinstance(signature, list) or not all(isinstance(kv, list) and len(kv) == 2 for kv in signature):
            raise PlanError("a kernel's signature is not a list of [name, type] pairs")
        return cls(_str(data["name"]), _str(data["metadata_json"]), base64.b64decode(_str(data["cubin"])),
                   {_str(k): _str(v) for k, v in signature})


@dataclass(frozen=True)
class Buffer:
    """Memory the call touched: an input (``name`` is its key in the inputs), an output's storage or scratch."""

    role: str
    nbytes: int
    name: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"role": self.role, "nbytes": self.nbytes, "name": self.name}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Buffer:
        return cls(_str(data["role"]), _int(data["nbytes"]), _str(data.get("name", "")))


@dataclass(frozen=True)
class View:
    """A strided tensor over a buffer: element ``i`` lives at byte ``offset + Σ i_d · strides_d · itemsize``."""

    buffer: int
    offset: int  # bytes from the buffer's start
    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in elements

    def to_dict(self) -> dict[str, Any]:
        return {"buffer": self.buffer, "offset": self.offset, "dtype": self.dtype, "shape": list(self.shape),
                "strides": list(self.strides)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> View:
        return cls(_int(data["buffer"]), _int(data["offset"]), _str(data["dtype"]),
                   tuple(_int(v) for v in _list(data["shape"])), tuple(_int(v) for v in _list(data["strides"])))

    def extent(self) -> tuple[int, int]:
        """The lowest and one past the highest byte the view can touch."""
        size = DTYPE_BYTES.get(self.dtype, 1)
        if any(n == 0 for n in self.shape):
            return self.offset, self.offset
        low = self.offset + size * sum(min(0, (n - 1) * s) for n, s in zip(self.shape, self.strides))
        high = self.offset + size * (1 + sum(max(0, (n - 1) * s) for n, s in zip(self.shape, self.strides)))
        return low, high


@dataclass(frozen=True)
class Arg:
    """One kernel argument: ``tensor`` (a view: the launcher passes its address), ``descriptor`` (a host
    tensor descriptor over ``view`` with ``shape``/``strides``/``block_shape``/``padding``), ``scalar``
    (``value``) or ``constexpr`` (compiled into the kernel: the launcher ignores it)."""

    kind: str
    view: View | None = None
    value: int | float | bool | None = None
    shape: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()
    block_shape: tuple[int, ...] = ()
    padding: str = "zero"

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"kind": self.kind}
        if self.view is not None:
            data["view"] = self.view.to_dict()
        if self.kind in ("scalar", "constexpr") and self.value is not None:
            data["value"] = self.value
        if self.kind == "descriptor":
            data.update(shape=list(self.shape), strides=list(self.strides), block_shape=list(self.block_shape),
                        padding=self.padding)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Arg:
        kind = _str(data["kind"])
        view = View.from_dict(data["view"]) if data.get("view") is not None else None
        value = data.get("value")
        if value is not None and not isinstance(value, int | float | bool):
            raise PlanError(f"a scalar argument is {type(value).__name__}, not a number")
        return cls(kind, view, value, tuple(_int(v) for v in _list(data.get("shape", []))),
                   tuple(_int(v) for v in _list(data.get("strides", []))),
                   tuple(_int(v) for v in _list(data.get("block_shape", []))), _str(data.get("padding", "zero")))


@dataclass(frozen=True)
class Step:
    """``launch`` (``kernel``, ``grid``, ``args``), ``copy`` (``dst`` ← ``src``), ``fill`` (``dst`` ← ``value``),
    ``record`` (``event`` on ``stream``) or ``wait`` (``stream`` waits for ``event``). Stream 0 is the stream
    the call started on; the timer maps the others to streams of its own."""

    op: str
    stream: int = 0
    kernel: int = -1
    grid: tuple[int, int, int] = (1, 1, 1)
    args: tuple[Arg, ...] = ()
    dst: View | None = None
    src: View | None = None
    value: float = 0.0
    event: int = -1

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"op": self.op, "stream": self.stream}
        if self.op == "launch":
            data.update(kernel=self.kernel, grid=list(self.grid), args=[a.to_dict() for a in self.args])
        if self.dst is not None:
            data["dst"] = self.dst.to_dict()
        if self.src is not None:
            data["src"] = self.src.to_dict()
        if self.op == "fill":
            data["value"] = self.value
        if self.op in ("record", "wait"):
            data["event"] = self.event
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Step:
        grid = tuple(_int(v) for v in _list(data.get("grid", [1, 1, 1])))
        if len(grid) != 3:
            raise PlanError("a launch's grid does not have three dimensions")
        value = data.get("value", 0.0)
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise PlanError("a fill value is not a number")
        return cls(_str(data["op"]), _int(data.get("stream", 0)), _int(data.get("kernel", -1)), grid,  # type: ignore[arg-type]
                   tuple(Arg.from_dict(a) for a in _list(data.get("args", []))),
                   View.from_dict(data["dst"]) if data.get("dst") is not None else None,
                   View.from_dict(data["src"]) if data.get("src") is not None else None,
                   float(value), _int(data.get("event", -1)))


@dataclass
class LaunchPlan:
    """One call of a part's function on one benchmark's inputs."""

    kernels: list[KernelImage] = field(default_factory=list)
    buffers: list[Buffer] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    outputs: dict[str, View] = field(default_factory=dict)

    @property
    def launches(self) -> int:
        return sum(1 for s in self.steps if s.op == "launch")

    def summary(self) -> str:
        names = [self.kernels[s.kernel].name for s in self.steps if s.op == "launch"]
        other = len(self.steps) - len(names)
        text = f"{len(names)} launch{'es' if len(names) != 1 else ''} ({', '.join(names)})"
        return text + (f" and {other} other step{'s' if other != 1 else ''}" if other else "")

    def to_dict(self) -> dict[str, Any]:
        return {"kernels": [k.to_dict() for k in self.kernels], "buffers": [b.to_dict() for b in self.buffers],
                "steps": [s.to_dict() for s in self.steps],
                "outputs": {name: v.to_dict() for name, v in self.outputs.items()}}

    @classmethod
    def from_dict(cls, data: Any) -> LaunchPlan:
        """The plan in ``data``; :class:`PlanError` if it is not a plan's shape (its contents are checked by
        :func:`problems`)."""
        try:
            if not isinstance(data, Mapping):
                raise PlanError("a plan is not a mapping")
            kernels = _list(data["kernels"])
            if len(kernels) > MAX_KERNELS:
                raise PlanError(f"the plan has {len(kernels)} kernels; at most {MAX_KERNELS} are replayed")
            steps = _list(data["steps"])
            if len(steps) > MAX_STEPS:
                raise PlanError(f"one call made {len(steps)} launches and other steps; at most {MAX_STEPS} are "
                                "replayed")
            outputs = data["outputs"]
            if not isinstance(outputs, Mapping):
                raise PlanError("the plan's outputs are not a mapping")
            return cls([KernelImage.from_dict(k) for k in kernels], [Buffer.from_dict(b) for b in
                                                                     _list(data["buffers"])],
                       [Step.from_dict(s) for s in steps], {_str(k): View.from_dict(v) for k, v in outputs.items()})
        except PlanError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise PlanError(f"not a launch plan: {type(exc).__name__}: {exc}") from None


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise PlanError(f"expected a string, got {type(value).__name__}")
    return value


def _int(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise PlanError(f"expected an integer, got {type(value).__name__}")
    return value


def _list(value: Any) -> list:
    if not isinstance(value, list | tuple):
        raise PlanError(f"expected a list, got {type(value).__name__}")
    return list(value)
