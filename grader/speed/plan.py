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
:meth:`LaunchPlan.to_dict` only. A plan comes from untrusted code: :func:`problems` lists everything that
would make a replay touch memory it does not own (a view outside its buffer, an unknown buffer, a kernel
argument of a kind the launcher does not know, too many launches, buffers larger than the part allows)
and the timer refuses a plan with any.
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

ROLES = ("input", "output", "scratch")
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int8": 1, "uint8": 1, "int16": 2,
               "int32": 4, "int64": 8, "bool": 1}
MAX_STEPS = 256  # launches, copies, fills and events in one call
MAX_KERNELS = 32
MAX_STREAMS = 8
MAX_CUBIN_BYTES = 16 << 20
MAX_SCRATCH_FACTOR = 8  # scratch and outputs together: at most this many times the inputs' bytes (+ 64 MiB)
SCRATCH_SLACK_BYTES = 64 << 20
MAX_GRID = (2**31 - 1, 65535, 65535)

# Argument types Triton's CUDA launcher knows: pointers, integers, floats, constexprs, host tensor descriptors.
_SCALAR = r"(i1|i8|i16|i32|i64|u1|u8|u16|u32|u64|fp16|bf16|fp32|f32|fp64)"
_TYPE = re.compile(rf"^(\*k?{_SCALAR}|{_SCALAR}|constexpr|tensordesc<{_SCALAR}\[[0-9, ]+\]>)$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


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


# ------------------------------------------------------------------------------------------ validation


def problems(plan: LaunchPlan, input_bytes: Mapping[str, int], *, output_names: tuple[str, ...] = ()) -> list[str]:
    """Everything that keeps ``plan`` from being replayed safely, in words (empty: it may be replayed).
    ``input_bytes``: each input's storage size as the timer builds it; ``output_names``: the outputs the part's
    call returns (each must be a view of an output buffer)."""
    check = _PlanCheck(plan)
    check.buffers(input_bytes)
    check.kernels()
    check.steps()
    check.outputs(output_names)
    return check.found


class _PlanCheck:
    """The checks of :func:`problems`, section by section (buffers, kernels, steps, outputs), each step by its op
    (:attr:`STEPS`); what is wrong accumulates in ``found``, in the plan's order."""

    def __init__(self, plan: LaunchPlan) -> None:
        self.plan = plan
        self.found: list[str] = []
        self.events: set[int] = set()  # recorded so far, in step order: a wait needs an earlier record

    def view(self, view: View | None, where: str) -> None:
        found, buffers = self.found, self.plan.buffers
        if view is None:
            found.append(f"{where}: no tensor")
        elif not 0 <= view.buffer < len(buffers):
            found.append(f"{where}: buffer {view.buffer} does not exist")
        elif view.dtype not in DTYPE_BYTES:
            found.append(f"{where}: dtype {view.dtype!r} is not replayed")
        elif len(view.shape) != len(view.strides) or any(n < 0 for n in view.shape) or len(view.shape) > 8:
            found.append(f"{where}: a malformed shape {view.shape} / strides {view.strides}")
        else:
            low, high = view.extent()
            size = buffers[view.buffer].nbytes
            if view.offset % DTYPE_BYTES[view.dtype] or low < 0 or high > size:
                found.append(f"{where}: bytes {low}..{high} of buffer {view.buffer} ({size} bytes) are outside it")

    def buffers(self, input_bytes: Mapping[str, int]) -> None:
        made = 0
        for i, buf in enumerate(self.plan.buffers):
            if buf.role not in ROLES:
                self.found.append(f"buffer {i} has an unknown role {buf.role!r}")
            elif buf.nbytes < 0:
                self.found.append(f"buffer {i} has a negative size")
            elif buf.role != "input":
                made += buf.nbytes
            elif buf.name not in input_bytes:
                self.found.append(f"buffer {i} is said to be input {buf.name!r}, which the part does not have")
            elif buf.nbytes != input_bytes[buf.name]:
                self.found.append(f"buffer {i} (input {buf.name!r}) has {buf.nbytes} bytes, the input has "
                                  f"{input_bytes[buf.name]}")
        allowed = MAX_SCRATCH_FACTOR * sum(input_bytes.values()) + SCRATCH_SLACK_BYTES
        if made > allowed:
            self.found.append(f"the call allocates {made / 2**20:.1f} MiB of outputs and scratch; at most "
                              f"{allowed / 2**20:.1f} MiB ({MAX_SCRATCH_FACTOR}x the inputs + 64 MiB) are replayed")

    def kernels(self) -> None:
        for i, kernel in enumerate(self.plan.kernels):
            if not _NAME.match(kernel.name):
                self.found.append(f"kernel {i} has a malformed name")
            if len(kernel.cubin) > MAX_CUBIN_BYTES:
                self.found.append(f"kernel {kernel.name} is {len(kernel.cubin)} bytes of machine code")
            for name, ty in kernel.signature.items():
                if not _NAME.match(name) or not _TYPE.match(ty):
                    self.found.append(f"kernel {kernel.name}: parameter {name[:40]!r} has a type the timer does not "
                                      f"launch ({ty[:40]!r})")

    def steps(self) -> None:
        for n, step in enumerate(self.plan.steps):
            where = f"step {n} ({step.op})"
            if not 0 <= step.stream < MAX_STREAMS:
                self.found.append(f"{where}: stream {step.stream} (at most {MAX_STREAMS} streams are replayed)")
            check = self.STEPS.get(step.op)
            if check is None:
                self.found.append(f"{where}: not a step the timer replays")
            else:
                check(self, step, where)

    def _launch(self, step: Step, where: str) -> None:
        if not 0 <= step.kernel < len(self.plan.kernels):
            self.found.append(f"{where}: kernel {step.kernel} does not exist")
            return
        kernel = self.plan.kernels[step.kernel]
        if any(not 1 <= g <= m for g, m in zip(step.grid, MAX_GRID)):
            self.found.append(f"{where}: grid {step.grid} of {kernel.name} is outside 1..{MAX_GRID}")
        types = list(kernel.signature.values())
        if len(step.args) != len(types):
            self.found.append(f"{where}: {kernel.name} takes {len(types)} arguments, the launch has "
                              f"{len(step.args)}")
            return
        for k, (arg, ty) in enumerate(zip(step.args, types)):
            _check_arg(arg, ty, f"{where}: {kernel.name} argument {k}", self.view, self.found)

    def _copy(self, step: Step, where: str) -> None:
        self.view(step.dst, f"{where} destination")
        self.view(step.src, f"{where} source")
        if step.dst is not None and step.src is not None and math.prod(step.dst.shape) != math.prod(step.src.shape):
            self.found.append(f"{where}: copies {step.src.shape} into {step.dst.shape}")

    def _fill(self, step: Step, where: str) -> None:
        self.view(step.dst, f"{where} destination")

    def _record(self, step: Step, where: str) -> None:
        self.events.add(step.event)

    def _wait(self, step: Step, where: str) -> None:
        if step.event not in self.events:
            self.found.append(f"{where}: waits for event {step.event}, which no earlier step records")

    STEPS: ClassVar[dict[str, Callable[[_PlanCheck, Step, str], None]]] = {
        "launch": _launch, "copy": _copy, "fill": _fill, "record": _record, "wait": _wait}

    def outputs(self, names: tuple[str, ...]) -> None:
        for name in names:
            view = self.plan.outputs.get(name)
            if view is None:
                self.found.append(f"the plan does not say where output {name!r} is")
                continue
            self.view(view, f"output {name!r}")
            if 0 <= view.buffer < len(self.plan.buffers) and self.plan.buffers[view.buffer].role != "output":
                self.found.append(f"output {name!r} is not in an output buffer")


def _check_arg(arg: Arg, ty: str, where: str, check_view, found: list[str]) -> None:
    if ty == "constexpr":
        if arg.kind != "constexpr":
            found.append(f"{where} is a constexpr in the kernel but a {arg.kind} in the launch")
    elif ty.startswith("*"):
        if arg.kind != "tensor":
            found.append(f"{where} is a pointer, the launch passes a {arg.kind}")
        else:
            check_view(arg.view, where)
    elif ty.startswith("tensordesc"):
        if arg.kind != "descriptor":
            found.append(f"{where} is a tensor descriptor, the launch passes a {arg.kind}")
            return
        check_view(arg.view, where)
        view = arg.view
        if view is not None and (len(arg.shape) != len(arg.strides) or len(arg.block_shape) != len(arg.shape)):
            found.append(f"{where}: a descriptor with mismatched shape, strides and block shape")
        elif view is not None:
            # what the descriptor lets the kernel reach must lie inside the base view's buffer
            reach = View(view.buffer, view.offset, view.dtype, arg.shape, arg.strides)
            check_view(reach, f"{where} (descriptor extent)")
        if arg.padding not in ("zero", "nan"):
            found.append(f"{where}: padding {arg.padding!r}")
    elif arg.kind != "scalar" or arg.value is None:
        found.append(f"{where} is a {ty} scalar, the launch passes a {arg.kind}")
