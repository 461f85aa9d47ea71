"""The messages between the grader and its sandboxed worker, as typed records (:mod:`.wire` is the one place
where they are converted to and from the plain data that travels, :mod:`.channel` how it travels).

The grader sends a :class:`Job`, then one request at a time, and reads one reply per request::

    worker -> Hello                               started, limits set
    grader -> Job                                 which exercise and implementation tree
    worker -> Loaded                              the module imported (or not), per part
    grader -> CompileAhead                        on a GPU: the shapes of a part's calls to come, no values
    worker -> CompiledAhead | Raised
    grader -> RunCase | RunBadInput | RunExtra | WarmUp | RunSpeed
    worker -> CaseDone | BadInputDone | ExtraDone | WarmedUp | SpeedDone | NotImplementedYet | Raised
    ...
    grader -> Finish                              the worker exits

A speed item is two requests: ``WarmUp`` (compiles the benchmarks' kernels, sharing the GPU), then ``RunSpeed``
(autotunes and records, holding it alone). A worker whose CUDA context a request left broken (a kernel's illegal
memory access is sticky: every later call would fail) sends ``Poisoned`` before that request's reply, then exits:
the grader charges the request that broke it and runs the rest in a fresh worker.

Inputs travel as data: the worker never sees a seed or the secret, and learns a case's values only when it is
asked to run it (``CompileAhead`` carries the cases' or the benchmarks' inputs on PyTorch's meta device: shapes,
dtypes and strides, so that their kernels compile at once, on threads, before the calls run them). Everything the
worker sends is untrusted: :func:`.wire.decode` checks every field's type and raises :class:`ProtocolError` for
anything else (the run then fails as "the worker sent a malformed result").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from grader.checks.call_records import BadInputOutcome, Execution
from grader.speed.measure import SpeedMeasurement

Inputs = dict[str, Any]


class ProtocolError(ValueError):
    """A message that is not what the protocol allows (the message says which field)."""


# ----------------------------------------------------------------------------------- grader -> worker


@dataclass(frozen=True)
class Job:
    exercise: str
    root: str  # the implementation tree, as the worker sees it
    device: str
    call_timeout_s: float


@dataclass(frozen=True)
class RunCase:
    id: str
    part: str
    inputs: Inputs
    full: bool  # record the integrity observations (ops, kernels, inputs after the call)


@dataclass(frozen=True)
class RunBadInput:
    id: str
    part: str
    index: int


@dataclass(frozen=True)
class RunExtra:
    id: str
    part: str
    name: str


@dataclass(frozen=True)
class RunSpeed:
    id: str
    part: str
    budget_s: float
    recheck_inputs: Inputs | None


@dataclass(frozen=True)
class WarmUp:
    id: str
    part: str


@dataclass(frozen=True)
class CompileAhead:
    id: str
    part: str
    signatures: list[Inputs]  # each call's inputs, tensors on the meta device (no values)
    # the part's benchmarks: compiled as the speed measurement compiles (Triton's own specialization, every
    # candidate of every autotuning choice), not as the correctness calls do
    benchmarks: bool = False


@dataclass(frozen=True)
class Finish:
    pass


Request = Job | RunCase | RunBadInput | RunExtra | WarmUp | RunSpeed | CompileAhead | Finish

# ----------------------------------------------------------------------------------- worker -> grader


@dataclass(frozen=True)
class Hello:
    pid: int


@dataclass(frozen=True)
class LoadFailure:
    kind: str  # loader.LoadError.kind: "missing", "syntax", "import", "function", "kernel"
    message: str


@dataclass(frozen=True)
class Loaded:
    errors: dict[str, LoadFailure] = field(default_factory=dict)  # part -> why it cannot be run


@dataclass(frozen=True)
class CaseDone:
    id: str
    execution: Execution


@dataclass(frozen=True)
class BadInputDone:
    id: str
    outcome: BadInputOutcome


@dataclass(frozen=True)
class ExtraDone:
    id: str
    observation: dict[str, Any]


@dataclass(frozen=True)
class SpeedDone:
    id: str
    measurement: SpeedMeasurement


@dataclass(frozen=True)
class WarmedUp:
    id: str
    error: str | None = None  # the call that raised (the speed measurement will say it again)


@dataclass(frozen=True)
class CompiledAhead:
    id: str
    kernels: int  # compilations started
    error: str | None = None  # the first call that raised (its case will say it again)


@dataclass(frozen=True)
class Poisoned:
    """The CUDA context is broken: the worker exits after the reply that follows."""

    why: str


@dataclass(frozen=True)
class Compiling:
    """Triton started compiling the student's kernels (``what``: the kernel and its constants), in the middle of a
    request: the call's clock stops until :class:`Compiled`; the compilation has a limit of its own."""

    what: str


@dataclass(frozen=True)
class Compiled:
    """Every compilation under way has ended, after ``seconds``."""

    seconds: float


@dataclass(frozen=True)
class NotImplementedYet:
    id: str
    message: str


@dataclass(frozen=True)
class Raised:
    """The item ended in an exception that is not a check result (SystemExit, an output that cannot be
    sent, ...): the check fails with this message."""

    id: str
    message: str


Reply = (Hello | Loaded | CaseDone | BadInputDone | ExtraDone | WarmedUp | SpeedDone | NotImplementedYet | Raised
         | Poisoned | CompiledAhead | Compiling | Compiled)
ItemReply = CaseDone | BadInputDone | ExtraDone | SpeedDone | NotImplementedYet | Raised
