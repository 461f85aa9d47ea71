"""Whether a launch plan may be replayed: :func:`problems` lists everything in a plan (:mod:`grader.speed.plan`)
that would make the trusted timer's replay touch memory it does not own (a view outside its buffer, an unknown
buffer, a kernel argument of a kind the launcher does not know, too many streams, buffers larger than the part
allows); the timer refuses a plan with any.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import ClassVar

from grader.speed.plan import DTYPE_BYTES, ROLES, Arg, LaunchPlan, Step, View

MAX_STREAMS = 8
MAX_CUBIN_BYTES = 16 << 20
MAX_SCRATCH_FACTOR = 8  # scratch and outputs together: at most this many times the inputs' bytes (+ 64 MiB)
SCRATCH_SLACK_BYTES = 64 << 20
MAX_GRID = (2**31 - 1, 65535, 65535)

# Argument types Triton's CUDA launcher knows: pointers, integers, floats, constexprs, host tensor descriptors.
_SCALAR = r"(i1|i8|i16|i32|i64|u1|u8|u16|u32|u64|fp16|bf16|fp32|f32|fp64)"
_TYPE = re.compile(rf"^(\*k?{_SCALAR}|{_SCALAR}|constexpr|tensordesc<{_SCALAR}\[[0-9, ]+\]>)$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


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
